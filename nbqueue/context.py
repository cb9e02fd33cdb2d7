"""Inside a running job: report progress, and notice that the job was cancelled.

    def crawl(urls):
        for i, url in enumerate(urls):
            nbqueue.progress(i, len(urls), f"fetching {url}")   # raises Cancelled if cancelled
            ...

Outside a job (a plain call of the function) both are harmless no-ops.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .errors import InvalidArgument, NbqueueError

if TYPE_CHECKING:
    from .jobs import Job
    from .queue import Queue

THROTTLE = 0.5  # seconds between progress writes: a tight loop must not hammer the database


class Cancelled(NbqueueError):
    """The running job was cancelled (or its claim was lost); stop working on it."""


Report = Callable[[float, float | None, str], bool]
"""Records progress somewhere else (a process-mode child reports to its parent)."""


@dataclass
class JobContext:
    """What `progress()` and `cancelled()` know about the job running in this thread."""

    queue: Queue | None
    job: Job
    cancel: threading.Event = field(default_factory=threading.Event)
    report: Report | None = None
    last_write: float = float("-inf")
    last_check: float = float("-inf")


_local = threading.local()


@contextmanager
def running(context: JobContext) -> Iterator[JobContext]:
    """Make `context` the current job of this thread for the duration."""
    previous = getattr(_local, "context", None)
    _local.context = context
    try:
        yield context
    finally:
        _local.context = previous


def current() -> JobContext | None:
    """The job running in this thread, if any."""
    return getattr(_local, "context", None)


def progress(done: float, total: float | None = None, message: str = "") -> None:
    """Record how far the current job is: `done` of `total` (unknown if None).

    Writes at most every half second (and always when done reaches total).

    Raises:
        Cancelled: the job was cancelled (or timed out) meanwhile; stop working.
    """
    for value, name in ((done, "done"), (total, "total")):
        if value is None and name == "total":
            continue
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise InvalidArgument(f"progress {name} must be a finite number, not {value!r}")
    if not isinstance(message, str):
        raise InvalidArgument(f"progress message must be a string, not {type(message).__name__}")
    context = current()
    if context is None:
        return
    if context.cancel.is_set():
        raise Cancelled(f"job {context.job.id} was cancelled")
    now = time.monotonic()
    final = total is not None and done >= total
    if now - context.last_write < THROTTLE and not final:
        return
    context.last_write = context.last_check = now
    job, queue, text = context.job, context.queue, message[:500]
    if context.report is not None:
        recorded = context.report(float(done), total, text)
    else:
        assert queue is not None
        recorded = queue.storage.progress(job.id, job.attempts, float(done), total, text, queue._now())
    if not recorded:
        context.cancel.set()
        raise Cancelled(f"job {job.id} was cancelled (or its claim ended); stop working on it")


def cancelled() -> bool:
    """True once the current job has been cancelled (or its claim lost); checks twice a second."""
    context = current()
    if context is None:
        return False
    if context.cancel.is_set():
        return True
    now = time.monotonic()
    if context.queue is not None and now - context.last_check >= THROTTLE:
        context.last_check = now
        fresh = context.queue.storage.get(context.job.id)
        if fresh is None or fresh.status != "running" or fresh.attempts != context.job.attempts:
            context.cancel.set()
    return context.cancel.is_set()
