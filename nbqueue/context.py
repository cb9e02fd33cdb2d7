"""Inside a running job: report progress, and notice that the job was cancelled.

    def crawl(urls):
        for i, url in enumerate(urls):
            nbqueue.progress(i, len(urls), f"fetching {url}")   # raises Cancelled if cancelled
            ...

Outside a job (a plain call of the function) both are harmless no-ops. The context
also carries the job's StepBook: the values its durable steps (nbqueue.step) recorded.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from . import payload as payload_json
from .errors import InvalidArgument, LeaseLost, NbqueueError, PayloadError, Unretryable
from .jobs import Job
from .payload import error_text

if TYPE_CHECKING:
    from .records import Reached, Suspension, WaitSpec

THROTTLE = 0.5  # seconds between progress writes: a tight loop must not hammer the database


class Cancelled(NbqueueError):
    """The running job was cancelled (or its claim was lost); stop working on it."""


class TimedOut(TimeoutError):
    """A job ran past its `timeout` (a job that runs its own child, a notebook, stops it a little
    before the worker's deadline and raises this): recorded as the attempt's "timeout"."""


Report = Callable[[float, float | None, str], bool]
"""Records progress for the job; False when its claim is gone (cancelled, timed out)."""

StillClaimed = Callable[[], bool]
"""Re-reads whether the job's claim is still live."""


class Emits(Protocol):
    """A run's stream, as the job's context holds it (nbqueue.streams.Emitter)."""

    def add(self, text: str) -> None:
        """Append an item (JSON text)."""
        ...

    def flush(self) -> None:
        """Write what was added so far."""
        ...

    def close(self) -> None:
        """Write everything added."""
        ...

    @property
    def refused(self) -> bool:
        """True once a write was refused (the claim is gone)."""
        ...


#: Records a step: (name, value as JSON text or None, error text or None, started µs) -> the value
#: stored for that name (the first recorded wins), or None when the job's claim is gone.
Record = Callable[[str, str | None, str | None, int], str | None]


class StepBook:
    """One run of one job's steps: the values recorded before (read once, when the first step
    asks) and the way to record new ones. Threads and coroutines of the job share it."""

    def __init__(self, job_id: int, load: Callable[[], dict[str, str]], record: Record) -> None:
        self.job_id = job_id
        self._load, self._record = load, record
        self._values: dict[str, str] | None = None
        self._lock = threading.Lock()
        self.written: set[str] = set()  # names of the values recorded in this run

    def recorded(self) -> dict[str, str]:
        """Every value recorded so far: name -> JSON text (read once)."""
        with self._lock:
            if self._values is None:
                self._values = dict(self._load())
            return dict(self._values)

    def lookup(self, name: str) -> str | None:
        """The JSON text recorded for `name`, or None if that step has not returned yet."""
        with self._lock:
            if self._values is None:
                self._values = dict(self._load())
            return self._values.get(name)

    def write(self, name: str, text: str | None, error: str | None, started_us: int) -> str | None:
        """Record a value (JSON text) or an error; the value stored for the name, or None when
        the claim is gone (or after an error)."""
        stored = self._record(name, text, error, started_us)
        if stored is not None:
            with self._lock:
                self.written.add(name)
                if self._values is not None:
                    self._values[name] = stored
        return stored

    def keep(self, name: str, value: Any, started_us: int) -> Any:
        """Record a step's value under the lease; returns the value stored (a parallel twin's
        if it was first), as JSON gives it back, like every later run gets it."""
        try:
            text = payload_json.dumps(value, f"the value of step {name!r}")
        except PayloadError as exc:  # checked before it is kept: a retry would pay for the call again
            why = (
                f"{exc}; nothing was recorded, and the job is dead without a retry (a retry would "
                "call the step again and get the same kind of value): return a JSON value from the "
                "step, e.g. response.model_dump() or the text you need"
            )
            raise Unretryable(why) from None
        stored = self.write(name, text, None, started_us)
        if stored is None:
            raise LeaseLost(
                f"cannot record step {name!r} of job {self.job_id}: its claim is gone (timed out, "
                "cancelled, or taken by another worker); the step's value is not kept"
            )
        return json.loads(stored)

    def failed(self, name: str, error: BaseException, started_us: int) -> None:
        """Record that a step raised (shown by q.steps; the next run calls it again)."""
        if isinstance(error, Cancelled | LeaseLost):
            return
        self.write(name, None, payload_json.text(error_text(error)), started_us)


@dataclass
class JobContext:
    """What `progress()` and `cancelled()` know about the job running here."""

    job: Job
    report: Report
    still_claimed: StillClaimed | None = None  # None: the cancel flag is all there is to know
    cancel: threading.Event = field(default_factory=threading.Event)
    made: dict[str, int] = field(default_factory=dict)  # calls it queued (workflows.origin_of)
    steps: StepBook | None = None  # its durable steps (nbqueue.step); None: steps are plain calls
    save_file: Callable[[str, str], bool] | None = None  # stores a file with the job (notebook jobs)
    # Reaches a wait (nbqueue.suspend) under the claim; None where waits are not supported.
    reach: Callable[[WaitSpec], Reached] | None = None
    waited: set[str] = field(default_factory=set)  # wait and sleep names reached in this run
    suspended: bool = False  # this run ended in a wait: the job is `waiting`, not failed
    suspension: Suspension | None = None  # ... which its worker is to write (with its batch)
    emitter: Emits | None = None  # its stream (nbqueue.streams.Emitter); None: emits go nowhere
    last_write: float = float("-inf")
    last_check: float = float("-inf")

    def close_stream(self) -> None:
        """Write what the run emitted: before its outcome is recorded, so a reader that sees the
        job finished has seen all of it."""
        if self.emitter is not None:
            self.emitter.close()


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
