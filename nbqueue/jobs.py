"""Job, its states and the transitions allowed between them."""

from __future__ import annotations

import html
import json
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from .errors import InvalidTransition

if TYPE_CHECKING:
    from .queue import Queue


class State(StrEnum):
    """Where a job is in its life."""

    PENDING = "pending"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"  # an attempt failed; waiting for its retry at run_at
    DEAD = "dead"
    CANCELLED = "cancelled"


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
}

#: States a job can be claimed from.
CLAIMABLE = (State.PENDING, State.FAILED)
#: States that hold an idempotency key: the job is not finished yet.
UNFINISHED = (State.PENDING, State.FAILED, State.RUNNING)
#: States a job never leaves by itself.
FINISHED = (State.COMPLETED, State.DEAD, State.CANCELLED)


def sources(target: State, verb: str) -> tuple[State, ...]:
    """The states from which `verb` may move a job to `target`."""
    return tuple(a for (a, b), v in TRANSITIONS.items() if b == target and v == verb)


def check_transition(job_id: int, current: State | str, target: State | str) -> None:
    """Raise InvalidTransition unless current -> target is legal."""
    current, target = State(current), State(target)
    if (current, target) not in TRANSITIONS:
        allowed = sorted(b.value for (a, b) in TRANSITIONS if a == current) or ["nothing"]
        raise InvalidTransition(
            f"job {job_id} is {current.value}; it cannot become {target.value} "
            f"(from {current.value} it may become: {', '.join(allowed)})"
        )


@dataclass(frozen=True, slots=True)
class Progress:
    """How far a running job says it is: `done` of `total` (total may be unknown)."""

    done: float
    total: float | None = None
    message: str = ""

    @property
    def fraction(self) -> float | None:
        """done / total, between 0 and 1; None when the total is unknown."""
        if not self.total:
            return None
        return max(0.0, min(1.0, self.done / self.total))

    def __str__(self) -> str:
        amount = f"{self.done:g}" if self.total is None else f"{self.done:g}/{self.total:g}"
        return f"{amount} {self.message}".strip()


@dataclass(slots=True, eq=False, repr=False)
class Job:
    """One unit of work, as last read from the queue. `refresh()` re-reads it."""

    id: int
    status: State
    queue: str
    task: str | None
    payload: Any
    priority: int
    key: str | None
    retries: int
    max_retries: int
    attempts: int  # claims so far; the fencing token of the current claim
    error: str | None
    run_at: datetime
    created_at: datetime
    updated_at: datetime
    started_at: datetime | None = None
    finished_at: datetime | None = None
    lease_until: datetime | None = None
    worker_id: str | None = None
    timeout: float | None = None
    output: str | None = None
    backoff: dict[str, float] | None = None
    result_json: str | None = field(default=None, repr=False)
    progress_done: float | None = None
    progress_total: float | None = None
    progress_message: str | None = None
    _queue: Queue | None = field(default=None, repr=False)

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

    def refresh(self) -> Job:
        """Re-read this job from the queue, in place; returns self."""
        fresh = self._bound().get(self.id)
        for name in Job.__slots__:  # type: ignore[attr-defined]
            setattr(self, name, getattr(fresh, name))
        return self

    def result(self, timeout: float | None = None) -> Any:
        """Wait until the job finishes and return its result.

        Raises:
            JobFailed: the job ended dead or cancelled.
            WaitTimeout: it did not finish within `timeout` seconds.
        """
        return self._bound().result(self, timeout=timeout)

    def _bound(self) -> Queue:
        if self._queue is None:
            raise InvalidTransition(f"job {self.id} is not attached to a Queue")
        return self._queue

    def __repr__(self) -> str:
        what = self.task or "payload"
        return (
            f"<Job {self.id} {self.status.value} {what} queue={self.queue!r} "
            f"retries={self.retries}/{self.max_retries}>"
        )

    def _repr_html_(self) -> str:
        rows = [
            ("status", self.status.value),
            ("task", self.task or "(raw payload)"),
            ("queue", self.queue),
            ("priority", self.priority),
            ("attempts", f"{self.attempts} (retries {self.retries} of {self.max_retries})"),
            ("run at", self.run_at.isoformat(timespec="seconds")),
            ("payload", json.dumps(self.payload)[:300]),
        ]
        if self.key:
            rows.append(("key", self.key))
        if self.status is State.COMPLETED:
            rows.append(("result", (self.result_json or "null")[:300]))
        if self.error:
            rows.append(("error", self.error.strip().splitlines()[-1][:300]))
        body = "".join(
            f"<tr><th style='text-align:left'>{html.escape(k)}</th>"
            f"<td style='text-align:left'>{html.escape(str(v))}</td></tr>"
            for k, v in rows
        )
        return f"<table><caption>nbqueue job {self.id}</caption>{body}</table>"
