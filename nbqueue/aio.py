"""Async jobs: the event loop a worker owns, and the helpers coroutines use.

A worker runs coroutine handlers on an event loop in a thread of its own,
never on the kernel's loop (no nest_asyncio): a notebook's own `await` stays
free. The loop ticks four times a second; a tick that comes more than a second
late means a coroutine blocked it, and the worker logs which job did. When the
worker stops, its loop is closed with everything it made: the threads of its
executor (`asyncio.to_thread`) and the clients `per_loop` made for it.

- `run_sync(coro)`: a sync handler (or any sync code) runs async code to its end.
- `per_loop(factory)`: an async client made once per event loop. A client made in
  a notebook cell is bound to the kernel's loop and fails on the worker's; made
  inside the job, or through `per_loop`, it belongs to the loop that uses it.
  A job that names a client of another loop fails before it sends anything
  (`ForeignLoopError`, nbqueue.loops).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import inspect
import logging
import sys
import threading
import time
import types
import weakref
from collections.abc import Callable, Coroutine, Hashable
from types import CodeType, FrameType
from typing import Any, TypeVar

from .errors import NbqueueError
from .loops import ForeignLoopError, check_clients, foreign_loop, name_loop

__all__ = ["ForeignLoopError", "JobLoop", "close_ended_runners", "per_loop", "run_sync"]

log = logging.getLogger("nbqueue.worker")

T = TypeVar("T")
TICK = 0.25  # seconds between the loop's ticks
BLOCKED = 1.0  # a tick this late means a coroutine held the loop
# Seconds a stopping loop waits for its executor's threads (an asyncio.to_thread call still running
# is not waited for longer: it cannot be interrupted, and its thread ends when it returns).
EXECUTOR_GRACE = 0.5

_runners: dict[threading.Thread, asyncio.Runner] = {}  # run_sync's loop of each thread
_runners_lock = threading.Lock()
# Per loop: what per_loop made for it, by the factory's key: (the object, the factory, kept alive
# so that the ids in its key stay its own).
_per_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[Hashable, tuple[Any, Any]]] = (
    weakref.WeakKeyDictionary()
)
_per_loop_lock = threading.Lock()


class JobLoop:
    """An event loop running in a daemon thread: coroutine jobs are submitted to it."""

    def __init__(self, name: str, owner: str = "") -> None:
        self.loop = asyncio.new_event_loop()
        name_loop(self.loop, f"the event loop of worker {owner}" if owner else f"the event loop {name}")
        # The loop's own executor (asyncio.to_thread, getaddrinfo), so that stop() can end its threads.
        self._executor = concurrent.futures.ThreadPoolExecutor(thread_name_prefix=f"{name}-io")
        self.loop.set_default_executor(self._executor)
        self.ticked = time.monotonic()
        self._warned_at = 0.0
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(self._tick)
        try:
            self.loop.run_forever()
        finally:
            self.loop.close()  # its selector and wake-up pipe; in this thread, once it has stopped

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
        """Cancel what still runs, close what per_loop made for the loop, then the loop, its
        thread and its executor's threads: nothing of it is left (unless a coroutine ignores
        the cancel past `timeout`, or a to_thread call still runs: it ends when that returns)."""
        if self._thread.is_alive():
            with contextlib.suppress(concurrent.futures.TimeoutError, RuntimeError):
                asyncio.run_coroutine_threadsafe(_wind_down(self.loop), self.loop).result(timeout)
            with contextlib.suppress(RuntimeError):  # closed already
                self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout)
        _shut_down(self._executor, EXECUTOR_GRACE)


async def _wind_down(loop: asyncio.AbstractEventLoop) -> None:
    """On a loop about to stop: cancel its tasks, close what per_loop made, end async generators."""
    tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await _close_made(loop)
    await loop.shutdown_asyncgens()


def _shut_down(executor: concurrent.futures.Executor, grace: float) -> None:
    """End an executor's threads: idle ones at once; a busy one is waited for up to `grace` s."""
    closer = threading.Thread(
        target=executor.shutdown, kwargs={"cancel_futures": True}, name="nbqueue-closer", daemon=True
    )
    closer.start()
    closer.join(grace)


def run_sync(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run async code to its end from sync code (a sync handler), on this thread's own loop.

    The loop lasts as long as the thread (clients `per_loop` made on it are reused from
    one call to the next); a worker closes the loops of its threads when it stops.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        coroutine.close()
        raise NbqueueError("run_sync is for sync code; inside a coroutine, await it instead")
    thread = threading.current_thread()
    with _runners_lock:
        runner = _runners.get(thread)
        if runner is None:
            runner = _runners[thread] = asyncio.Runner()
            name_loop(runner.get_loop(), f"the run_sync event loop of thread {thread.name}")
    loop = runner.get_loop()
    try:
        check_clients(coroutine, loop)
    except ForeignLoopError:
        coroutine.close()
        raise
    try:
        return runner.run(coroutine)
    except Exception as exc:
        explained = foreign_loop(exc, loop)
        if explained is None:
            raise
        raise explained from exc


def close_ended_runners(timeout: float = 5.0) -> None:
    """Close the run_sync loops of threads that have ended (a worker's runners), with what
    per_loop made for them; in a thread of its own, since the caller's may run a loop."""
    with _runners_lock:
        ended = [thread for thread in _runners if not thread.is_alive()]
        runners = [_runners.pop(thread) for thread in ended]
    if not runners:
        return

    def close_all() -> None:
        for runner in runners:
            try:
                runner.run(_close_made(runner.get_loop()))
                runner.close()
            except Exception:  # one loop that cannot close must not keep the others open
                log.warning("could not close a run_sync event loop", exc_info=True)

    closer = threading.Thread(target=close_all, name="nbqueue-closer", daemon=True)
    closer.start()
    closer.join(timeout)


def per_loop(factory: Callable[[], T]) -> T:
    """The object `factory()` made for the running event loop, made once per loop.

    For async clients (httpx.AsyncClient, aiohttp.ClientSession, an OpenAI or Anthropic
    async client), which belong to the loop they were first used on:
    `client = nbqueue.per_loop(make_client)` inside a coroutine job gives every job on
    a worker's loop one shared client. When the worker stops, the object is closed with
    its loop (its `aclose()`, else its `close()`, awaited if it is a coroutine).

    Which factory is "the same": a function or lambda is known by its code (where it is
    written) and the values it captures (its closure and defaults: by equality when they
    can be hashed, else by identity), so `per_loop(lambda: httpx.AsyncClient())` written
    inside a job makes one client per loop however many jobs run it, and a lambda that
    captures a different base URL makes another. Any other callable (a class, a bound
    method) is known by equality.
    """
    loop = asyncio.get_running_loop()
    key = _factory_key(factory)
    with _per_loop_lock:
        made = _per_loop.setdefault(loop, {})
        if key not in made:
            made[key] = (factory(), factory)
        return made[key][0]  # type: ignore[no-any-return]


def _factory_key(factory: Callable[[], Any]) -> Hashable:
    if not isinstance(factory, types.FunctionType):
        return _value_key(factory)
    captured: list[Any] = []
    for cell in factory.__closure__ or ():
        try:
            captured.append(cell.cell_contents)
        except ValueError:  # a cell not yet filled
            captured.append(ValueError)
    captured.extend(factory.__defaults__ or ())
    captured.extend(sorted((factory.__kwdefaults__ or {}).items()))
    return (factory.__code__, tuple(_value_key(value) for value in captured))


def _value_key(value: Any) -> Hashable:
    try:
        hash(value)
    except Exception:  # unhashable: by identity (per_loop keeps the factory, and so the value, alive)
        return ("id", id(value))
    return (type(value), value)


async def _close_made(loop: asyncio.AbstractEventLoop) -> None:
    """Close what per_loop made for `loop`, newest first; a failure is logged, never raised."""
    with _per_loop_lock:
        made = _per_loop.pop(loop, {})
    for obj, _ in reversed(list(made.values())):
        closer = getattr(obj, "aclose", None) or getattr(obj, "close", None)
        if not callable(closer):
            continue
        try:
            result = closer()
            if inspect.isawaitable(result):
                await result
        except Exception:
            log.warning("could not close %r, made by nbqueue.per_loop", obj, exc_info=True)
