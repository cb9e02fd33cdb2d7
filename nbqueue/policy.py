"""The queue's rules, decided once above the storage, so both backends behave the same.

Storage runs statements and reports rows; whether a failure is retried or
dead, and whether a periodic slot is due, is decided here, in plain Python
that tests can read as tables.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from datetime import datetime

from .clock import to_us
from .errors import Unretryable
from .jobs import Job, State, Verdict
from .retry import Backoff, retry_after
from .schedule import Cron, Every


@dataclass(frozen=True, slots=True)
class Failure:
    """What a failed attempt leads to: the state it moves to and the wait (a retry, a snooze)."""

    verdict: Verdict
    delay_us: int = 0
    note: str | None = None  # the error text to keep, when it is not the error's own
    pause: bool = False  # a snooze that also pauses the job's limit keys

    @property
    def state(self) -> State:
        """The job's next state: failed (waiting for its retry), pending (snoozed) or dead."""
        return {Verdict.RETRY: State.FAILED, Verdict.SNOOZE: State.PENDING}.get(self.verdict, State.DEAD)


Errors = tuple[type[BaseException], ...]
MAX_SNOOZES = 100


def after_failure(
    job: Job, default: Backoff, retry: bool = True, rng: random.Random | None = None
) -> Failure:
    """Retry k (k = retries + 1) waits the job's backoff for k; past max_retries, or retry=False, dead."""
    number = job.retries + 1
    if not retry or number > job.max_retries:
        return Failure(Verdict.DEAD)
    policy = job.backoff or default
    return Failure(Verdict.RETRY, to_us(policy.delay(number, rng)))


def after_error(
    job: Job,
    error: BaseException | str,
    default: Backoff,
    retry_on: Errors | None = None,
    give_up_on: Errors = (),
    retry: bool = True,
) -> Failure:
    """What an error leads to, by the job's and its task's rules.

    A snooze (RetryAfter, an HTTP 429/503 with a delay) comes first, whatever the retry
    policy: the job runs again then, no retry counted, until it has been snoozed 100
    times. An error no retry can mend is dead at once. Then `give_up_on` (dead), then
    `retry_on` when given (dead unless it matches); else retried by its backoff.
    """
    if isinstance(error, BaseException):
        snooze = retry_after(error)
        if snooze is not None:
            if job.snoozes + 1 > MAX_SNOOZES:
                return Failure(Verdict.DEAD, note=f"snoozed too often ({MAX_SNOOZES} times); last: {snooze}")
            return Failure(
                Verdict.SNOOZE, to_us(snooze.seconds), note=f"snoozed: {snooze}", pause=snooze.pause_limits
            )
        if gives_up(error, retry_on, give_up_on):
            return Failure(Verdict.DEAD)
    return after_failure(job, default, retry)


def gives_up(error: BaseException, retry_on: Errors | None = None, give_up_on: Errors = ()) -> bool:
    """True for an error no retry may follow: one no retry can mend (Unretryable), one in
    `give_up_on`, or one outside `retry_on` when given. (A process-mode child decides it too,
    where its error is still an object.)"""
    if isinstance(error, Unretryable):
        return True
    if give_up_on and isinstance(error, give_up_on):
        return True
    return retry_on is not None and not isinstance(error, retry_on)


@dataclass(frozen=True, slots=True)
class Slot:
    """A periodic schedule's slot at some moment, and whether it makes a job."""

    at: datetime
    enqueue: bool


def due_slot(schedule: Every | Cron, now: datetime, last_us: int | None) -> Slot | None:
    """The slot to record now, or None if nothing is due.

    The first time a schedule is seen (no last slot stored) its current slot is
    only recorded: the first job comes at the next slot, not at once. After that,
    a slot later than the last one makes one job, however many slots were missed.
    """
    slot = schedule.latest(now)
    if slot is None:
        return None
    if last_us is None:
        return Slot(slot, enqueue=False)
    if to_us(slot.timestamp()) <= last_us:
        return None
    return Slot(slot, enqueue=True)


HEARTBEATS_PER_LEASE = 3  # a worker renews its claims' leases every lease / 3
#: A running job whose lease was not renewed for this many heartbeat intervals is silent.
SILENT_AFTER_BEATS = 2

LEASE_EXPIRED = "lease expired (the worker stopped heartbeating: crashed, killed or hung)"


def worker_gone(pid: int | None, host: str) -> str:
    """Why a job whose claiming process is gone was recovered before its lease ran out."""
    return f"lost: worker process {pid} on {host} is gone"


NOT_SIGNED = (
    "not run: this job is not signed by this notebook's user (it was written by another process, or "
    "altered); it stays pending. If you trust it, q.trust(job_id) signs it and it runs."
)
OLD_SIGNATURE = (
    "not run: this job was signed by an older nbqueue, whose signatures did not bind a job to its "
    "database and its run; it stays pending. If you trust it, q.trust(job_id) signs it again and it runs."
)
RUN_ENDED = (
    "not run: this signed job's run already ended (completed, dead or cancelled) and the row was set "
    "back to pending behind nbqueue's back; it stays pending. q.requeue(job_id) or q.trust(job_id) "
    "gives it a fresh start if you want it to run again."
)


def signed_copy(bound: int | None) -> str:
    """Why a signed row whose nonce belongs to another job's run does not run."""
    whose = "another job" if bound is None else f"job {bound}"
    return (
        f"not run: this row is a copy; its signature was made for {whose}, which runs it once. "
        "It stays pending; if you trust it, q.trust(job_id) signs it and it runs."
    )


def not_reloaded(job_id: int) -> str:
    """Why requeue(reload=True) refuses a signed job whose stored signature does not verify."""
    return (
        f"job {job_id} does not carry your signature as it is stored (another process wrote or "
        "changed it): nothing was reloaded. Read it; if you trust it, q.trust(job) and requeue again"
    )


def changed_since(read: Job, now: Job) -> list[str]:
    """What a signature covers that differs between a job as it was read and as it is now
    (`q.trust(job)` signs only what its caller read). Payloads compare as JSON text, so that
    `true` and `1`, or `1` and `1.0`, differ."""
    covered = ("task", "queue", "max_retries", "timeout", "backoff", "limits")
    changed = [name for name in covered if getattr(read, name) != getattr(now, name)]
    if json.dumps(read.payload, sort_keys=True) != json.dumps(now.payload, sort_keys=True):
        changed.insert(0, "payload")
    return changed


def untrusted_result(parent: int, why: str) -> str:
    """Why a signed job whose arguments take a parent's result (result_of) does not run."""
    return (
        f"not run: its arguments take the result of job {parent}, which {why}; a signed job takes only "
        "results that its user's signed jobs recorded, so it stays pending (q.trust does not change "
        "that: pass the value itself, or make the parent a signed task)."
    )


def lease_lost_reason(claim: Job, current: Job | None) -> str:
    """Why a claim can no longer complete, fail or heartbeat, from the job as stored now."""
    if current is None:
        return "the job was deleted"
    if current.status is not State.RUNNING:
        return f"the job is now {current.status.value}"
    if current.attempts != claim.attempts:
        return f"the job was claimed again (attempt {current.attempts}, this claim {claim.attempts})"
    return "the lease expired"
