"""JobManager: the one door to a queue's storage.

Every verb that changes or reads jobs passes through here: its arguments are
checked, `nbqueue.policy` decides (retry or dead, periodic slots, why a claim
was lost), the storage runs the statement, and the rows it reports are
decoded into Jobs. A row that cannot be decoded is never a raw error: a claimed
one goes to the dead letters, a read one raises `DamagedJob`. The Queue, the
worker and the job context all use this door; nothing above it touches storage.
"""

from __future__ import annotations

import functools
import logging
import os
import time
from collections.abc import AsyncIterator, Coroutine, Iterable, Iterator, Sequence
from datetime import datetime, timedelta
from typing import Any

from . import dependencies, limits, policy, streams, waiting
from . import payload as payload_json
from . import tasks as registry
from .admin import EVERY_STEP, Admin
from .checkpoints import Checkpoints
from .clock import EPOCH, Clock, from_us, system_clock, to_us
from .context import JobContext
from .errors import (
    DamagedJob,
    InvalidArgument,
    JobNotFound,
    LeaseLost,
    NbqueueError,
)
from .inbox import Inbox, Peek, describe, open_wait
from .intake import Intake
from .jobs import (
    UNFINISHED,
    Job,
    JobRow,
    State,
    Verdict,
    check_claim,
    from_row,
    listed,
)
from .journal import Journal
from .lifeline import HOST, Lifeline, process_gone, this_host
from .links import GRAPH_LIMIT, Links
from .options import check_id, read_stored
from .payload import check_output, error_text
from .periodic import STORED_PREFIX, Periodic, Periodics
from .records import AttemptRow, LimitRow, Suspension
from .retry import Backoff
from .search import Search
from .storage import (
    ClaimRequest,
    Completion,
    Filter,
    Row,
    Storage,
)
from .trust import Trust

log = logging.getLogger("nbqueue.manager")

# What this module offers; the names that moved to the manager's rooms stay importable here.
__all__ = [
    "EVERY_STEP",
    "GRAPH_LIMIT",
    "HOST",
    "STORED_PREFIX",
    "JobManager",
    "Periodic",
    "mine",
    "process_gone",
    "this_host",
]

MINUTE_US = 60_000_000
LIMITS_RECHECK = 1.0  # seconds a claim trusts its last look for jobs that hold limit keys
BURY_RETRIES = 20  # damaged rows buried in a row before a claim gives up for now


def mine(request: ClaimRequest) -> ClaimRequest:
    """A claim request that names this process (its host and pid), for orphan recovery."""
    if request.host is not None:
        return request
    return request._replace(host=HOST, pid=os.getpid())


class JobManager:
    """A queue's storage, clock and rules, behind one set of verbs."""

    def __init__(self, storage: Storage, clock: Clock | None = None, backoff: Backoff | None = None) -> None:
        self.storage = storage
        self.trust = Trust(storage.identity, storage.runs, storage.vouch)  # signed: one run, one database
        self.clock: Clock = clock or system_clock
        storage.clock = self.clock  # storage stamps its writes with the queue's clock
        self.backoff = backoff or Backoff()
        self._limited: dict[Filter, tuple[float, bool]] = {}  # do limited jobs wait? (until, answer)
        # When the limits that held the last limited claim back let a job start, by time alone
        # (a rate's next slot, a pause's end): a waiting worker sleeps until then, no longer.
        self._limits_open_at: int | None = None
        #: The jobs linked by `after=`: a job's relatives, a workflow's or a job's graph.
        self.links = Links(storage, lambda job: job.attach(self))
        #: New jobs: encoded, signed, linked and written (one, many, or a workflow's together).
        self.intake = Intake(
            storage,
            self.trust,
            self.backoff,
            self.get_many,
            lambda job: job.attach(self),
            self.links.graph,
            self._limited.clear,  # this process now has limited work: claims weigh limits at once
        )
        #: The periodic schedules (declared here or stored) and their slots.
        self.periodic = Periodics(storage, self.now, self.intake.encode)
        #: What a person does to jobs after the fact: cancel, requeue, replay, delete, purge, trust.
        self.admin = Admin(storage, self.trust, self.get, self.get_many)
        #: What a running job keeps with its claim: its durable steps and its files.
        self.journal = Journal(storage)
        #: What jobs wait for and what is sent to them (nbqueue.suspend).
        self.inbox = Inbox(storage, self.get_many)
        #: LangGraph threads kept in this database (nbqueue.integrations.langgraph).
        self.checkpoints = Checkpoints(storage, self.now_us)
        #: Claims whose worker is gone: expired leases, orphans, silent workers.
        self.lifeline = Lifeline(storage, self.now_us, lambda: self.backoff, lambda job: job.attach(self))

    # -- time ------------------------------------------------------------------

    def now_us(self) -> int:
        """The current time in microseconds, from the same clock storage uses."""
        return self.storage.now_us()

    def now(self) -> datetime:
        """The current time (UTC), from the same clock storage uses."""
        moment = from_us(self.now_us())
        assert moment is not None
        return moment

    # -- claims and their outcomes ---------------------------------------------

    def claim(self, request: ClaimRequest) -> Job | None:
        """Take the best due job the request allows (None if none); damaged rows go dead on the way.

        While jobs holding limit keys wait, the claim weighs the limits (nbqueue.limits) in
        the storage's transaction; otherwise it is one statement.
        """
        request = mine(request)
        self._limits_open_at = None  # set again only if this claim's limits hold every job back
        if self._limits_matter(request.where):
            taken = self._claim_limited(request, 1)
            return taken[0] if taken else None
        for _ in range(BURY_RETRIES):
            row = self.storage.claim(request)
            if row is None:
                return None
            job = self._decode_or_bury(row, request)
            if job is not None:
                return job
        return None

    def _claim_limited(self, request: ClaimRequest, most: int) -> list[Job]:
        """Up to `most` jobs weighed under their limits in one transaction (a worker's batch);
        the rows whose limits cannot be weighed are buried, and the claim tried again."""
        self._limits_open_at = None  # set again only if this claim's limits hold every job back
        for _ in range(BURY_RETRIES):
            unfit: dict[int, str] = {}  # jobs whose limits cannot be weighed: taken to be buried
            rows = self.storage.claim_limited(request, functools.partial(self._choose, unfit=unfit), most)
            for row in rows:
                if row.id in unfit:
                    log.warning("%s: dead", unfit[row.id])
                    self.storage.bury(row.id, unfit[row.id])
            decoded = (self._decode_or_bury(row, request) for row in rows if row.id not in unfit)
            jobs = [job for job in decoded if job is not None]
            if jobs or not rows:
                return jobs
        return []

    def _limits_matter(self, where: Filter) -> bool:
        """Do jobs with limit keys wait where this claim looks? Asked at most every second (an
        enqueue of such a job in this process asks again at once)."""
        now = time.monotonic()
        known = self._limited.get(where)
        if known is not None and known[0] > now:
            return known[1]
        answer = self.storage.limited_waiting(where)
        self._limited[where] = (now + LIMITS_RECHECK, answer)
        return answer

    def _choose(
        self,
        heads: list[tuple[int, str | None]],
        states: list[Row],
        running: list[Row],
        now_us: int,
        unfit: dict[int, str],
    ) -> tuple[int, dict[str, int], dict[str, int]] | None:
        """The first candidate, in claim order, that its limits let start now (storage.Decide).

        A candidate whose limits cannot be weighed (its limits column, or a key's stored row,
        holds what enqueue or `Queue.limit` would refuse) is taken, with why in `unfit`, to be
        buried: the other jobs, and the other keys' jobs, go on."""
        held = {str(key): int(units or 0) for key, units in running}
        keys: dict[str, limits.KeyState] = {}
        broken: dict[str, str] = {}  # key -> why its stored row cannot be used
        for row in states:
            try:
                keys[str(row[0])] = limits.read_state(row, held.get(str(row[0]), 0))
            except Exception as exc:  # a hand-written row: only its own jobs are stopped
                kind = "" if isinstance(exc, NbqueueError) else f"{type(exc).__name__}: "
                broken[str(row[0])] = f"{kind}{str(exc)[:200]}"
        opening = []
        for job_id, wanted in heads:
            if not wanted:
                self._limits_open_at = None
                return job_id, {}, {}
            try:
                asked = read_stored(wanted)
            except NbqueueError as exc:
                unfit[job_id] = f"job {job_id}: its stored row cannot be read (its limits column: {exc})"
                return job_id, {}, {}
            try:
                for key in asked:
                    if key in broken:
                        raise InvalidArgument(
                            f"limit {key!r} as stored cannot be used ({broken[key]}); "
                            f"set it again with q.limit({key!r}, ...) and requeue the job"
                        )
                admission = limits.admit(asked, keys, now_us)
                if admission is None:
                    opening.append(limits.opens_at(asked, keys, now_us))
            except NbqueueError as exc:
                unfit[job_id] = f"job {job_id} cannot start under its limits: {exc}"
                return job_id, {}, {}
            if admission is not None:
                self._limits_open_at = None
                return job_id, admission.tats, dict(asked)
        self._limits_open_at = min((at for at in opening if at is not None), default=None)
        return None

    def _decode_or_bury(self, row: JobRow, request: ClaimRequest) -> Job | None:
        """`_decode_claimed`, and whatever else the row makes it raise buries the job with why:
        it is claimed already, and a raw error here would leave it running until its lease ends."""
        try:
            return self._decode_claimed(row, request)
        except NbqueueError:  # the storage failed: the lease brings the job back
            raise
        except Exception as exc:
            why = f"job {row.id}: its stored row cannot be run ({type(exc).__name__}: {str(exc)[:200]})"
            log.exception("%s", why)
            self.storage.bury(row.id, why)
            return None

    def _decode_claimed(self, row: JobRow, request: ClaimRequest) -> Job | None:
        """A claimed row as a Job, or None if it may not run here.

        A damaged row is buried (dead, with why) so it never blocks the queue. A job of a
        signed task whose signature does not verify goes back to pending, unsigned, with why:
        it was not queued by this user's process, and it never runs.
        """
        try:
            job = from_row(row).attach(self)
        except DamagedJob as exc:
            self.storage.bury(row.id, str(exc))
            return None
        signed = job.task in (request.where.signed or ())
        refusal = self.trust.refusal(row) if signed else None
        if refusal is None and dependencies.MARK in row.payload:  # result_of: the parents' results, now final
            wanted = dependencies.markers(job.payload)
            rows = {r.id: r for r in self.storage.get_many(wanted)}
            refusal = self.trust.parents_refusal(rows, wanted) if signed else None
            parents = {p.id: (p.status, p.value, p.error) for p in map(listed, rows.values())}
            job.payload = dependencies.resolve(job.payload, parents)
        if refusal is not None:
            log.warning("job %d of task %s is not run: %s", job.id, job.task, refusal)
            self.storage.refuse(job.id, job.attempts, refusal)
            return None
        return job

    def heartbeat(self, job: Job, lease_us: int | None = None) -> Job:
        """Extend a running claim's lease (None: by the claim's own lease)."""
        check_claim(job, None)
        until = self.storage.heartbeat(job.id, job.attempts, lease_us)
        if until is None:
            raise self._lease_lost(job, "heartbeat")
        job.lease_until = from_us(until)
        return job

    def complete(self, job: Job, result: Any, output: str | None = None) -> None:
        """Record success under the claim (LeaseLost if the claim was lost)."""
        [done], *_ = self.finish_batch([(job, self.completion(job, result, output))], None, 0)
        if not done:
            raise self._lease_lost(job, "complete")

    @property
    def batch_claims(self) -> int:
        """How many jobs a worker may claim in one transaction here (nbqueue.batches)."""
        return self.storage.batch_claims

    def completion(self, job: Job, result: Any, output: str | None = None) -> Completion:
        """A claimed job's success, checked and encoded (PayloadError: the result is not JSON)."""
        check_claim(job, State.COMPLETED)
        text = payload_json.dumps(result, "result")
        if job.signature:  # a signed job's result, vouched for: its signed children take it
            self.trust.vouch(job.task, job.id, job.signature, text)
        return Completion(job.id, job.attempts, text, payload_json.text(check_output(output)))

    def finish_batch(
        self,
        done: Sequence[tuple[Job, Completion | Suspension]],
        then_claim: ClaimRequest | None,
        claims: int,
    ) -> tuple[list[bool], list[Job], list[Row] | None]:
        """Record the successes and suspensions of `done` (True each, False where the claim was
        lost) and claim up to `claims` more jobs, in one transaction where the storage allows (a
        worker's batch); with them, the claimed jobs' waits when the storage read them there
        (their tasks have reached waits in this process: Inbox.waiting_tasks)."""
        then_claim = None if then_claim is None else mine(then_claim)
        limited = then_claim is not None and self._limits_matter(then_claim.where)
        completions = [(job, c) for job, c in done if isinstance(c, Completion)]
        suspended = [s for _, s in done if isinstance(s, Suspension)]
        unfit: dict[int, str] = {}  # jobs whose limits cannot be weighed: taken to be buried
        decide = functools.partial(self._choose, unfit=unfit) if limited else None
        if limited:
            self._limits_open_at = None  # set again only if the limits hold every job back
        written, rows, now, peeked = self.storage.finish_batch(
            [completion for _, completion in completions],
            then_claim,
            claims,
            suspended,
            decide,
            self.inbox.waiting_tasks,
        )
        completed, waits = iter(written[: len(completions)]), iter(written[len(completions) :])
        flags = [next(waits) if isinstance(c, Suspension) else next(completed) for _, c in done]
        finished = from_us(now if now is not None else to_us(system_clock()))
        assert finished is not None
        for (job, completion), ok in zip(done, flags, strict=True):
            if ok and isinstance(completion, Completion):
                job.status, job.result_json, job.output = (
                    State.COMPLETED,
                    completion.result,
                    completion.output,
                )
                job.lease_until, job.finished_at, job.updated_at = None, finished, finished
        if then_claim is None or not claims:
            return flags, [], None
        for row in rows:
            if row.id in unfit:
                log.warning("%s: dead", unfit[row.id])
                self.storage.bury(row.id, unfit[row.id])
        decoded = (self._decode_or_bury(row, then_claim) for row in rows if row.id not in unfit)
        return flags, [claimed for claimed in decoded if claimed is not None], peeked

    def fail(
        self,
        job: Job,
        error: str | BaseException,
        output: str | None = None,
        retry: bool = True,
        timed_out: bool = False,
    ) -> Verdict:
        """Record a failed attempt under the claim, by the job's and its task's rules
        (nbqueue.policy.after_error): retried after its backoff, dead, or snoozed. `timed_out`:
        the attempt ran past the job's timeout (its attempt is recorded as a "timeout")."""
        check_claim(job, State.FAILED)
        text = payload_json.text(error_text(error)) or ""
        output = payload_json.text(check_output(output))
        task = registry.find(job.task)
        retry_on, give_up_on = (None, ()) if task is None else (task.retry_on, task.give_up_on)
        failure = policy.after_error(job, error, self.backoff, retry_on, give_up_on, retry)
        if failure.verdict is Verdict.SNOOZE:
            pause = list(job.limits) if failure.pause else []
            done = self.storage.snooze(
                job.id, job.attempts, failure.delay_us, failure.note or text, output, pause
            )
        else:
            if failure.note:
                text = f"{failure.note}\n{text}"
            args = (job.id, job.attempts, text, output, failure.state, failure.delay_us)
            done = self.storage.fail(*args, failed_as="timeout" if timed_out else None)
        if not done:
            raise self._lease_lost(job, "fail")
        return failure.verdict

    def release(self, job: Job) -> bool:
        """Give a claimed job back unrun (pending, no retry counted); False if it was lost already."""
        check_claim(job, State.PENDING)
        return self.storage.release(job.id, job.attempts)

    def unclaim(self, job: Job) -> bool:
        """Undo the claim of a job that never started (a worker's batch gives it back): pending,
        with its attempt count as before; False if the claim was lost already."""
        check_claim(job, State.PENDING)
        if job.started_at is None:
            return False
        started = (job.started_at - EPOCH) // timedelta(microseconds=1)  # exactly as stored
        return self.storage.unclaim(job.id, job.attempts, started)

    def attempts(self, job_id: int) -> list[AttemptRow]:
        """A job's attempts (attempt, started_at, finished_at, worker_id, host, pid, outcome, error);
        raises JobNotFound for an unknown job."""
        rows = self.storage.attempts(check_id(job_id))
        if not rows and self.storage.get(job_id) is None:
            raise JobNotFound(f"no job with id {job_id}")
        return rows

    def activity(self, minutes: int) -> tuple[int, dict[int, tuple[int, int, int]]]:
        """The first of the last `minutes` minutes (minute number: time // 60 s) and, per minute
        number, the runs that ended in it: (completed, failed, snoozed)."""
        if isinstance(minutes, bool) or not isinstance(minutes, int) or not 1 <= minutes <= 100_000:
            raise InvalidArgument(f"minutes must be a whole number from 1 to 100000, not {minutes!r}")
        first = self.now_us() // MINUTE_US - (minutes - 1)
        rows = self.storage.activity(first * MINUTE_US)
        return first, {int(m): (int(c or 0), int(f or 0), int(z or 0)) for m, c, f, z in rows}

    def failures(self, job_ids: Sequence[int]) -> dict[int, int]:
        """Failed attempts (failed, dead, timeout, lost) of each of these jobs that has any."""
        return self.storage.failures(list(job_ids)) if job_ids else {}

    def context_for(self, job: Job, peek: Peek | None = None) -> JobContext:
        """What a claimed job reaches while it runs (progress, cancelled, steps, files, waits),
        each through this claim; `peek`: the waits of the jobs claimed with it, read once."""
        steps = self.journal.step_book(job)
        return JobContext(
            job,
            functools.partial(self.record_progress, job),
            still_claimed=lambda: not self.lifeline.lost_claims([job]),
            steps=steps,
            save_file=functools.partial(self.journal.save_file, job),
            reach=functools.partial(self.inbox.reach, job, peek=peek, steps=steps),
            emitter=self.journal.emitter(job, registry.stream_bytes(job.task)),
        )

    def record_progress(self, job: Job, done: float, total: float | None, message: str) -> bool:
        """Store a running job's progress; False once its claim is gone."""
        return self.storage.progress(job.id, job.attempts, done, total, message)

    def _lease_lost(self, job: Job, verb: str) -> LeaseLost:
        row = self.storage.get(job.id)
        try:
            current = None if row is None else from_row(row)
        except DamagedJob:
            current = None
        why = policy.lease_lost_reason(job, current)
        return LeaseLost(f"cannot {verb} job {job.id}: {why}; nothing was changed")

    # -- reading and managing ----------------------------------------------------

    def get(self, job_id: int) -> Job:
        """The job with that id; raises JobNotFound (or DamagedJob for a row that cannot be read)."""
        row = self.storage.get(check_id(job_id))
        if row is None:
            raise JobNotFound(f"no job with id {job_id}")
        return from_row(row).attach(self)

    def get_many(self, job_ids: Iterable[int]) -> list[Job]:
        """Several jobs by id, in the order given; raises JobNotFound for a missing one."""
        ids = [check_id(i) for i in job_ids]
        found = {job.id: job for job in self._decode_all(self.storage.get_many(ids))}
        missing = [i for i in ids if i not in found]
        if missing:
            raise JobNotFound(f"no job with id {missing[0]}")
        return [found[i] for i in ids]

    def _decode_all(self, rows: Iterable[Row]) -> list[Job]:
        return [from_row(row).attach(self) for row in rows]

    # -- graphs and steps --------------------------------------------------------

    def load_file(self, job_id: int, name: str) -> str | None:
        """A file kept with the job, as its Job reads it (JobSource)."""
        return self.journal.load_file(job_id, name)

    def stream(
        self, job_id: int, follow: bool = True, attempt: int | None = None, timeout: float | None = None
    ) -> Iterator[Any]:
        """A job's stream, as its Job reads it (JobSource): nbqueue.streams.read."""
        return streams.read(self, check_id(job_id), follow, attempt, timeout)

    def astream(
        self, job_id: int, follow: bool = True, attempt: int | None = None, timeout: float | None = None
    ) -> AsyncIterator[Any]:
        """The same, for a coroutine or a cell (JobSource)."""
        return streams.aread(self, check_id(job_id), follow, attempt, timeout)

    def stream_head(self, job_id: int, most: int) -> tuple[int, int] | None:
        """The newest attempt up to `most` with items, and the first it keeps (StreamSource)."""
        return self.storage.stream_head(job_id, most)

    def stream_items(self, job_id: int, run: int, after: int, limit: int) -> list[tuple[int, str]]:
        """Items of attempt `run` after `after` (StreamSource)."""
        return self.storage.stream_items(job_id, run, after, limit)

    def stream_last(self, job_ids: Sequence[int]) -> dict[int, str]:
        """Each job's newest item (JSON text), for the jobs that emitted any."""
        return self.storage.stream_last([check_id(i) for i in job_ids])

    def waits_for(self, job_id: int) -> str | None:
        """What a waiting job waits for, as text (JobSource)."""
        return describe(open_wait(self.inbox.waits([job_id])), self.now_us())

    def relatives(self, job_id: int) -> tuple[list[int], list[int]]:
        """A job's parents and children (ids), as its Job reads them (JobSource)."""
        return self.links.relatives(job_id)

    def counts(self, queue: str | None = None) -> dict[str, int]:
        """Jobs per state, every state present."""
        return self.storage.counts(queue)

    def queues(self) -> list[str]:
        """The names of the queues that hold jobs."""
        return self.storage.queues()

    def rows(
        self,
        statuses: Sequence[State] | None,
        queue: str | None,
        limit: int,
        offset: int,
        brief: bool = False,
        search: Search | None = None,
    ) -> list[JobRow]:
        """A page of raw rows, newest first (for DataFrames, which must show damaged rows too);
        with `search`, of the jobs it finds."""
        if search is None:
            return self.storage.rows(statuses, queue, limit, offset, brief)
        return self.storage.search(search, statuses, queue, limit, offset, brief)

    def jobs(
        self,
        statuses: Sequence[State] | None,
        queue: str | None,
        limit: int,
        offset: int,
        brief: bool = False,
        search: Search | None = None,
    ) -> list[Job]:
        """A page of jobs, newest first; a damaged row is listed as what can be read of it."""
        rows = self.rows(statuses, queue, limit, offset, brief, search)
        return [listed(row).attach(self) for row in rows]

    def count(self, statuses: Sequence[State] | None, queue: str | None, search: Search | None) -> int:
        """How many jobs a listing with these filters holds."""
        if search is not None:
            return self.storage.count_found(search, statuses, queue)
        counts = self.storage.counts(queue)
        return sum(n for state, n in counts.items() if statuses is None or state in statuses)

    def dead_since(self, since_us: int) -> int:
        """How many jobs are dead now and died after that time (microseconds)."""
        return self.storage.dead_since(since_us)

    def pending_per_task(self, queues: Sequence[str] | None = None) -> dict[str | None, int]:
        """How many pending jobs each task has in `queues` (all: None); None is raw payloads."""
        found: dict[str | None, int] = {}
        for queue, task, n in self.storage.pending_per_task():
            if queues is None or queue in queues:
                found[task] = found.get(task, 0) + int(n)
        return found

    def task_names(self, statuses: Sequence[State], signed: bool = False) -> list[str]:
        """The task names of jobs in `statuses` (with `signed`, only of jobs that carry a signature)."""
        return self.storage.task_names(statuses, signed)

    def next_due(self, where: Filter) -> int | None:
        """The earliest run_at of a job the filter allows (None: nothing waits)."""
        return self.storage.next_due(where)

    @property
    def limits_open_at(self) -> int | None:
        """When the limits that held the last claim back let a job start by time alone (a
        rate's next slot, a pause's end), in the storage's microseconds; None if they did not."""
        return self._limits_open_at

    def due_now(self, where: Filter) -> bool:
        """True when a job the filter allows may run now."""
        due = self.next_due(where)
        return due is not None and due <= self.now_us()

    def define_limit(self, limit: limits.Limit) -> None:
        """Store a key's limits."""
        self.storage.define_limit(limit.key, limit.concurrency, limit.rate, limit.burst)
        self._limited.clear()

    def pause(self, keys: Sequence[str], for_us: int, why: str) -> None:
        """Pause keys for that long."""
        now = self.now_us()
        self.storage.pause(keys, now + for_us, why)

    def resume(self, key: str) -> bool:
        """End a key's pause."""
        return self.storage.resume(key)

    def limit_rows(self) -> tuple[list[LimitRow], list[Row], int]:
        """The limits as stored, with their in-flight units, the jobs waiting per key, and the time
        (the queue's clock, as the pauses and rates were written with it)."""
        return self.storage.limits()

    def tidy(self) -> None:
        """Storage housekeeping a worker runs now and then."""
        self.storage.tidy()

    # -- waiting ---------------------------------------------------------------

    def wait_for_change(self, timeout: float) -> None:
        """Block until another writer may have committed, or timeout seconds pass."""
        self.storage.wait_for_change(timeout)

    def notify(self) -> None:
        """Wake this process's waiting workers."""
        self.storage.notify()

    def wake(self) -> None:
        """Wake every waiting worker thread at once (they are asked to stop)."""
        self.storage.wake()

    def result(self, job: Job | int, timeout: float | None = None) -> Any:
        """Wait for one job and return its result; raises JobFailed if it ended dead or cancelled."""
        return waiting.result(self, job, timeout)

    def result_async(self, job: Job | int, timeout: float | None = None) -> Coroutine[Any, Any, Any]:
        """Wait for one job in a coroutine (the caller's loop stays free); its result."""
        return waiting.result_async(self, job, timeout)

    def unfinished_ids(self) -> list[int]:
        """The ids of every job not finished now (pending, failed or running)."""
        return [job.id for job in self.jobs(UNFINISHED, None, 2**62, 0, brief=True)]

    def close(self) -> None:
        """Release the storage's connections."""
        self.storage.close()
