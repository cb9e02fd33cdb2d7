"""Leases and fencing: a worker whose claim is gone can change nothing."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

import nbqueue
from nbqueue import Job, ManualClock, Queue


def at(clock: ManualClock, offset: float = 0.0) -> datetime:
    return datetime.fromtimestamp(clock() + offset, UTC)


def claim(q: Queue, lease: float = 10) -> Job:
    job = q.claim(lease=lease)
    assert job is not None
    return job


def snapshot(q: Queue, job_id: int) -> tuple[object, ...]:
    job = q.get(job_id)
    return (job.status, job.retries, job.attempts, job.error, job.result_json, job.run_at, job.lease_until)


@pytest.fixture
def expired(exact_queue: Queue, clock: ManualClock) -> Job:
    """A claim whose 10 s lease ran out a second ago, not yet recovered."""
    exact_queue.enqueue({"n": 1})
    job = claim(exact_queue, lease=10)
    clock.advance(11)
    return job


def test_complete_after_expiry_is_refused(exact_queue: Queue, expired: Job) -> None:
    before = snapshot(exact_queue, expired.id)
    with pytest.raises(nbqueue.LeaseLost, match="expired"):
        exact_queue.complete(expired, {"late": True})
    assert snapshot(exact_queue, expired.id) == before
    assert exact_queue.get(expired.id).status == "running"


def test_fail_after_expiry_is_refused(exact_queue: Queue, expired: Job) -> None:
    before = snapshot(exact_queue, expired.id)
    with pytest.raises(nbqueue.LeaseLost):
        exact_queue.fail(expired, "late failure")
    assert snapshot(exact_queue, expired.id) == before


def test_heartbeat_after_expiry_is_refused(exact_queue: Queue, expired: Job) -> None:
    before = snapshot(exact_queue, expired.id)
    with pytest.raises(nbqueue.LeaseLost):
        exact_queue.heartbeat(expired)
    assert snapshot(exact_queue, expired.id) == before


def test_reclaimed_job_fences_out_the_old_claim(exact_queue: Queue, clock: ManualClock, expired: Job) -> None:
    q = exact_queue
    assert q.recover() == 1
    clock.advance(2)  # the first retry's backoff
    new = claim(q)
    assert new.id == expired.id
    assert new.attempts == expired.attempts + 1
    before = snapshot(q, new.id)
    for action in (
        lambda: q.complete(expired, "stale result"),
        lambda: q.fail(expired, "stale failure"),
        lambda: q.heartbeat(expired),
    ):
        with pytest.raises(nbqueue.LeaseLost, match="claimed again"):
            action()
        assert snapshot(q, new.id) == before
    assert q.complete(new, "fresh result").value == "fresh result"
    with pytest.raises(nbqueue.LeaseLost):
        q.complete(expired, "stale result")
    assert q.get(new.id).value == "fresh result"


def test_reclaim_without_recover_is_not_possible(
    exact_queue: Queue, clock: ManualClock, expired: Job
) -> None:
    # An expired lease alone does not make the job claimable; recover() decides its fate.
    assert exact_queue.claim() is None
    assert exact_queue.get(expired.id).status == "running"


def test_heartbeat_extends_the_lease(exact_queue: Queue, clock: ManualClock) -> None:
    q = exact_queue
    q.enqueue({"n": 1})
    job = claim(q, lease=10)
    assert job.lease_until == at(clock, 10)
    clock.advance(8)
    beat = q.heartbeat(job)
    assert beat.lease_until == at(clock, 10)  # now + the claim's lease
    assert q.get(job.id).lease_until == at(clock, 10)
    clock.advance(8)  # past the original lease, inside the extended one
    assert q.recover() == 0
    q.heartbeat(job, lease=30)
    assert q.get(job.id).lease_until == at(clock, 30)
    clock.advance(25)
    assert q.recover() == 0
    assert q.complete(job, "ok").status == "completed"


@pytest.mark.parametrize("lease", [0, 0.0, -1, -0.001, timedelta(0), timedelta(seconds=-5)])
def test_heartbeat_refuses_a_lease_that_is_not_positive(
    clocked_queue: Queue, clock: ManualClock, lease: Any
) -> None:
    q = clocked_queue
    q.enqueue({"n": 1})
    job = claim(q, lease=10)
    clock.advance(3)
    with pytest.raises(nbqueue.InvalidArgument, match="lease"):
        q.heartbeat(job, lease=lease)
    assert q.get(job.id).lease_until == at(clock, 7)  # unchanged
    assert q.heartbeat(job).lease_until == at(clock, 10)  # the claim is still good


@pytest.mark.parametrize(
    ("lease", "seconds"),
    [(5, 5), (0.25, 0.25), (timedelta(seconds=5), 5), (timedelta(milliseconds=1500), 1.5)],
)
def test_heartbeat_with_a_lease_sets_it_from_now_exactly(
    clocked_queue: Queue, clock: ManualClock, lease: Any, seconds: float
) -> None:
    q = clocked_queue
    q.enqueue({"n": 1})
    job = claim(q, lease=60)
    clock.advance(7.25)
    beat = q.heartbeat(job, lease=lease)
    assert beat.lease_until == at(clock, seconds)  # now + lease, even when shorter than what was left
    assert q.get(job.id).lease_until == at(clock, seconds)


def test_heartbeat_without_a_lease_extends_by_the_claims_own(
    clocked_queue: Queue, clock: ManualClock
) -> None:
    q = clocked_queue
    q.enqueue({"n": 1})
    q.enqueue({"n": 2})
    short, long = claim(q, lease=45), claim(q, lease=90)
    clock.advance(30)
    assert q.heartbeat(short).lease_until == at(clock, 45)
    assert q.heartbeat(long).lease_until == at(clock, 90)
    q.heartbeat(short, lease=5)  # a one-off lease does not change the claim's own
    clock.advance(1)
    assert q.heartbeat(short).lease_until == at(clock, 45)
    assert q.get(short.id).lease_until == at(clock, 45)
    assert q.get(long.id).lease_until == at(clock, 89)


def test_cancelled_running_job_refuses_its_result(exact_queue: Queue) -> None:
    q = exact_queue
    q.enqueue({"n": 1})
    job = claim(q)
    assert q.cancel(job.id).status == "cancelled"
    with pytest.raises(nbqueue.LeaseLost):
        q.complete(job, "too late")
    assert q.get(job.id).status == "cancelled"
    assert q.get(job.id).result_json is None


def test_recover_retries_after_backoff(exact_queue: Queue, clock: ManualClock) -> None:
    q = exact_queue
    job = q.enqueue({"n": 1}, max_retries=2)
    claim(q, lease=5)
    clock.advance(4)
    assert q.recover() == 0  # lease still live
    clock.advance(2)
    assert q.recover() == 1
    recovered = q.get(job.id)
    assert recovered.status == "failed"
    assert recovered.retries == 1
    assert "lease expired" in (recovered.error or "")
    assert recovered.run_at == at(clock, 2)
    clock.advance(1.999)
    assert q.claim() is None
    clock.advance(0.001)
    again = claim(q, lease=5)
    assert again.id == job.id and again.attempts == 2
    clock.advance(6)
    assert q.recover() == 1
    assert q.get(job.id).run_at == at(clock, 4)  # second retry: 2**2


def test_recover_kills_the_last_attempt(exact_queue: Queue, clock: ManualClock) -> None:
    q = exact_queue
    job = q.enqueue({"n": 1}, max_retries=0)
    claim(q, lease=1)
    clock.advance(2)
    assert q.recover() == 1
    dead = q.get(job.id)
    assert dead.status == "dead"
    assert "lease expired" in (dead.error or "")
    clock.advance(3600)
    assert q.claim() is None
    assert q.recover() == 0


def test_recover_returns_how_many(exact_queue: Queue, clock: ManualClock) -> None:
    q = exact_queue
    for i in range(5):
        q.enqueue({"n": i})
    short = [claim(q, lease=1) for _ in range(3)]
    long = claim(q, lease=100)
    clock.advance(2)
    assert q.recover() == 3
    assert q.recover() == 0
    assert {q.get(j.id).status for j in short} == {"failed"}
    assert q.get(long.id).status == "running"
    assert q.counts()["pending"] == 1
    assert q.complete(long, 1).status == "completed"


@pytest.mark.parametrize(("max_retries", "status"), [(2, "failed"), (1, "dead")])
def test_recover_keeps_the_output_the_job_had(
    exact_queue: Queue, clock: ManualClock, max_retries: int, status: str
) -> None:
    q = exact_queue
    job = q.enqueue({"n": 1}, max_retries=max_retries)
    first = claim(q, lease=5)
    assert q.fail(first, "the first attempt broke", output="printed by the first attempt\n") == "retry"
    clock.advance(2)  # the retry is due (2 s, no jitter)
    second = claim(q, lease=5)
    assert second.id == job.id and second.attempts == 2
    clock.advance(6)  # its worker vanished: the lease ran out
    assert q.recover() == 1
    recovered = q.get(job.id)
    assert recovered.status == status
    assert "lease expired" in (recovered.error or "")
    assert recovered.output == "printed by the first attempt\n"
