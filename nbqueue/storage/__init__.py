"""The Storage protocol: the queue verbs every backend speaks, and `open_storage()`.

Storage executes atomic state changes; it decides nothing. Whether a failure
becomes a retry or a dead letter is decided in `nbqueue.queue`, so both
backends behave the same. Times are integer microseconds since the epoch;
delays are passed as durations so a backend may use its own server's clock.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

from ..clock import from_us
from ..errors import InvalidArgument, StorageError
from ..jobs import Job, State

#: The job columns every backend selects, in the order `row_to_job` reads them.
COLUMNS = (
    "id, status, queue, task, payload, priority, key, retries, max_retries, attempts, error, "
    "run_at, created_at, updated_at, started_at, finished_at, lease_until, worker_id, timeout, "
    "output, backoff, result, progress_done, progress_total, progress_message"
)


@dataclass(frozen=True, slots=True)
class NewJob:
    """A validated job ready to be written: payload and backoff already JSON text."""

    queue: str
    task: str | None
    payload: str
    priority: int
    key: str | None
    max_retries: int
    delay_us: int  # run_at = now + delay_us ...
    timeout: float | None
    backoff: str
    run_at_us: int | None = None  # ... unless an absolute run_at was given


@dataclass(frozen=True, slots=True)
class Filter:
    """Which jobs a claim may take: queues (None = all) and tasks (None = all)."""

    queues: tuple[str, ...] | None = None
    tasks: tuple[str, ...] | None = None

    @property
    def matches_nothing(self) -> bool:
        """No queue or no task allowed (a worker without handlers): a claim takes nothing."""
        return self.queues == () or self.tasks == ()


class ClaimRequest(NamedTuple):
    """What a claim needs besides the time: which jobs, for whom, for how long."""

    where: Filter
    worker_id: str
    lease_us: int


class Storage(Protocol):
    """What a backend must do. Every method is atomic and safe from many threads.

    `now` is the time in microseconds, or None for "use the server's own clock"
    (only passed to a backend whose `server_clock` is True).
    """

    server_clock: bool

    def insert(self, jobs: Sequence[NewJob], now: int | None) -> list[tuple[int, bool]]:
        """Write jobs in one transaction; (id, created) each. A held key returns its job."""
        ...

    def claim(self, where: Filter, worker_id: str, lease_us: int, now: int | None) -> Job | None:
        """Atomically take the best due job: highest priority, then earliest run_at, then id."""
        ...

    def heartbeat(self, job_id: int, attempt: int, lease_us: int | None, now: int | None) -> int | None:
        """Extend a live lease (None = by the claim's lease); the new end, or None if lost."""
        ...

    def complete(
        self,
        job_id: int,
        attempt: int,
        result: str,
        output: str | None,
        now: int | None,
        then_claim: ClaimRequest | None = None,
    ) -> tuple[bool, Job | None]:
        """Running -> completed under a live lease (False if it was lost).

        With `then_claim`, the next job is claimed in the same transaction.
        """
        ...

    def fail(
        self,
        job_id: int,
        attempt: int,
        error: str,
        output: str | None,
        status: State,
        delay_us: int,
        now: int | None,
        expired: bool = False,
    ) -> bool:
        """Running -> failed (due after delay_us) or dead, under the lease.

        With `expired`, the lease must have run out instead (recovery).
        """
        ...

    def release(self, job_id: int, attempt: int, now: int | None) -> bool:
        """Running -> pending without counting a retry (graceful shutdown)."""
        ...

    def transition(
        self, ids: Iterable[int] | None, sources: Sequence[State], target: State, now: int | None
    ) -> list[int]:
        """Move jobs (None = every job in `sources`) to target; cancel and requeue."""
        ...

    def progress(
        self, job_id: int, attempt: int, done: float, total: float | None, message: str, now: int | None
    ) -> bool:
        """Record a running job's progress; False if the claim is gone (cancelled, timed out)."""
        ...

    def periodic(self, name: str, slot_us: int, job: NewJob, now: int | None) -> bool:
        """Move `name`'s last slot forward to `slot_us` and enqueue `job` with it, atomically.

        False if a slot at or after `slot_us` was already taken (by any worker), or if
        `name` was never seen: then the slot is only recorded.
        """
        ...

    def get(self, job_id: int) -> Job | None:
        """One job, or None."""
        ...

    def get_many(self, job_ids: Sequence[int]) -> list[Job]:
        """The jobs among those ids that exist, in any order."""
        ...

    def expired(self, now: int | None, limit: int) -> list[Job]:
        """Running jobs whose lease ended before now."""
        ...

    def delete(self, ids: Iterable[int], statuses: Sequence[State]) -> int:
        """Delete those jobs among ids that are in one of `statuses`."""
        ...

    def purge(
        self, statuses: Sequence[State], older_than_us: int, now: int | None, limit: int | None = None
    ) -> int:
        """Delete jobs in `statuses` not updated for `older_than_us` (0: all; at most `limit`)."""
        ...

    def counts(self, queue: str | None = None) -> dict[str, int]:
        """Jobs per state (without scanning the table)."""
        ...

    def rows(
        self, status: Sequence[State] | None, queue: str | None, limit: int, offset: int = 0
    ) -> list[Job]:
        """A page of jobs, newest first."""
        ...

    def queues(self) -> list[str]:
        """The names of the queues that hold jobs."""
        ...

    def next_due(self, where: Filter) -> int | None:
        """The earliest run_at of a claimable job (for the worker's sleep)."""
        ...

    def task_names(self, statuses: Sequence[State]) -> list[str]:
        """The task names of jobs in `statuses`."""
        ...

    def now(self) -> int | None:
        """The server's clock in microseconds, or None for a backend without one."""
        ...

    def wait_for_change(self, timeout: float) -> None:
        """Block until another writer may have committed, or timeout seconds pass."""
        ...

    def notify(self) -> None:
        """Wake waiters in this process (after a commit that made work)."""
        ...

    def close(self) -> None:
        """Release connections."""
        ...


def row_to_job(row: Sequence[Any]) -> Job:
    """A row selected as COLUMNS, as a Job; a row whose JSON is damaged raises StorageError."""
    try:
        payload = json.loads(row[4])
        backoff = json.loads(row[20]) if row[20] else None
    except (TypeError, ValueError) as exc:  # never pickle, never eval: damaged text is an error
        raise StorageError(f"job {row[0]}: its stored payload is not valid JSON ({exc})") from None
    return Job(
        id=row[0],
        status=State(row[1]),
        queue=row[2],
        task=row[3],
        payload=payload,
        priority=row[5],
        key=row[6],
        retries=row[7],
        max_retries=row[8],
        attempts=row[9],
        error=row[10],
        run_at=from_us(row[11]),  # type: ignore[arg-type]
        created_at=from_us(row[12]),  # type: ignore[arg-type]
        updated_at=from_us(row[13]),  # type: ignore[arg-type]
        started_at=from_us(row[14]),
        finished_at=from_us(row[15]),
        lease_until=from_us(row[16]),
        worker_id=row[17],
        timeout=row[18],
        output=row[19],
        backoff=backoff,
        result_json=row[21],
        progress_done=row[22],
        progress_total=row[23],
        progress_message=row[24],
    )


def open_storage(target: str, *, synchronous: str = "normal") -> Storage:
    """Open the storage a path or URL names: a SQLite file, or postgresql://."""
    if not isinstance(target, str) or not target or "\x00" in target:
        raise InvalidArgument(f"a queue needs a file path or a postgresql:// URL, not {target!r}")
    if target.startswith(("postgresql://", "postgres://")):
        from .postgres import PostgresStorage  # noqa: PLC0415 - optional dependency (psycopg)

        return PostgresStorage(target, synchronous=synchronous)
    from .sqlite import SQLiteStorage  # noqa: PLC0415

    return SQLiteStorage(target, synchronous=synchronous)
