"""Durable steps inside a job: a value recorded once and returned on every later run.

    @q.task(max_retries=5)
    def research(topic):
        plan = nbqueue.step("plan", llm_plan, topic)          # step(name, fn, *args, **kwargs)
        pages = [nbqueue.step(f"fetch:{u}", fetch_page, u) for u in plan["urls"]]
        return nbqueue.step("summary", llm_summarise, pages)

`step` calls `fn` and records its value (JSON) under the job's lease; when the job runs
again (a retry, a crashed worker's recovery, a requeue) a recorded step returns its value
without calling `fn`. Steps are matched by name, not by position, so editing the code
between runs is fine and parallel steps (threads, `asyncio.gather`) are too; a name is
recorded once per job (a second call with the same name gets the first value). An async
`fn` makes the step awaitable: `await nbqueue.step("ask", ask_llm, prompt)`.

A stale worker (its lease gone) cannot record a step: `step` raises LeaseLost instead. A
step that raises is recorded as failed (for `q.steps`) and is called again on the next run.
A value that is not JSON (an SDK's response object, say) is checked before anything is
recorded and makes the job dead at once (Unretryable): a retry would pay for the call again
and get the same kind of value.

The one window that can repeat a side effect: `fn` returned, and the process died before
its value was recorded (a crash between the two). The next run calls `fn` again, so a step
whose effect must never happen twice should make it idempotent itself (an idempotency key
on the payment API, say). Outside a job, `step` just calls `fn`.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

from .clock import to_us
from .context import StepBook, current
from .errors import InvalidArgument

MAX_NAME = 500  # characters of a step's name


def step(name: str, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
    """Run `fn(*args, **kwargs)` as the durable step `name` of the job running here: its value
    is recorded once, and a later run of the job (retry, recovery, requeue) gets the recorded
    value without calling `fn` again. An async `fn` gives an awaitable. Outside a job it just
    calls `fn`.

    Raises:
        InvalidArgument: the name is not text, or `fn` is not callable.
        Unretryable: the value is not JSON (nothing is recorded, and the job is dead at once: a
            retry would only pay for the call again).
        LeaseLost: the job's claim ended meanwhile; the value is not kept.
    """
    check_name(name)
    if not callable(fn):
        raise InvalidArgument(f"step {name!r} needs a function to call, not {fn!r}")
    context = current()
    book = None if context is None else context.steps
    if inspect.iscoroutinefunction(fn):
        return _step_async(book, name, lambda: fn(*args, **kwargs))
    if book is None:
        return fn(*args, **kwargs)
    held = book.lookup(name)
    if held is not None:
        return json.loads(held)
    started = _now_us()
    try:
        value = fn(*args, **kwargs)
    except BaseException as exc:
        book.failed(name, exc, started)
        raise
    if inspect.isawaitable(value):  # a plain function that returned a coroutine
        return _step_async(book, name, lambda: value, started)
    return book.keep(name, value, started)


async def _step_async(
    book: StepBook | None, name: str, call: Callable[[], Awaitable[Any]], started: int | None = None
) -> Any:
    if book is None:
        return await call()
    # Reading and recording touch the database: off the event loop, so other jobs keep running.
    held = await asyncio.to_thread(book.lookup, name) if started is None else None
    if held is not None:
        return json.loads(held)
    started = _now_us() if started is None else started
    try:
        value = await call()
    except BaseException as exc:
        await asyncio.to_thread(book.failed, name, exc, started)
        raise
    return await asyncio.to_thread(book.keep, name, value, started)


def check_name(name: object) -> str:
    """A step's name: non-empty text of at most MAX_NAME characters."""
    if not isinstance(name, str) or not name.strip() or len(name) > MAX_NAME:
        raise InvalidArgument(
            f"a step's name is non-empty text of at most {MAX_NAME} characters, not {name!r}"
        )
    return name


def _now_us() -> int:
    return to_us(time.time())
