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
from contextvars import ContextVar
from dataclasses import dataclass, field

from .errors import InvalidArgument, NbqueueError
from .jobs import Job

THROTTLE = 0.5  # seconds between progress writes: a tight loop must not hammer the database


class Cancelled(NbqueueError):
    """The running job was cancelled (or its claim was lost); stop working on it."""


Report = Callable[[float, float | None, str], bool]
"""Records progress for the job; False when its claim is gone (cancelled, timed out)."""

StillClaimed = Callable[[], bool]
"""Re-reads whether the job's claim is still live."""


@dataclass
class JobContext:
    """What `progress()` and `cancelled()` know about the job running here."""

    job: Job
    report: Report
    still_claimed: StillClaimed | None = None  # None: the cancel flag is all there is to know
    cancel: threading.Event = field(default_factory=threading.Event)
    made: dict[str, int] = field(default_factory=dict)  # calls it queued (workflows.origin_of)
    last_write: float = float("-inf")
    last_check: float = float("-inf")


# A context variable, not a thread-local: it follows a job across threads it starts with
# copy_context() and, for coroutines, across awaits, so jobs never report to each other.
_current: ContextVar[JobContext | None] = ContextVar("nbqueue_job", default=None)


@contextmanager
def running(context: JobContext) -> Iterator[JobContext]:
    """Make `context` the current job for the duration."""
    token = _current.set(context)
    try:
        yield context
    finally:
        _current.reset(token)


def current() -> JobContext | None:
    """The job running here, if any."""
    return _current.get()


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
    if not context.report(float(done), total, message[:500]):
        context.cancel.set()
        raise Cancelled(f"job {context.job.id} was cancelled (or its claim ended); stop working on it")


def cancelled() -> bool:
    """True once the current job has been cancelled (or its claim lost); checks twice a second."""
    context = current()
    if context is None:
        return False
    if context.cancel.is_set():
        return True
    now = time.monotonic()
    if context.still_claimed is not None and now - context.last_check >= THROTTLE:
        context.last_check = now
        if not context.still_claimed():
            context.cancel.set()
    return context.cancel.is_set()
