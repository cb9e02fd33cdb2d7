"""The queue's rules, decided once above the storage, so both backends behave the same.

Storage runs statements and reports rows; whether a failure is retried or
dead, and whether a periodic slot is due, is decided here, in plain Python
that tests can read as tables.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import datetime

from .clock import to_us
from .jobs import Job, State, Verdict
from .retry import Backoff
from .schedule import Cron, Every


@dataclass(frozen=True, slots=True)
class Failure:
    """What a failed attempt leads to: the state it moves to and, for a retry, the wait."""

    verdict: Verdict
    delay_us: int = 0

    @property
    def state(self) -> State:
        """The job's next state: failed (waiting for its retry) or dead."""
        return State.FAILED if self.verdict is Verdict.RETRY else State.DEAD


def after_failure(
    job: Job, default: Backoff, retry: bool = True, rng: random.Random | None = None
) -> Failure:
    """Retry k (k = retries + 1) waits the job's backoff for k; past max_retries, or retry=False, dead."""
    number = job.retries + 1
    if not retry or number > job.max_retries:
        return Failure(Verdict.DEAD)
    policy = job.backoff or default
    return Failure(Verdict.RETRY, to_us(policy.delay(number, rng)))


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


LEASE_EXPIRED = "lease expired (the worker stopped heartbeating: crashed, killed or hung)"
NOT_SIGNED = (
    "not run: this job is not signed by this notebook's user (it was written by another process, or "
    "altered); it stays pending. If you trust it, q.approve(job_id) signs it and it runs."
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
