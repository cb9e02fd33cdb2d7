"""Job, its states, the transitions allowed between them, and how a stored row becomes a Job."""

from __future__ import annotations

import functools
import html
import json
from collections.abc import AsyncIterator, Coroutine, Generator, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, NamedTuple, Protocol

from .clock import from_us
from .errors import DamagedJob, InvalidArgument, InvalidTransition
from .retry import Backoff

NOTEBOOK_TASK = "nbqueue.notebook"  # the opt-in task that runs a notebook (nbqueue.notebooks)
NOTEBOOK_FILE = "notebook.ipynb"
#: Set in a notebook job's kernel (its job's id): waits there say they are not supported yet.
NOTEBOOK_JOB_ENV = "NBQUEUE_NOTEBOOK_JOB"  # a notebook job's executed notebook, among its stored files


class State(StrEnum):
    """Where a job is in its life."""

    PENDING = "pending"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"  # an attempt failed; waiting for its retry at run_at
    DEAD = "dead"
    CANCELLED = "cancelled"
    BLOCKED = "blocked"  # waiting for its parents (after=); never claimed
    # A parent ended dead or cancelled: it never runs (root_cause names that job).
    UPSTREAM_FAILED = "upstream_failed"
    # Suspended in a wait (nbqueue.wait_for, sleep, wait_for_jobs): holds no worker, never claimed.
    WAITING = "waiting"


class Verdict(StrEnum):
    """What a failed attempt leads to (`Queue.fail` returns it; it equals "retry" or "dead")."""

    RETRY = "retry"
    DEAD = "dead"
    SNOOZE = "snooze"  # RetryAfter or an HTTP 429/503: runs again later, no retry counted


#: Every legal change of state, with the verb that makes it.
TRANSITIONS: dict[tuple[State, State], str] = {
    (State.PENDING, State.RUNNING): "claim",
    (State.FAILED, State.RUNNING): "claim",
    (State.RUNNING, State.COMPLETED): "complete",
    (State.RUNNING, State.FAILED): "fail",
    (State.RUNNING, State.DEAD): "fail",
    (State.RUNNING, State.PENDING): "release",
    (State.RUNNING, State.CANCELLED): "cancel",
    (State.PENDING, State.CANCELLED): "cancel",
    (State.FAILED, State.CANCELLED): "cancel",
    (State.DEAD, State.PENDING): "requeue",
    (State.CANCELLED, State.PENDING): "requeue",
    (State.COMPLETED, State.PENDING): "replay",  # run again, its recorded steps from a given one forgotten
    (State.BLOCKED, State.PENDING): "unblock",  # its parents are done as it asked
    (State.BLOCKED, State.UPSTREAM_FAILED): "doom",  # a parent failed as it may not
    (State.BLOCKED, State.CANCELLED): "cancel",
    (State.UPSTREAM_FAILED, State.BLOCKED): "requeue",  # re-armed: its root cause was requeued
    (State.UPSTREAM_FAILED, State.PENDING): "requeue",
    (State.CANCELLED, State.BLOCKED): "requeue",  # requeued while its parents are unfinished
    (State.PENDING, State.BLOCKED): "rearm",  # not started, and a parent it counted came back
    (State.RUNNING, State.WAITING): "suspend",  # it waits (nbqueue.wait_for, sleep, wait_for_jobs)
    (State.WAITING, State.PENDING): "wake",  # a send, its deadline or wake-up time, its jobs done
    (State.WAITING, State.UPSTREAM_FAILED): "doom",  # a job it waits for failed as it may not
    (State.WAITING, State.CANCELLED): "cancel",
}

#: States a job can be claimed from.
CLAIMABLE = (State.PENDING, State.FAILED)
#: States that hold an idempotency key: the job is not finished yet.
UNFINISHED = (State.PENDING, State.FAILED, State.RUNNING, State.BLOCKED, State.WAITING)
#: States a job never leaves by itself.
FINISHED = (State.COMPLETED, State.DEAD, State.CANCELLED, State.UPSTREAM_FAILED)


def sources(target: State, verb: str) -> tuple[State, ...]:
    """The states from which `verb` may move a job to `target`."""
    return tuple(a for (a, b), v in TRANSITIONS.items() if b == target and v == verb)


def check_transition(job_id: int, current: State | str, target: State | str) -> None:
    """Raise InvalidTransition unless current -> target is legal; the message names the states a
    job must be in for that change ("only pending, failed, blocked or running jobs can be cancelled")."""
    current, target = State(current), State(target)
    if (current, target) in TRANSITIONS:
        return
    allowed = [a for a in _STATE_ORDER if (a, target) in TRANSITIONS]
    change = _CHANGES.get(target, f"become {target.value}")
    if not allowed:
        raise InvalidTransition(f"job {job_id} is {current.value}: no job can {change}")
    hint = ""
    if current in (State.DEAD, State.CANCELLED) and target is not State.PENDING:
        hint = " (requeue it for a fresh start)"
    raise InvalidTransition(
        f"job {job_id} is {current.value}: only {_either(a.value for a in allowed)} jobs can {change}{hint}"
    )


#: The order states are named in messages: a job's life, roughly.
_STATE_ORDER = (
    State.PENDING,
    State.FAILED,
    State.BLOCKED,
    State.RUNNING,
    State.WAITING,
    State.COMPLETED,
    State.DEAD,
    State.CANCELLED,
    State.UPSTREAM_FAILED,
)
#: How a message says "move to this state" (the rest: "become <state>").
_CHANGES = {
    State.RUNNING: "start running",
    State.COMPLETED: "be completed",
    State.FAILED: "be failed",
    State.CANCELLED: "be cancelled",
}


def _either(words: Iterable[str]) -> str:
    """'a', 'a or b', 'a, b or c'."""
    items = list(words)
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} or {items[-1]}"


def check_claim(job: Job, target: State | None) -> None:
    """The job must be a claim (running); target=None just checks that."""
    if not isinstance(job, Job):
        raise InvalidArgument(f"expected a Job (from claim()), not {type(job).__name__}")
    if target is None and job.status is not State.RUNNING:
        raise InvalidTransition(f"job {job.id} is {job.status.value}, not a running claim")
    if target is not None:
        check_transition(job.id, job.status, target)


@dataclass(frozen=True, slots=True)
class Progress:
    """How far a running job says it is: `done` of `total` (total may be unknown)."""

    done: float
    total: float | None = None
    message: str = ""

    @property
    def fraction(self) -> float | None:
        """done / total, between 0 and 1; None when the total is unknown (or 0)."""
        if not self.total:
            return None
        return max(0.0, min(1.0, self.done / self.total))

    def __str__(self) -> str:
        amount = f"{self.done:g}" if self.total is None else f"{self.done:g}/{self.total:g}"
        return f"{amount} {self.message}".strip()


class JobSource(Protocol):
    """Where a Job reads itself again and waits for its result (the queue it came from)."""

    def get(self, job_id: int) -> Job:
        """The job as stored now."""
        ...

    def result(self, job: Job | int, timeout: float | None = None) -> Any:
        """Wait for the job to finish and return its result."""
        ...

    def result_async(self, job: Job | int, timeout: float | None = None) -> Coroutine[Any, Any, Any]:
        """The same, for a coroutine: the caller's event loop stays free while it waits."""
        ...

    def relatives(self, job_id: int) -> tuple[list[int], list[int]]:
        """The ids of the job's parents (what it waits for, after=) and of its children."""
        ...

    def load_file(self, job_id: int, name: str) -> str | None:
        """A file stored with the job (a notebook job's executed notebook), or None."""
        ...

    def waits_for(self, job_id: int) -> str | None:
        """What a waiting job waits for, as text (None unless it waits)."""
        ...

    def stream(
        self, job_id: int, follow: bool = True, attempt: int | None = None, timeout: float | None = None
    ) -> Iterator[Any]:
        """What the job emitted (nbqueue.emit), then, with `follow`, what it emits until it finishes."""
        ...

    def astream(
        self, job_id: int, follow: bool = True, attempt: int | None = None, timeout: float | None = None
    ) -> AsyncIterator[Any]:
        """The same, for a coroutine or a notebook cell."""
        ...


@dataclass(slots=True, eq=False, repr=False)
class Job:
    """One unit of work, as last read from the queue. `refresh()` re-reads it."""

    #: The job's id, an integer unique within its queue database.
    id: int
    #: Where it is in its life (a `State`, which equals its string value).
    status: State
    #: The name of the queue it waits in.
    queue: str
    #: The registered task that runs it, or None for a raw payload job.
    task: str | None
    #: The payload: `{"args": [...], "kwargs": {...}}` for a task, any JSON for a raw job.
    payload: Any
    #: Higher runs first.
    priority: int
    #: The idempotency key, held while the job is unfinished.
    key: str | None
    #: Failed attempts that were retried so far.
    retries: int
    #: How many retries it may have: it runs at most max_retries + 1 times.
    max_retries: int
    #: Claims so far; also the fencing token of the current claim.
    attempts: int
    #: The last error (a traceback), kept after a requeue.
    error: str | None
    #: When it may run (next).
    run_at: datetime
    created_at: datetime
    updated_at: datetime
    started_at: datetime | None = None
    finished_at: datetime | None = None
    #: When the current claim ends unless a heartbeat extends it.
    lease_until: datetime | None = None
    #: Who holds (or last held) the claim: host:pid:thread:tag.
    worker_id: str | None = None
    #: Seconds an attempt may run before it is failed.
    timeout: float | None = None
    #: What the job printed (the tail).
    output: str | None = None
    #: The retry policy it carries, so every worker applies the same one.
    backoff: Backoff | None = None
    result_json: str | None = field(default=None, repr=False)
    progress_done: float | None = None
    progress_total: float | None = None
    progress_message: str | None = None
    #: Set on jobs queued by a notebook's magics (nbqueue.signing): proof of who queued them.
    signature: str | None = field(default=None, repr=False)
    #: The limit keys the job holds while it runs, with their units (nbqueue.limits).
    limits: dict[str, int] = field(default_factory=dict)
    #: Times it was snoozed (RetryAfter, HTTP 429/503): runs again later, no retry counted.
    snoozes: int = 0
    #: Parents (after=) it still waits for while blocked.
    parents_left: int = 0
    #: What it waits for: "all_succeeded", "all_done" or "any_succeeded" (None: no parents).
    when: str | None = None
    #: For an upstream_failed job: the dead or cancelled job at the start of the chain.
    root_cause: int | None = None
    #: The workflow (q.workflow) it was made in, if any.
    workflow: int | None = None
    _source: JobSource | None = field(default=None, repr=False)

    @property
    def args(self) -> list[Any]:
        """Positional arguments of a task job (empty for a raw payload)."""
        if self.task is None or not isinstance(self.payload, dict):
            return []
        return list(self.payload.get("args", []))

    @property
    def kwargs(self) -> dict[str, Any]:
        """Keyword arguments of a task job (empty for a raw payload)."""
        if self.task is None or not isinstance(self.payload, dict):
            return {}
        return dict(self.payload.get("kwargs", {}))

    @property
    def finished(self) -> bool:
        """True once the job is completed, dead or cancelled."""
        return self.status in FINISHED

    @property
    def progress(self) -> Progress | None:
        """What the job last reported with `nbqueue.progress()` (None if nothing)."""
        if self.progress_done is None:
            return None
        return Progress(self.progress_done, self.progress_total, self.progress_message or "")

    @property
    def value(self) -> Any:
        """The stored result, without waiting (None until completed)."""
        return None if self.result_json is None else json.loads(self.result_json)

    def attach(self, source: JobSource) -> Job:
        """Remember the queue this job was read from (for refresh and result); returns self."""
        self._source = source
        return self

    def refresh(self) -> Job:
        """Re-read this job from the queue, in place; returns self."""
        self.update_from(self._bound().get(self.id))
        return self

    def update_from(self, other: Job) -> None:
        """Take every field of `other` (a fresher read of the same job)."""
        for name in Job.__slots__:  # type: ignore[attr-defined]
            setattr(self, name, getattr(other, name))

    def result(self, timeout: float | None = None) -> Any:
        """Wait until the job finishes and return its result.

        Raises:
            JobFailed: the job ended dead or cancelled.
            WaitTimeout: it did not finish within `timeout` seconds.
        """
        return self._bound().result(self, timeout=timeout)

    def parents(self) -> list[int]:
        """The ids of the jobs this one waits for (after=, result_of)."""
        return self._bound().relatives(self.id)[0]

    def children(self) -> list[int]:
        """The ids of the jobs that wait for this one."""
        return self._bound().relatives(self.id)[1]

    def stream(
        self, follow: bool = True, attempt: int | None = None, timeout: float | None = None
    ) -> Iterator[Any]:
        """What this job emitted (`nbqueue.emit`), in order: its latest attempt's items (or
        `attempt`'s), then, with `follow`, each new one as it comes (within about 100 ms) until
        the job finishes, across its retries and waits (a retry's new stream is read from its
        start; a `Dropped` note stands for items the stream's bound dropped). From any process
        or machine. WaitTimeout if it is unfinished after `timeout` seconds."""
        return self._bound().stream(self.id, follow, attempt, timeout)

    def astream(
        self, follow: bool = True, attempt: int | None = None, timeout: float | None = None
    ) -> AsyncIterator[Any]:
        """`async for item in job.astream():` the same as `stream`, in a coroutine or a notebook
        cell; the caller's event loop stays free."""
        return self._bound().astream(self.id, follow, attempt, timeout)

    @property
    def waits_for(self) -> str | None:
        """What this job waits for while `waiting`, as text ("review: a person is asked 'Publish?',
        answer within 13 d"; "sleep cool-off, wakes in 52 min"; "jobs 5, 6"); None otherwise.
        Read from the queue: the status as last read decides whether to ask."""
        if self.status is not State.WAITING:
            return None
        return self._bound().waits_for(self.id)

    def notebook(self) -> dict[str, Any] | None:
        """A notebook job's executed notebook, read from the database (any machine can): the
        whole run, or as far as it got when a cell failed. None before a run has written one."""
        text = self._bound().load_file(self.id, NOTEBOOK_FILE)
        if text is None:
            return None
        try:
            import nbformat  # noqa: PLC0415  (a NotebookNode: nbformat.write() takes it as is)
        except ImportError:
            return json.loads(text)  # type: ignore[no-any-return]
        return nbformat.reads(text, as_version=4)  # type: ignore[no-any-return]

    def __await__(self) -> Generator[Any, None, Any]:
        """`value = await job` in a notebook cell or a coroutine: the result once it finishes
        (JobFailed if it ended dead or cancelled); the caller's loop stays free meanwhile."""
        return self._bound().result_async(self).__await__()

    def _bound(self) -> JobSource:
        if self._source is None:
            raise InvalidTransition(f"job {self.id} is not attached to a Queue")
        return self._source

    def __repr__(self) -> str:
        what = shown_task(self.task)
        return f"<Job {self.id} {self.status.value} {what} queue={self.queue!r} {attempt_text(self)}>"

    def _repr_html_(self) -> str:
        rows = [
            ("status", self.status.value),
            ("task", shown_task(self.task)),
            ("queue", self.queue),
            ("priority", self.priority),
            ("attempt", attempt_text(self)),
            ("run at", self.run_at.isoformat(timespec="seconds")),
            ("payload", json.dumps(self.payload)[:300]),
        ]
        if self.key:
            rows.append(("key", self.key))
        if self.status is State.COMPLETED:
            rows.append(("result", (self.result_json or "null")[:300]))
        if self.status is State.BLOCKED:
            rows.append(("waiting for", f"{self.parents_left} parent(s) ({self.when})"))
        if self.root_cause is not None:
            rows.append(("root cause", f"job {self.root_cause}"))
        if self.error:
            rows.append(("error", self.error.strip().splitlines()[-1][:300]))
        body = "".join(
            f"<tr><th style='text-align:left'>{html.escape(k)}</th>"
            f"<td style='text-align:left'>{html.escape(str(v))}</td></tr>"
            for k, v in rows
        )
        return f"<table><caption>nbqueue job {self.id}</caption>{body}</table>"


class JobRow(NamedTuple):
    """A job as stored: the columns every backend selects, in this order, read by name."""

    id: Any
    status: Any
    queue: Any
    task: Any
    payload: Any
    priority: Any
    key: Any
    retries: Any
    max_retries: Any
    attempts: Any
    error: Any
    run_at: Any
    created_at: Any
    updated_at: Any
    started_at: Any
    finished_at: Any
    lease_until: Any
    worker_id: Any
    timeout: Any
    output: Any
    backoff: Any
    result: Any
    progress_done: Any
    progress_total: Any
    progress_message: Any
    signature: Any
    limits: Any
    snoozes: Any
    parents_left: Any
    wait_when: Any
    root_cause: Any
    workflow: Any


#: The job columns, declared once (JobRow): the storage selects them, `from_row` reads them.
COLUMNS = JobRow._fields


def shown_task(task: str | None) -> str:
    """A task's name as a person reads it: `__main__.convert` is `convert`, a payload job
    is "(payload)"; any other module-qualified name stays whole."""
    if task is None:
        return "(payload)"
    return task.removeprefix("__main__.")


def attempt_text(job: Job) -> str:
    """The one way a person reads attempts: "attempt k of n", n = max_retries + 1.

    k is the attempt running, or the one that ended the job, or (a failed job waiting for
    its retry) the one that failed; a job waiting to run says "next: attempt k of n"."""
    allowed = job.max_retries + 1
    if job.status is State.FAILED:
        return f"attempt {min(job.retries, allowed)} of {allowed} failed"
    number = min(job.retries + 1, allowed)
    if job.status in (State.PENDING, State.BLOCKED):
        return f"next: attempt {number} of {allowed}"
    # Cancelled while waiting for a retry: the last attempt is the one that failed, not the next.
    number = min(number, job.attempts) if job.attempts else number
    if job.attempts == 0:  # cancelled or upstream_failed before it ever ran
        return f"never run ({allowed} attempt{'s' if allowed != 1 else ''} allowed)"
    return f"attempt {number} of {allowed}"


@functools.lru_cache(maxsize=64)
def stored_backoff(text: str) -> Backoff | None:
    """A job's stored backoff policy (most jobs share a few: each is read once; Backoff is frozen)."""
    data = json.loads(text)
    return None if data is None else Backoff.from_dict(data)


def from_row(row: Sequence[Any]) -> Job:
    """A stored row (its values in COLUMNS order) as a Job.

    Raises:
        DamagedJob: any column cannot be read back (JSON that is not JSON, nested
            beyond reason, a state or backoff that does not exist): never pickle,
            never eval, and never a raw error from deep inside a decoder.
    """
    try:
        r = row if isinstance(row, JobRow) else JobRow._make(row)
        return Job(
            id=int(r.id),
            status=State(r.status),
            queue=str(r.queue),
            task=None if r.task is None else str(r.task),
            payload=json.loads(_required_text(r.payload)),
            priority=_integer(r.priority),
            key=_text(r.key),
            retries=_integer(r.retries),
            max_retries=_integer(r.max_retries),
            attempts=_integer(r.attempts),
            error=_text(r.error),
            run_at=_time(r.run_at),
            created_at=_time(r.created_at),
            updated_at=_time(r.updated_at),
            started_at=from_us(r.started_at),
            finished_at=from_us(r.finished_at),
            lease_until=from_us(r.lease_until),
            worker_id=_text(r.worker_id),
            timeout=None if r.timeout is None else float(r.timeout),
            output=_text(r.output),
            backoff=stored_backoff(r.backoff) if r.backoff else None,
            result_json=_text(r.result),
            progress_done=r.progress_done,
            progress_total=r.progress_total,
            progress_message=_text(r.progress_message),
            signature=_text(r.signature),
            limits=stored_limits(r.limits),
            snoozes=_integer(r.snoozes),
            parents_left=_integer(r.parents_left),
            when=_text(r.wait_when),
            root_cause=r.root_cause,
            workflow=r.workflow,
        )
    except Exception as exc:  # RecursionError, TypeError, ValueError, OverflowError ...: all damage
        name = type(exc).__name__
        raise DamagedJob(f"job {row[0]}: its stored row cannot be read ({name}: {str(exc)[:200]})") from None


def listed(row: Sequence[Any]) -> Job:
    """A stored row as a Job for a listing: a damaged row shows what can be read of it (its
    damage in `error`), so one bad row never hides the others."""
    try:
        return from_row(row)
    except DamagedJob as exc:
        damage = str(exc)

    def number(value: Any) -> int:
        return value if isinstance(value, int) and not isinstance(value, bool) else 0

    def moment(value: Any) -> datetime:
        return from_us(number(value)) or datetime.fromtimestamp(0, UTC)

    r = row if isinstance(row, JobRow) else JobRow._make(row)
    return Job(
        id=number(r.id),
        status=State(r.status),  # a CHECK constraint keeps this column sound
        queue=str(r.queue),
        task=None if r.task is None else str(r.task),
        payload=None,
        priority=number(r.priority),
        key=None if r.key is None else str(r.key),
        retries=number(r.retries),
        max_retries=number(r.max_retries),
        attempts=number(r.attempts),
        error=f"{damage}\n{r.error or ''}".strip(),
        run_at=moment(r.run_at),
        created_at=moment(r.created_at),
        updated_at=moment(r.updated_at),
    )


def _required_text(value: Any) -> str:
    """A text column (a BLOB there would reach the signature check and the claim as bytes)."""
    if not isinstance(value, str):
        raise TypeError(f"expected a text column, found {type(value).__name__}")
    return value


def stored_limits(value: Any) -> dict[str, int]:
    """A job's stored limits column read back: a JSON object of key -> whole units (TypeError or
    ValueError for anything else; nbqueue.options.read_stored checks the keys and units further)."""
    if value is None or value == "":
        return {}
    if isinstance(value, str):  # the few texts a queue's jobs hold, read once each
        return dict(_limits_text(value))
    return _stored_limits(value)


@functools.lru_cache(maxsize=1024)
def _limits_text(value: str) -> tuple[tuple[str, int], ...]:
    return tuple(_stored_limits(value).items())


def _stored_limits(value: Any) -> dict[str, int]:
    found = json.loads(_required_text(value))
    if not isinstance(found, dict) or not all(
        isinstance(key, str) and isinstance(units, int) and not isinstance(units, bool) and units >= 1
        for key, units in found.items()
    ):
        raise ValueError(f"limits are not a JSON object of key -> whole units: {value[:80]!r}")
    return found


def _integer(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"expected an integer column, found {value!r:.60}")
    return value


def _text(value: Any) -> str | None:
    """A text column: SQLite keeps whatever was written, a BLOB too, which no view can show."""
    if value is not None and not isinstance(value, str):
        raise TypeError(f"expected a text column, found {value!r:.60}")
    return value


def _time(value: Any) -> datetime:
    moment = from_us(_integer(value))
    assert moment is not None
    return moment
