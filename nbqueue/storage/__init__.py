"""The Storage protocol: the queue verbs every backend speaks, and `open_storage()`.

Storage runs atomic statements and reports rows; it decides nothing. Whether a
failure is retried or dead, what a damaged row becomes and when a periodic slot
is due are decided above it (`nbqueue.policy`, `nbqueue.manager`), so both
backends behave the same. Rules that must run inside SQL (which states a claim
takes, which hold a key) are written once, in `storage.rules`, and both
backends build their fixed statements from them when their module loads.

Times are integer microseconds since the epoch. Storage stamps its writes with
its `clock`, the Queue's (its manager sets it); on the system clock a backend
whose `server_clock` is True lets the server stamp them (`stamp()` is then
None). Rows are tuples of the job columns in `nbqueue.jobs.COLUMNS` order.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

from ..clock import Clock
from ..errors import InvalidArgument
from ..jobs import JobRow, State
from ..records import AttemptRow, LimitRow, Reached, RunRow, StepRow, Suspension, WaitRow, WaitSpec
from ..search import Search
from .checkpoints import CheckpointStorage

Row = tuple[Any, ...]
Inserted = tuple[int, bool, int | None]  # id, created, created_at (microseconds)


def claim_order(row: JobRow) -> tuple[int, int, int]:
    """A claimed row's place in claim order: priority first, then run_at, then id. Both
    backends sort a batch's claims by it."""
    return (-row.priority, row.run_at, row.id)


@dataclass(slots=True)
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
    signature: str | None = None  # nbqueue.signing: the job was queued by this user's process
    limits: str | None = None  # JSON {key: units} (nbqueue.limits), None for an unlimited job
    gate: str = ""  # the job's set of limit keys, as the claim index groups them
    parents: tuple[int, ...] = ()  # after=: the jobs it waits for
    when: str | None = None  # what it waits for (nbqueue.dependencies.When)
    # Made by a running job: that job and the call (made once however often it is retried).
    origin: str | None = None
    workflow: int | None = None  # the workflow it was made in
    family_limit: int | None = None  # made by a running job: its family holds at most this many jobs

    def with_payload(self, payload: str) -> NewJob:
        """This job (without parents) with another payload: enqueue_many's many payloads, one
        set of options. (Not frozen, so that this is quick; nothing changes a NewJob.)"""
        return NewJob(
            self.queue, self.task, payload, self.priority, self.key, self.max_retries, self.delay_us,
            self.timeout, self.backoff, self.run_at_us, self.signature, self.limits, self.gate,
        )  # fmt: skip


class StoredSchedule(NamedTuple):
    """A schedule kept in the database: which task it enqueues with what, when, and how."""

    name: str
    task: str
    payload: str  # the job's JSON body: {"args": [...], "kwargs": {...}}
    spec: str  # JSON: {"cron": ..., "tz": ...} or {"every": seconds}
    options: str  # JSON: the jobs' options (queue, priority, max_retries, timeout)
    signature: str | None  # over task and payload (nbqueue.signing): a forged row is not run


@dataclass(frozen=True, slots=True)
class StepRecord:
    """A durable step's outcome, recorded under the claim (job id and attempt) that ran it."""

    job_id: int
    attempt: int
    name: str
    value: str | None  # JSON text; None when it raised
    error: str | None
    started_us: int

    def params(self) -> dict[str, Any]:
        """The statement parameters both backends' RECORD_STEP take."""
        return {
            "id": self.job_id,
            "attempt": self.attempt,
            "name": self.name,
            "value": self.value,
            "error": self.error,
            "started": self.started_us,
        }


@dataclass(frozen=True, slots=True)
class Filter:
    """Which jobs a claim may take: queues (None = all), tasks (None = all), and the tasks whose
    jobs must carry a signature (checked by the claimer: nbqueue.signing)."""

    queues: tuple[str, ...] | None = None
    tasks: tuple[str, ...] | None = None
    signed: tuple[str, ...] | None = None

    @property
    def matches_nothing(self) -> bool:
        """No queue or no task allowed (a worker without handlers): a claim takes nothing."""
        return self.queues == () or self.tasks == ()


Decide = Callable[
    [list[tuple[int, str | None]], list[Row], list[Row], int],
    "tuple[int, dict[str, int], dict[str, int]] | None",
]
"""Chooses a claim under limits: given the candidates (id, limits JSON) in claim order, the
keys' stored states, the units running jobs hold and the time, the job to take, the keys' new
TATs and the units it holds of each key (or None). Decided above the storage (nbqueue.limits);
the storage runs it inside the claim's transaction, with the keys locked."""


class ClaimRequest(NamedTuple):
    """What a claim needs besides the time: which jobs, for whom, for how long."""

    where: Filter
    worker_id: str
    lease_us: int
    host: str | None = None  # the claiming process's host (nbqueue.lifeline.this_host) and pid:
    pid: int | None = None  # a job whose process is gone is recovered at once


class Completion(NamedTuple):
    """A finished job's success, ready to write: its claim (id, attempt) and encoded result."""

    job_id: int
    attempt: int
    result: str
    output: str | None


class Storage(CheckpointStorage, Protocol):
    """What a backend must do. Every method is atomic and safe from many threads."""

    #: True when the backend has a clock of its own (a database server's `now()`).
    server_clock: bool
    #: What writes are stamped with: the Queue's clock (set by the manager that owns the storage).
    clock: Clock
    # How many jobs a worker may take per transaction (finish_batch's `claims`): a worker
    # whose jobs are quick takes up to this many at once and writes their outcomes together.
    batch_claims: int

    def insert(self, jobs: Sequence[NewJob]) -> list[Inserted]:
        """Write jobs in one transaction; (id, created, created_at) each, so a new job needs no
        read back. A held key returns its job's id, not created, and no time."""
        ...

    def insert_linked(
        self,
        count: int,
        make: Callable[[int, list[int], int | None], NewJob],
        workflow: str | None,
    ) -> list[tuple[int, bool]]:
        """Write `count` jobs that may wait for parents, in one transaction: `make(i, ids, wf)` gives
        job i, knowing the ids of the jobs before it (and the workflow's id, when `workflow` names
        one to create). (id, created) each; a parent that does not exist rolls everything back."""
        ...

    def edges(self, job_ids: Sequence[int]) -> list[Row]:
        """(parent, child) for every edge that touches these jobs."""
        ...

    def workflow_jobs(self, workflow: int) -> list[int]:
        """The ids of a workflow's jobs."""
        ...

    def step_values(self, job_id: int) -> dict[str, str]:
        """The steps a job completed: name -> JSON value."""
        ...

    def emit(
        self, job_id: int, attempt: int, run: int, items: Sequence[tuple[int, str]], bound: int | None
    ) -> bool:
        """Under the live claim (job_id, attempt), store a run's (seq, JSON text) items in attempt
        `run`'s stream (each once), then, with a `bound`, keep at most that many bytes of it (the
        newest item always). False (nothing stored) if the claim is gone."""
        ...

    def stream_head(self, job_id: int, most: int) -> tuple[int, int] | None:
        """The newest attempt up to `most` that has items, and the first item it keeps (before it,
        dropped by the bound); None if none."""
        ...

    def stream_items(self, job_id: int, run: int, after: int, limit: int) -> list[tuple[int, str]]:
        """Items of attempt `run` numbered after `after`, in order: (seq, JSON text)."""
        ...

    def stream_last(self, job_ids: Sequence[int]) -> dict[int, str]:
        """Each job's newest item (JSON text), for the jobs that emitted any."""
        ...

    def peek_waits(self, job_ids: Sequence[int]) -> list[Row]:
        """The waits these jobs reached or were sent (job_id, name, kind, choices, deadline,
        value, expired_at) and their steps (job_id, name, "step", NULL...): read, not written."""
        ...

    def suspend(self, suspensions: Sequence[Suspension]) -> list[bool]:
        """Write runs' suspensions in one transaction (storage/waits.py suspend_all)."""
        ...

    def reach_wait(self, job_id: int, attempt: int, wait: WaitSpec) -> Reached:
        """Under the live claim, in one transaction: what the wait returns now, or the job
        suspended (running -> waiting, lease released). LeaseLost if the claim is gone."""
        ...

    def send(self, job_ids: Sequence[int], name: str, value: str, by: str) -> list[bool]:
        """Record `value` (JSON) under `name` for each job (ascending ids) in one transaction,
        waking the jobs that wait for it (True for each woken). JobNotFound, InvalidTransition
        (a finished job) or InvalidArgument (sent already, expired, outside its choices) write
        nothing."""
        ...

    def wake_due(self, limit: int) -> list[int]:
        """Move up to `limit` waiting jobs whose deadline or wake-up time has come to pending."""
        ...

    def next_wake(self) -> int | None:
        """The earliest time a waiting job wakes by itself (None: none does)."""
        ...

    def waits(self, job_ids: Sequence[int]) -> list[WaitRow]:
        """What these jobs wait for, and were sent, in the order they reached it."""
        ...

    def record_step(self, step: StepRecord) -> str | None:
        """Record a step's value (or its error) under the live lease. Its stored value (the first
        value recorded wins; None after an error), or None if the claim is gone (nothing recorded)."""
        ...

    def steps(self, job_id: int) -> list[StepRow]:
        """A job's steps: name, value, error, attempt, started_at, finished_at, in the order they finished."""
        ...

    def step_previews(self, job_id: int, chars: int) -> list[StepRow]:
        """`steps` with each value cut to its first `chars` characters (a view's preview: the
        whole value never leaves the database): name, value, error, attempt, started_at, finished_at."""
        ...

    def forget_steps(self, job_id: int, since: int) -> int:
        """Forget the steps that finished at or after `since`; how many."""
        ...

    def save_file(self, job_id: int, attempt: int, name: str, content: str) -> bool:
        """Write (or replace) the job's file `name` under the live lease of claim `attempt`; True if
        written, False (nothing written) if that claim is gone."""
        ...

    def load_file(self, job_id: int, name: str) -> str | None:
        """The content of the job's file `name`, or None if it has none."""
        ...

    def file_names(self, job_ids: Sequence[int]) -> dict[int, list[str]]:
        """The names of the files each of these jobs has, sorted (jobs without files left out)."""
        ...

    def replay(self, job_id: int, since: int) -> bool:
        """In one transaction: move a finished job back to pending (a requeue; a completed job too)
        with its graph, and forget its steps that finished at or after `since`. False (nothing
        changed) if it is not finished or an unfinished job holds its key."""
        ...

    def claim(self, request: ClaimRequest) -> JobRow | None:
        """Atomically take the best due job: highest priority, then earliest run_at, then id."""
        ...

    def limited_waiting(self, where: Filter) -> bool:
        """True when a claimable job the filter allows holds limit keys (claims must weigh limits)."""
        ...

    def claim_limited(self, request: ClaimRequest, decide: Decide, most: int = 1) -> list[JobRow]:
        """Claim up to `most` jobs under limits, in one transaction: for each, read the candidates
        and the keys' states (locked) and the units running, let `decide` choose, take that job
        and store the keys' new TATs; stop when `decide` takes none."""
        ...

    def define_limit(self, key: str, concurrency: int | None, rate: float | None, burst: float) -> None:
        """Store a key's limits (its TAT and pause are kept)."""
        ...

    def pause(self, keys: Sequence[str], until_us: int, why: str) -> None:
        """Pause keys until then (a later pause already there is kept)."""
        ...

    def resume(self, key: str) -> bool:
        """End a key's pause."""
        ...

    def limits(self) -> tuple[list[LimitRow], list[Row], int]:
        """Every limit (key, concurrency, rate, burst, tat, paused_until, paused_why, in_flight),
        the claimable jobs waiting per key (key, n), and the time."""
        ...

    def snooze(
        self,
        job_id: int,
        attempt: int,
        delay_us: int,
        note: str,
        output: str | None,
        pause: Sequence[str],
    ) -> bool:
        """Running -> pending, due after delay_us, no retry counted (snoozes + 1), under the live
        lease; and, in the same transaction, pause the `pause` keys for as long."""
        ...

    def heartbeat(self, job_id: int, attempt: int, lease_us: int | None) -> int | None:
        """Extend a live lease (None = by the claim's lease); the new end, or None if it was lost."""
        ...

    def finish_batch(
        self,
        done: Sequence[Completion],
        then_claim: ClaimRequest | None,
        claims: int,
        suspended: Sequence[Suspension] = (),
        decide: Decide | None = None,
        peek: Collection[str] = (),
    ) -> tuple[list[bool], list[JobRow], int | None, list[Row] | None]:
        """Complete `done` and write the `suspended` runs' waits (each True, or False if its lease
        was lost: the completions' flags, then the suspensions'), then claim up to `claims` jobs
        one by one in claim order (as that many claims would; under limits, weighed by `decide`
        as `claim_limited` does), in one transaction where the backend can; the time it
        stamped (None: the server's); and, when several jobs are claimed and one is of a task
        in `peek` (tasks whose jobs reach waits), their `peek_waits` rows read in the same
        transaction, where that costs less than a read of its own (None: not read)."""
        ...

    def fail(
        self,
        job_id: int,
        attempt: int,
        error: str,
        output: str | None,
        status: State,
        delay_us: int,
        expired: bool = False,
        failed_as: str | None = None,
    ) -> bool:
        """Running -> `status` (failed, due after delay_us; or dead) under the live lease.

        With `expired`, the lease must have run out instead (recovery), and the attempt is
        recorded as lost. `failed_as` ("lost", "timeout") is how the attempt is recorded when
        it says more than `status` (stored as a value, schema version 11).
        """
        ...

    def release(self, job_id: int, attempt: int) -> bool:
        """Running -> pending without counting a retry (graceful shutdown)."""
        ...

    def unclaim(self, job_id: int, attempt: int, started_at: int) -> bool:
        """Undo a claim whose job never started (a worker's batch gives it back): pending, its
        attempt count and attempt record as before the claim. Only that very claim (its
        `started_at`) is undone, so a repeat after a lost reply never touches a later claim."""
        ...

    def refuse(self, job_id: int, attempt: int, error: str) -> bool:
        """A claimed job whose signature does not verify -> pending, its signature removed (so it
        is never claimed as signed again), with `error` saying why it does not run."""
        ...

    def save_schedule(self, schedule: StoredSchedule) -> None:
        """Keep a schedule (replacing one of that name)."""
        ...

    def schedules(self) -> list[StoredSchedule]:
        """Every stored schedule, by name."""
        ...

    def delete_schedule(self, name: str) -> bool:
        """Forget a stored schedule and its last slot; False if there was none."""
        ...

    def repin(self, job_id: int, old: str, payload: str, signature: str | None) -> bool:
        """Replace a dead or cancelled job's payload (and signature), only if it is still `old`."""
        ...

    def sign(self, job_id: int, payload: str, signature: str, old: str | None) -> bool:
        """Store a job's signature, only if its payload is still `payload` and its signature `old`."""
        ...

    def identity(self) -> str:
        """This queue database's identity, which job signatures cover (nbqueue.trust)."""
        ...

    def runs(self, nonces: Sequence[str]) -> dict[str, RunRow]:
        """The runs these signature nonces are bound to: nonce -> (nonce, job_id, finished_at,
        result_mac); a nonce no job has claimed yet is absent."""
        ...

    def vouch(self, nonce: str, job_id: int, mac: str) -> bool:
        """Record the MAC of a signed job's result on its run (only if `nonce` is bound to it)."""
        ...

    def bury(self, job_id: int, error: str) -> bool:
        """A running job whose row cannot be read -> dead, with `error` saying why."""
        ...

    def cancel(self, job_ids: Sequence[int]) -> list[int]:
        """Unfinished jobs among `job_ids` -> cancelled; the ids that moved."""
        ...

    def requeue(self, job_ids: Sequence[int] | None) -> list[int]:
        """Dead or cancelled jobs (None: every dead job) -> pending, due now, retries 0.

        A job whose key an unfinished job holds is left alone, and of several with one
        key only the oldest comes back (`rules.KEY_IS_FREE`). The ids that moved.
        """
        ...

    def progress(self, job_id: int, attempt: int, done: float, total: float | None, message: str) -> bool:
        """Record a running job's progress; False if the claim is gone (cancelled, timed out)."""
        ...

    def periodic_slot(self, name: str) -> int | None:
        """The last slot recorded for the periodic schedule `name`, or None if never seen."""
        ...

    def periodic_advance(self, name: str, last: int | None, slot: int, job: NewJob | None) -> bool:
        """Move `name`'s recorded slot from `last` (None: not recorded yet) to `slot`, and enqueue
        `job` with it, atomically; False if another worker moved it first."""
        ...

    def tidy(self) -> None:
        """Housekeeping a worker runs now and then (PostgreSQL folds its count changes)."""
        ...

    def get(self, job_id: int) -> JobRow | None:
        """One job's row, or None."""
        ...

    def get_many(self, job_ids: Sequence[int]) -> list[JobRow]:
        """The rows of those ids that exist, in any order."""
        ...

    def expired(self, limit: int) -> list[JobRow]:
        """Running jobs whose lease ended before now, oldest lease first."""
        ...

    def running_on(self, host: str) -> list[tuple[JobRow, int | None]]:
        """The running jobs claimed by processes of `host`, each with the claiming process's pid."""
        ...

    def claims(self, job_ids: Sequence[int]) -> list[Row]:
        """(id, status, worker_host, worker_pid, lease_until, lease_us) of those jobs that exist."""
        ...

    def attempts(self, job_id: int) -> list[AttemptRow]:
        """A job's attempts: attempt, started_at, finished_at, worker_id, host, pid, outcome, error."""
        ...

    def activity(self, since: int) -> list[Row]:
        """(minute number (time // 60 s), completed, failed) for attempts that ended at or after `since`."""
        ...

    def failures(self, job_ids: Sequence[int]) -> dict[int, int]:
        """Failed attempts of each of these jobs (jobs without any left out)."""
        ...

    def delete(self, job_ids: Sequence[int]) -> int:
        """Delete the finished jobs among `job_ids`; how many."""
        ...

    def purge(self, statuses: Sequence[State], older_than_us: int, limit: int | None = None) -> int:
        """Delete finished jobs in `statuses` not updated for `older_than_us` (0: all; at most `limit`)."""
        ...

    def counts(self, queue: str | None = None) -> dict[str, int]:
        """Jobs per state, read from counts kept as jobs change (never a scan of the jobs)."""
        ...

    def rows(
        self,
        statuses: Sequence[State] | None,
        queue: str | None,
        limit: int,
        offset: int = 0,
        brief: bool = False,
    ) -> list[JobRow]:
        """A page of jobs, newest first; `brief`: without payload, result and output, and only the
        end of the error text (what a listing shows, however big the jobs are)."""
        ...

    def search(
        self,
        found: Search,
        statuses: Sequence[State] | None,
        queue: str | None,
        limit: int,
        offset: int = 0,
        brief: bool = False,
    ) -> list[JobRow]:
        """A page of the jobs a search finds, newest first (`rows`, of those only)."""
        ...

    def count_found(self, found: Search, statuses: Sequence[State] | None, queue: str | None) -> int:
        """How many jobs a search finds."""
        ...

    def dead_since(self, since: int) -> int:
        """How many jobs are dead now and died after `since` (microseconds)."""
        ...

    def queues(self) -> list[str]:
        """The names of the queues that hold jobs."""
        ...

    def next_due(self, where: Filter) -> int | None:
        """The earliest run_at of a claimable job the filter allows (for the worker's sleep)."""
        ...

    def task_names(self, statuses: Sequence[State], signed: bool = False) -> list[str]:
        """The task names of jobs in `statuses` (only of signed jobs, with `signed`)."""
        ...

    def pending_per_task(self) -> list[Row]:
        """(queue, task, count) of the pending jobs, one row per queue and task."""
        ...

    def now(self) -> int | None:
        """The server's clock in microseconds, or None for a backend without one."""
        ...

    def stamp(self) -> int | None:
        """The time a write now stamps, from `clock`; None where the server's clock stamps it."""
        ...

    def now_us(self) -> int:
        """The time by the clock writes are stamped with (the server's, where it stamps them)."""
        ...

    def wait_for_change(self, timeout: float) -> None:
        """Block until another writer may have committed, or timeout seconds pass."""
        ...

    def notify(self) -> None:
        """Wake waiters in this process (after a commit that made work)."""
        ...

    def wake(self) -> None:
        """Wake every waiter in this process now, also one blocked listening to the server (a stop)."""
        ...

    def close(self) -> None:
        """Release connections."""
        ...


def open_storage(target: str, *, synchronous: str = "normal") -> Storage:
    """Open the storage a path or URL names: a SQLite file, or postgresql://."""
    if not isinstance(target, str) or not target or "\x00" in target:
        raise InvalidArgument(f"a queue needs a file path or a postgresql:// URL, not {target!r}")
    if target.startswith(("postgresql://", "postgres://")):
        from .postgres import PostgresStorage  # noqa: PLC0415 - optional dependency (psycopg)

        return PostgresStorage(target, synchronous=synchronous)
    from .sqlite import SQLiteStorage  # noqa: PLC0415

    return SQLiteStorage(target, synchronous=synchronous)
