"""Async jobs: the event loop a worker owns, and the helpers coroutines use.

A worker runs coroutine handlers on an event loop in a thread of its own,
never on the kernel's loop (no nest_asyncio): a notebook's own `await` stays
free. The loop ticks four times a second; a tick that comes more than a second
late means a coroutine blocked it, and the worker logs which job did.

- `run_sync(coro)`: a sync handler (or any sync code) runs async code to its end.
- `per_loop(factory)`: an async client made once per event loop. A client made in
  a notebook cell is bound to the kernel's loop and fails on the worker's; made
  inside the job, or through `per_loop`, it belongs to the loop that uses it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import sys
import threading
import time
import weakref
from collections.abc import Callable, Coroutine
from types import CodeType, FrameType
from typing import Any, TypeVar

from .errors import NbqueueError

log = logging.getLogger("nbqueue.worker")

T = TypeVar("T")
TICK = 0.25  # seconds between the loop's ticks
BLOCKED = 1.0  # a tick this late means a coroutine held the loop

_runners = threading.local()
_per_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[Any, Any]] = weakref.WeakKeyDictionary()
_per_loop_lock = threading.Lock()
# What errors say when an object bound to one event loop is used on another.
_FOREIGN = ("attached to a different loop", "bound to a different event loop", "different event loop")


class ForeignLoopError(NbqueueError):
    """An async object made on another event loop (a notebook cell's) was used in a job."""


class JobLoop:
    """An event loop running in a daemon thread: coroutine jobs are submitted to it."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.ticked = time.monotonic()
        self._warned_at = 0.0
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(self._tick)
        self.loop.run_forever()

    def _tick(self) -> None:
        self.ticked = time.monotonic()
        self.loop.call_later(TICK, self._tick)

    def submit(self, coroutine: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Run `coroutine` on the loop; its future can be cancelled from any thread."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop)

    def blocked_for(self) -> float:
        """Seconds since the loop last ticked beyond its rhythm (0 when it is free)."""
        late = time.monotonic() - self.ticked - TICK
        return late if late > BLOCKED else 0.0

    def blocking_frames(self) -> list[FrameType]:
        """The frames of the loop's thread right now, innermost first."""
        frame = sys._current_frames().get(self._thread.ident or -1)
        found = []
        while frame is not None:
            found.append(frame)
            frame = frame.f_back
        return found

    def warn_if_blocked(self, marker: CodeType) -> None:
        """Log, once per stall, which job's coroutine holds the loop (its frame runs `marker`)."""
        late = self.blocked_for()
        if not late or self.ticked <= self._warned_at:
            return
        self._warned_at = self.ticked
        jobs = [f.f_locals.get("job") for f in self.blocking_frames() if f.f_code is marker]
        names = ", ".join(f"job {getattr(job, 'id', '?')}" for job in jobs) or "a coroutine"
        log.warning(
            "%s blocked the worker's event loop for %.1f s: it called blocking code without "
            "awaiting (use await, asyncio.to_thread, or a sync task)",
            names,
            late + TICK,
        )

    def stop(self, timeout: float = 5.0) -> None:
        """Cancel what still runs and end the loop's thread."""

        async def cancel_all() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        if self._thread.is_alive():
            with contextlib.suppress(concurrent.futures.TimeoutError, RuntimeError):
                asyncio.run_coroutine_threadsafe(cancel_all(), self.loop).result(timeout)
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout)


def run_sync(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run async code to its end from sync code (a sync handler), on this thread's own loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        coroutine.close()
        raise NbqueueError("run_sync is for sync code; inside a coroutine, await it instead")
    runner: asyncio.Runner | None = getattr(_runners, "runner", None)
    if runner is None:
        runner = _runners.runner = asyncio.Runner()
    return runner.run(coroutine)


def per_loop(factory: Callable[[], T]) -> T:
    """The object `factory()` made for the running event loop, made once per loop.

    For async clients (httpx.AsyncClient, an OpenAI or Anthropic async client), which
    belong to the loop they were first used on: `client = nbqueue.per_loop(make_client)`
    inside a coroutine job gives every job on a worker's loop one shared client.
    """
    loop = asyncio.get_running_loop()
    with _per_loop_lock:
        made = _per_loop.setdefault(loop, {})
        if factory not in made:
            made[factory] = factory()
        return made[factory]  # type: ignore[no-any-return]


def foreign_loop(error: BaseException) -> ForeignLoopError | None:
    """An error that says an object bound to another event loop was used here, explained."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, RuntimeError) and any(text in str(current) for text in _FOREIGN):
            explained = ForeignLoopError(
                "an async object made outside this job (in a notebook cell, say) belongs to the kernel's "
                "event loop, and a job runs on the worker's own loop. Make the client inside the job, or "
                f"share one per loop with nbqueue.per_loop(make_client). ({current})"
            )
            explained.__cause__ = error
            return explained
        current = current.__cause__ or current.__context__
    return None
