"""The job lifecycle through the public Queue API."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

import nbqueue
from nbqueue import Backoff, Job, ManualClock, Queue, State
from nbqueue.payload import MAX_BYTES

MakeQueue = Callable[..., Queue]


def at(clock: ManualClock, offset: float = 0.0) -> datetime:
    """The manual clock's time plus `offset` seconds, as the aware datetime a Job carries."""
    return datetime.fromtimestamp(clock() + offset, UTC)


def run_and_fail(q: Queue, job_id: int, error: str = "boom") -> str:
    job = q.claim()
    assert job is not None and job.id == job_id
    return q.fail(job, error)


# -- the basic lifecycle ------------------------------------------------------------------


def test_enqueue_claim_complete(queue: Queue) -> None:
    job = queue.enqueue({"prompt": "hi"}, queue="agent")
    assert job.status == "pending"
    assert job.status is State.PENDING
    assert job.payload == {"prompt": "hi"}
    assert job.queue == "agent"
    assert job.task is None
    assert (job.retries, job.attempts, job.max_retries, job.priority) == (0, 0, 3, 0)

    claimed = queue.claim(queues=["agent"], worker_id="w1", lease=30)
    assert claimed is not None
    assert claimed.id == job.id
    assert claimed.status == "running"
    assert claimed.attempts == 1
    assert claimed.worker_id == "w1"
    assert claimed.lease_until is not None and claimed.lease_until > claimed.started_at  # type: ignore[operator]
    assert queue.claim(queues=["agent"]) is None  # nothing else to take

    done = queue.complete(claimed, result={"ok": True, "n": [1, 2.5, None]})
    assert done.status == "completed"
    assert done.finished_at is not None
    assert queue.get(job.id).status == "completed"


def test_result_is_stored_as_json(queue: Queue) -> None:
    queue.enqueue({"n": 1})
    job = queue.claim()
    assert job is not None
    queue.complete(job, result={"ok": True, "items": ("a", "b")})
    stored = queue.get(job.id)
    assert json.loads(stored.result_json or "") == {"ok": True, "items": ["a", "b"]}
    assert stored.value == {"ok": True, "items": ["a", "b"]}
    assert stored.result() == {"ok": True, "items": ["a", "b"]}


def test_result_that_is_not_json_is_refused_and_changes_nothing(queue: Queue) -> None:
    queue.enqueue({"n": 1})
    job = queue.claim()
    assert job is not None
    with pytest.raises(nbqueue.PayloadError, match="result"):
        queue.complete(job, result={"when": datetime.now(UTC)})
    assert queue.get(job.id).status == "running"
    assert queue.complete(job, result=1).status == "completed"


def test_claim_filters_by_queue(queue: Queue) -> None:
    a = queue.enqueue({"n": 1}, queue="a")
    b = queue.enqueue({"n": 2}, queue="b")
    assert queue.claim(queues="c") is None
    got_b = queue.claim(queues="b")
    assert got_b is not None and got_b.id == b.id
    got_a = queue.claim(queues=["b", "a"])
    assert got_a is not None and got_a.id == a.id


def test_claim_filters_by_task(queue: Queue) -> None:
    @queue.task(name="gap.a")
    def a(n: int) -> int:
        return n

    @queue.task(name="gap.b")
    def b(n: int) -> int:
        return n

    raw = queue.enqueue({"raw": True}, priority=9)  # first in line for an unfiltered claim
    b1 = b.schedule(args=(1,), priority=5)
    a1, a2 = a.enqueue(1), a.enqueue(2)

    assert queue.claim(tasks=[]) is None  # no task named: nothing
    assert queue.claim(tasks=["gap.unknown"]) is None
    first = queue.claim(tasks=["gap.a"])
    second = queue.claim(tasks=["gap.a"])
    assert first is not None and second is not None
    assert (first.id, first.task, second.id) == (a1.id, "gap.a", a2.id)
    assert queue.claim(tasks=["gap.a"]) is None
    both = queue.claim(tasks=["gap.a", "gap.b"])
    assert both is not None and both.id == b1.id
    assert queue.claim(tasks=["gap.a", "gap.b"]) is None  # a raw payload job has no task
    assert queue.get(raw.id).status == "pending"
    anything = queue.claim()
    assert anything is not None and anything.id == raw.id


def test_fail_retries_after_exact_backoff_then_dies(exact_queue: Queue, clock: ManualClock) -> None:
    q = exact_queue
    job = q.enqueue({"n": 1}, max_retries=3)
    for retry, delay in enumerate([2, 4, 8], start=1):
        assert run_and_fail(q, job.id, f"error {retry}") == "retry"
        failed = q.get(job.id)
        assert failed.status == "failed"
        assert failed.retries == retry
        assert failed.attempts == retry
        assert failed.error == f"error {retry}"
        assert failed.run_at == at(clock, delay)
        clock.advance(delay - 0.001)
        assert q.claim() is None, "claimed before its backoff ran out"
        clock.advance(0.001)
    assert run_and_fail(q, job.id, "last error") == "dead"
    dead = q.get(job.id)
    assert dead.status == "dead"
    assert dead.attempts == 4
    assert dead.error == "last error"
    assert dead.finished_at == at(clock)
    assert q.claim() is None


def test_dead_job_has_used_exactly_max_retries(exact_queue: Queue, clock: ManualClock) -> None:
    q = exact_queue
    job = q.enqueue({"n": 1}, max_retries=3)
    outcomes = []
    for _ in range(10):
        claimed = q.claim()
        if claimed is None:
            clock.advance(3600)
            continue
        outcomes.append(q.fail(claimed, "boom"))
    assert outcomes == ["retry", "retry", "retry", "dead"]  # at most 4 runs
    dead = q.get(job.id)
    assert dead.attempts == 4
    assert dead.retries == 3, f"a dead job with max_retries=3 reports retries={dead.retries}"


def test_max_retries_zero_dies_at_first_failure(queue: Queue) -> None:
    job = queue.enqueue({"n": 1}, max_retries=0)
    assert run_and_fail(queue, job.id) == "dead"
    assert queue.get(job.id).status == "dead"


def test_fail_with_exception_stores_traceback(queue: Queue) -> None:
    queue.enqueue({"n": 1})
    job = queue.claim()
    assert job is not None
    try:
        raise ValueError("bad value 42")
    except ValueError as exc:
        queue.fail(job, exc)
    error = queue.get(job.id).error or ""
    assert "Traceback" in error and "ValueError: bad value 42" in error


def test_fail_without_retry_goes_dead(queue: Queue) -> None:
    queue.enqueue({"n": 1}, max_retries=5)
    job = queue.claim()
    assert job is not None
    assert queue.fail(job, "permanent", retry=False) == "dead"
    assert queue.get(job.id).status == "dead"


@pytest.mark.parametrize(("max_retries", "verdict"), [(3, "retry"), (0, "dead")])
def test_fail_stores_the_attempts_output(queue: Queue, max_retries: int, verdict: str) -> None:
    job = queue.enqueue({"n": 1}, max_retries=max_retries)
    claimed = queue.claim()
    assert claimed is not None and claimed.id == job.id
    assert queue.fail(claimed, "x", output="printed before it broke\n") == verdict
    stored = queue.get(job.id)
    assert stored.output == "printed before it broke\n"
    assert stored.error == "x"


def test_default_backoff_has_jitter_within_ten_percent(clocked_queue: Queue, clock: ManualClock) -> None:
    job = clocked_queue.enqueue({"n": 1})
    run_and_fail(clocked_queue, job.id)
    delay = (clocked_queue.get(job.id).run_at - at(clock)).total_seconds()
    assert 1.8 <= delay <= 2.2


def test_backoff_of_a_queue_is_used(make_queue: MakeQueue, clock: ManualClock) -> None:
    q = make_queue(clock=clock, backoff=Backoff(base=5, cap=7, jitter=0))
    job = q.enqueue({"n": 1})
    run_and_fail(q, job.id)
    assert q.get(job.id).run_at == at(clock, 5)
    clock.advance(5)
    run_and_fail(q, job.id)
    assert q.get(job.id).run_at == at(clock, 7)  # 25 capped at 7


# -- dead letters and requeue -----------------------------------------------------------


def test_dead_letters_lists_dead_jobs_with_their_error(queue: Queue) -> None:
    dead = queue.enqueue({"n": 1}, max_retries=0, queue="x")
    queue.enqueue({"n": 2})
    run_and_fail(queue, dead.id, "the API said no")
    frame = queue.dead_letters()
    ids = list(frame["id"]) if "id" in frame.columns else list(frame.index)
    assert ids == [dead.id]
    assert "the API said no" in str(frame["error"].iloc[0])
    assert len(queue.dead_letters(queue="other")) == 0


def test_requeue_gives_a_fresh_start(exact_queue: Queue, clock: ManualClock) -> None:
    q = exact_queue
    job = q.enqueue({"n": 1}, max_retries=1)
    run_and_fail(q, job.id, "first")
    clock.advance(2)
    run_and_fail(q, job.id, "second and last")
    assert q.get(job.id).status == "dead"
    clock.advance(1000)

    assert q.requeue(job.id) == 1
    fresh = q.get(job.id)
    assert fresh.status == "pending"
    assert fresh.retries == 0
    assert fresh.run_at == at(clock)  # due now
    assert fresh.error == "second and last"  # kept
    assert fresh.finished_at is None
    again = q.claim()
    assert again is not None and again.id == job.id
    assert again.attempts == 3
    assert q.fail(again, "x") == "retry"  # retries were reset: it has its retry again


def test_requeue_none_requeues_every_dead_job(queue: Queue) -> None:
    dead = [queue.enqueue({"n": i}, max_retries=0) for i in range(3)]
    for job in dead:
        run_and_fail(queue, job.id)
    cancelled = queue.enqueue({"n": 9})
    queue.cancel(cancelled.id)
    pending = queue.enqueue({"n": 10})

    assert queue.requeue(None) == 3
    assert [queue.get(j.id).status for j in dead] == ["pending"] * 3
    assert queue.get(cancelled.id).status == "cancelled"  # None means dead jobs only
    assert queue.get(pending.id).status == "pending"
    assert queue.counts()["dead"] == 0
    assert queue.requeue() == 0


def test_requeue_cancelled_and_many_ids(queue: Queue) -> None:
    a = queue.enqueue({"n": 1})
    b = queue.enqueue({"n": 2}, max_retries=0)
    queue.cancel(a.id)
    run_and_fail(queue, b.id)
    assert queue.requeue([a, b.id]) == 2
    assert queue.get(a.id).status == queue.get(b.id).status == "pending"


def test_requeue_refuses_an_unfinished_job(queue: Queue) -> None:
    job = queue.enqueue({"n": 1})
    with pytest.raises(nbqueue.InvalidTransition):
        queue.requeue(job.id)
    assert queue.get(job.id).status == "pending"


def run_to_death(q: Queue, job: Job) -> None:
    """Claim `job` (from its own queue) and fail it for the last time."""
    claimed = q.claim(queues=[job.queue])
    assert claimed is not None and claimed.id == job.id
    assert q.fail(claimed, "boom", retry=False) == "dead"


def test_requeue_by_id_leaves_a_job_whose_key_is_held_and_names_it(queue: Queue) -> None:
    q = queue
    q.enqueue_many([{"filler": i} for i in range(10)], queue="filler")  # two-digit ids below
    a = q.enqueue({"n": "a"}, key="shared", queue="work")
    b = q.enqueue({"n": "b"}, key="b's own", queue="work")
    for job in (a, b):
        run_to_death(q, job)
    c = q.enqueue({"n": "c"}, key="shared", queue="work")  # A is dead: its key is free for C
    assert c.id not in (a.id, b.id)

    with pytest.raises(nbqueue.InvalidTransition) as info:
        q.requeue([a.id, b.id])
    message = str(info.value)
    assert re.search(rf"\b{a.id}\b", message), message
    assert not re.search(rf"\b{b.id}\b", message), message
    assert q.get(b.id).status == "pending"  # requeued all the same
    assert q.get(b.id).retries == 0
    assert q.get(a.id).status == "dead"
    assert q.get(c.id).status == "pending"
    assert q.enqueue({"n": "again"}, key="shared").id == c.id  # C still holds the key
    assert q.counts("work") == {**dict.fromkeys(q.counts(), 0), "pending": 2, "dead": 1}


def test_requeue_all_dead_requeues_the_oldest_of_jobs_sharing_a_key(queue: Queue) -> None:
    """Two dead jobs share a key: requeue(None) gives it to the oldest, silently leaves the other."""
    q = queue
    older = q.enqueue({"n": "older"}, key="k", queue="work")
    run_to_death(q, older)
    newer = q.enqueue({"n": "newer"}, key="k", queue="work")  # the key was free again
    assert newer.id != older.id
    run_to_death(q, newer)
    keyless = q.enqueue({"n": "no key"}, queue="work")
    run_to_death(q, keyless)

    assert q.requeue(None) == 2
    assert q.get(older.id).status == "pending"
    assert q.get(keyless.id).status == "pending"
    assert q.get(newer.id).status == "dead"
    assert q.enqueue({"n": "again"}, key="k").id == older.id
    assert q.counts() == {**dict.fromkeys(q.counts(), 0), "pending": 2, "dead": 1}


# -- cancel, purge, counts --------------------------------------------------------------


def test_cancel_pending(queue: Queue) -> None:
    job = queue.enqueue({"n": 1})
    cancelled = queue.cancel(job.id)
    assert cancelled.status == "cancelled"
    assert queue.claim() is None
    assert queue.counts()["cancelled"] == 1


def test_cancel_failed_waiting_for_retry(queue: Queue) -> None:
    job = queue.enqueue({"n": 1})
    run_and_fail(queue, job.id)
    assert queue.cancel(job).status == "cancelled"


@pytest.mark.parametrize("end", ["completed", "dead", "cancelled"])
def test_cancel_finished_job_is_refused(queue: Queue, end: str) -> None:
    job = queue.enqueue({"n": 1}, max_retries=0)
    if end == "cancelled":
        queue.cancel(job.id)
    else:
        claimed = queue.claim()
        assert claimed is not None
        if end == "completed":
            queue.complete(claimed, 1)
        else:
            queue.fail(claimed, "x")
    with pytest.raises(nbqueue.InvalidTransition):
        queue.cancel(job.id)
    assert queue.get(job.id).status == end


def finish_one_of_each(q: Queue) -> dict[str, int]:
    ids = {}
    for name in ("completed", "dead", "cancelled", "pending", "failed", "running"):
        ids[name] = q.enqueue({"state": name}, max_retries=0 if name == "dead" else 3, queue=name).id
    for name in ("completed", "dead", "failed", "running"):
        job = q.claim(queues=name)
        assert job is not None
        if name == "completed":
            q.complete(job)
        elif name in ("dead", "failed"):
            q.fail(job, "x")
    q.cancel(ids["cancelled"])
    return ids


def test_counts_has_every_state(queue: Queue) -> None:
    six = ["pending", "running", "completed", "failed", "dead", "cancelled"]
    assert queue.counts() == dict.fromkeys([s.value for s in nbqueue.State], 0)
    finish_one_of_each(queue)
    assert queue.counts() == dict.fromkeys([s.value for s in nbqueue.State], 0) | dict.fromkeys(six, 1)
    assert queue.counts(queue="dead") == {**dict.fromkeys(queue.counts(), 0), "dead": 1}


def test_purge_only_finished_states(queue: Queue) -> None:
    ids = finish_one_of_each(queue)
    assert queue.purge() == 1  # completed by default
    with pytest.raises(nbqueue.JobNotFound):
        queue.get(ids["completed"])
    assert queue.purge(status=["dead", "cancelled"]) == 2
    for name in ("pending", "failed", "running"):
        assert queue.get(ids[name]).status == name
        with pytest.raises(nbqueue.InvalidArgument):
            queue.purge(status=name)
    assert sum(queue.counts().values()) == 3
    with pytest.raises(nbqueue.InvalidArgument):
        queue.purge(status="bogus")


@pytest.mark.parametrize("older_than", [50, 50.0, timedelta(seconds=50)])
def test_purge_older_than(clocked_queue: Queue, clock: ManualClock, older_than: Any) -> None:
    q = clocked_queue
    old = q.enqueue({"n": 1})
    q.complete(q.claim())  # type: ignore[arg-type]
    clock.advance(100)
    new = q.enqueue({"n": 2})
    q.complete(q.claim())  # type: ignore[arg-type]
    clock.advance(10)
    assert q.purge(status="completed", older_than=older_than) == 1
    with pytest.raises(nbqueue.JobNotFound):
        q.get(old.id)
    assert q.get(new.id).status == "completed"


# -- delete -------------------------------------------------------------------------------------


def test_delete_removes_only_the_named_finished_jobs(clocked_queue: Queue) -> None:
    q = clocked_queue  # the manual clock: the failed jobs' retries never come due here
    ids = finish_one_of_each(q)
    spare = finish_one_of_each(q)  # one more job in each state, not named below
    named = [ids["completed"], ids["dead"], ids["cancelled"]]
    assert q.delete(named) == 3
    for job_id in named:
        with pytest.raises(nbqueue.JobNotFound):
            q.get(job_id)
    for name in ("pending", "running", "failed"):
        assert q.get(ids[name]).status == name
    for name, job_id in spare.items():
        assert q.get(job_id).status == name
    states = (
        "pending",
        "running",
        "failed",
        "completed",
        "dead",
        "cancelled",
        "blocked",
        "upstream_failed",
        "waiting",
    )
    assert q.counts() == dict(zip(states, (2, 2, 2, 1, 1, 1, 0, 0, 0), strict=True))


def test_delete_takes_one_id_or_a_job_and_counts_what_it_deleted(clocked_queue: Queue) -> None:
    q = clocked_queue
    ids = finish_one_of_each(q)
    assert q.delete(ids["dead"]) == 1
    assert q.delete(q.get(ids["completed"])) == 1
    assert q.delete([]) == 0
    assert sum(q.counts().values()) == 4
    with pytest.raises(nbqueue.JobNotFound):
        q.delete(ids["dead"])  # already gone


@pytest.mark.parametrize("unfinished", ["pending", "running", "failed"])
def test_delete_refuses_an_unfinished_job_and_deletes_nothing(clocked_queue: Queue, unfinished: str) -> None:
    q = clocked_queue
    ids = finish_one_of_each(q)
    before = q.counts()
    with pytest.raises(nbqueue.InvalidTransition, match=rf"job {ids[unfinished]} is {unfinished}"):
        q.delete([ids["completed"], ids[unfinished], ids["dead"]])
    assert q.counts() == before
    for name, job_id in ids.items():
        assert q.get(job_id).status == name


def test_delete_of_an_unknown_id_raises_and_deletes_nothing(clocked_queue: Queue) -> None:
    q = clocked_queue
    ids = finish_one_of_each(q)
    with pytest.raises(nbqueue.JobNotFound, match="12345"):
        q.delete([ids["completed"], 12345])
    assert q.get(ids["completed"]).status == "completed"
    assert sum(q.counts().values()) == 6


# -- ordering ---------------------------------------------------------------------------


def claim_order(q: Queue) -> list[int]:
    out = []
    while (job := q.claim()) is not None:
        out.append(job.id)
    return out


def test_higher_priority_first_then_fifo(clocked_queue: Queue) -> None:
    q = clocked_queue
    low = q.enqueue({"n": "low"}, priority=-1)
    normal = q.enqueue({"n": "normal"})
    high1 = q.enqueue({"n": "high1"}, priority=5)
    high2 = q.enqueue({"n": "high2"}, priority=5)
    normal2 = q.enqueue({"n": "normal2"})
    assert claim_order(q) == [high1.id, high2.id, normal.id, normal2.id, low.id]


def test_earlier_run_at_before_fifo(clocked_queue: Queue, clock: ManualClock) -> None:
    q = clocked_queue
    late = q.enqueue({"n": "late"}, delay=5)  # run_at t0+5
    clock.advance(1)
    early = q.enqueue({"n": "early"})  # run_at t0+1, enqueued after `late`
    explicit = q.enqueue({"n": "explicit"}, run_at=at(clock, 2))  # t0+3
    urgent = q.enqueue({"n": "urgent"}, delay=30, priority=1)
    clock.advance(60)
    assert claim_order(q) == [urgent.id, early.id, explicit.id, late.id]


def test_fifo_among_equals(clocked_queue: Queue) -> None:
    ids = [clocked_queue.enqueue({"n": i}).id for i in range(20)]
    assert claim_order(clocked_queue) == ids


# -- scheduling -------------------------------------------------------------------------


def test_delayed_job_is_not_claimed_early_with_the_real_clock(queue: Queue) -> None:
    later = queue.enqueue({"n": 1}, delay=3600)
    assert later.run_at > datetime.now(UTC) + timedelta(minutes=59)
    assert queue.claim() is None
    now = queue.enqueue({"n": 2})
    claimed = queue.claim()
    assert claimed is not None and claimed.id == now.id
    assert queue.claim() is None
    assert queue.get(later.id).status == "pending"


@pytest.mark.parametrize("tz", [UTC, timezone(timedelta(hours=5)), timezone(timedelta(hours=-8))])
def test_run_at_later_today_is_not_claimed_early(queue: Queue, tz: timezone) -> None:
    # The seed compared text timestamps of two formats: "later today" could sort before "now".
    when = (datetime.now(UTC) + timedelta(hours=1)).astimezone(tz)
    job = queue.enqueue({"n": 1}, run_at=when)
    assert abs((job.run_at - when).total_seconds()) < 0.001
    assert queue.claim() is None
    due = queue.enqueue({"n": 2}, run_at=datetime.now(tz) - timedelta(seconds=1))
    claimed = queue.claim()
    assert claimed is not None and claimed.id == due.id


def test_delay_with_manual_clock(clocked_queue: Queue, clock: ManualClock) -> None:
    q = clocked_queue
    job = q.enqueue({"n": 1}, delay=10)
    assert job.run_at == at(clock, 10)
    clock.advance(9.999)
    assert q.claim() is None
    clock.advance(0.001)
    claimed = q.claim()
    assert claimed is not None and claimed.id == job.id


def test_run_at_with_manual_clock(clocked_queue: Queue, clock: ManualClock) -> None:
    q = clocked_queue
    job = q.enqueue({"n": 1}, run_at=at(clock, 7200))
    assert job.run_at == at(clock, 7200)
    clock.advance(7199)
    assert q.claim() is None
    clock.advance(1)
    assert q.claim() is not None


@pytest.mark.parametrize("delay", [0.25, timedelta(milliseconds=250)], ids=["float", "timedelta"])
def test_sub_second_and_timedelta_delays(clocked_queue: Queue, clock: ManualClock, delay: Any) -> None:
    job = clocked_queue.enqueue({"n": 1}, delay=delay)
    assert job.run_at == at(clock, 0.25)
    clock.advance(0.2)
    assert clocked_queue.claim() is None
    clock.advance(0.05)
    assert clocked_queue.claim() is not None


@pytest.mark.parametrize("lease", [0.5, timedelta(milliseconds=500)], ids=["float", "timedelta"])
def test_sub_second_and_timedelta_lease(clocked_queue: Queue, clock: ManualClock, lease: Any) -> None:
    clocked_queue.enqueue({"n": 1})
    job = clocked_queue.claim(lease=lease)
    assert job is not None
    assert job.lease_until == at(clock, 0.5)


def test_naive_run_at_is_refused(queue: Queue) -> None:
    with pytest.raises(nbqueue.InvalidArgument, match="run_at"):
        queue.enqueue({"n": 1}, run_at=datetime.now() + timedelta(hours=1))  # naive on purpose
    assert sum(queue.counts().values()) == 0


@pytest.mark.parametrize("delay", [-1, -0.001, math.nan, math.inf, "10", timedelta(seconds=-5)], ids=repr)
def test_bad_delay_is_refused(queue: Queue, delay: Any) -> None:
    with pytest.raises(nbqueue.InvalidArgument, match="delay"):
        queue.enqueue({"n": 1}, delay=delay)
    assert sum(queue.counts().values()) == 0


def test_delay_and_run_at_together_is_refused(queue: Queue) -> None:
    with pytest.raises(nbqueue.InvalidArgument):
        queue.enqueue({"n": 1}, delay=5, run_at=datetime.now(UTC))


@pytest.mark.parametrize(
    "kwargs",
    [{"priority": 1.5}, {"max_retries": -1}, {"queue": ""}, {"key": ""}, {"queue": 5}],
    ids=repr,
)
def test_bad_enqueue_arguments_are_refused(queue: Queue, kwargs: dict[str, Any]) -> None:
    with pytest.raises(nbqueue.InvalidArgument):
        queue.enqueue({"n": 1}, **kwargs)


@pytest.mark.parametrize("lease", [0, -1, math.nan])
def test_bad_lease_is_refused(queue: Queue, lease: float) -> None:
    queue.enqueue({"n": 1})
    with pytest.raises(nbqueue.InvalidArgument):
        queue.claim(lease=lease)
    assert queue.counts()["pending"] == 1


# -- idempotency keys -------------------------------------------------------------------


def test_idempotency_key_returns_the_unfinished_job(clocked_queue: Queue, clock: ManualClock) -> None:
    q = clocked_queue
    first = q.enqueue({"n": 1}, key="fetch:u")
    same = q.enqueue({"n": 2}, key="fetch:u")
    assert same.id == first.id
    assert same.payload == {"n": 1}
    assert q.counts()["pending"] == 1

    running = q.claim()
    assert running is not None
    assert q.enqueue({"n": 3}, key="fetch:u").id == first.id  # running holds the key
    q.fail(running, "x")
    assert q.get(first.id).status == "failed"
    assert q.enqueue({"n": 4}, key="fetch:u").id == first.id  # failed holds the key
    assert sum(q.counts().values()) == 1

    clock.advance(60)
    again = q.claim()
    assert again is not None and again.id == first.id
    q.complete(again, "done")
    fresh = q.enqueue({"n": 5}, key="fetch:u")
    assert fresh.id != first.id
    assert fresh.status == "pending"
    assert fresh.payload == {"n": 5}
    assert fresh.key == "fetch:u"


def test_key_is_free_again_after_completion(queue: Queue) -> None:
    first = queue.enqueue({"n": 1}, key="k")
    job = queue.claim()
    assert job is not None
    queue.complete(job, 1)
    second = queue.enqueue({"n": 2}, key="k")
    assert second.id != first.id
    assert queue.enqueue({"n": 3}, key="k").id == second.id
    assert queue.enqueue({"n": 4}, key="other").id not in (first.id, second.id)


# -- enqueue_many -----------------------------------------------------------------------


def test_enqueue_many(queue: Queue) -> None:
    ids = queue.enqueue_many([{"n": i} for i in range(1000)], queue="bulk", priority=2)
    assert len(ids) == len(set(ids)) == 1000
    assert all(type(i) is int for i in ids)
    assert queue.counts()["pending"] == 1000
    jobs = [queue.get(i) for i in (ids[0], ids[500], ids[-1])]
    assert [j.payload for j in jobs] == [{"n": 0}, {"n": 500}, {"n": 999}]
    assert {(j.queue, j.priority) for j in jobs} == {("bulk", 2)}
    assert queue.enqueue_many([]) == []


def test_enqueue_many_is_all_or_nothing(queue: Queue) -> None:
    queue.enqueue({"before": True})
    before = queue.counts()
    payloads: list[Any] = [{"n": 0}, {"n": 1}, {"n": 2}, {"bad": {1, 2}}, {"n": 4}]
    with pytest.raises(nbqueue.PayloadError, match=r"payloads\[3\]"):
        queue.enqueue_many(payloads)
    assert queue.counts() == before


def test_enqueue_many_from_a_generator(queue: Queue) -> None:
    ids = queue.enqueue_many({"n": i} for i in range(5))
    assert [queue.get(i).payload["n"] for i in ids] == [0, 1, 2, 3, 4]


# -- payload validation -----------------------------------------------------------------


class Opaque:
    pass


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        ({1, 2}, "payload"),
        ({"x": {1, 2}}, "payload['x']"),
        ({"x": Opaque()}, "payload['x']"),
        ({"x": [1, math.nan]}, "payload['x'][1]"),
        ({"x": math.inf}, "payload['x']"),
        ({"outer": {1: "a"}}, "payload['outer']"),
        ({("a", "b"): 1}, "payload"),
        (b"bytes", "payload"),
        ({"when": datetime.now(UTC)}, "payload['when']"),
    ],
    ids=["set", "nested-set", "object", "nan", "inf", "int-key", "tuple-key", "bytes", "datetime"],
)
def test_payload_error_names_the_field(queue: Queue, payload: Any, field: str) -> None:
    with pytest.raises(nbqueue.PayloadError) as info:
        queue.enqueue(payload)
    assert field in str(info.value)
    assert isinstance(info.value, nbqueue.InvalidArgument)
    assert sum(queue.counts().values()) == 0


def test_task_argument_errors_name_the_argument(queue: Queue) -> None:
    @queue.task
    def work(a: Any, b: Any = None, **kw: Any) -> None:
        pass

    with pytest.raises(nbqueue.PayloadError, match=r"args\[0\]"):
        work.enqueue({1, 2})
    with pytest.raises(nbqueue.PayloadError, match=r"args\[1\]"):
        work.enqueue(1, Opaque())
    with pytest.raises(nbqueue.PayloadError, match=r"kwargs\['x'\]"):
        work.enqueue(1, x=math.nan)
    with pytest.raises(nbqueue.PayloadError, match=r"kwargs\['b'\]"):
        work.schedule(args=(1,), kwargs={"b": {"deep": {3}}})
    assert sum(queue.counts().values()) == 0


def test_json_values_round_trip(queue: Queue) -> None:
    payload = {"s": "é ☃", "i": 2**53, "f": 0.1, "b": False, "none": None, "l": [1, [2, {"x": []}]]}
    assert queue.get(queue.enqueue(payload).id).payload == payload


def test_payload_just_over_the_size_limit_is_refused_and_just_under_is_kept(queue: Queue) -> None:
    queue.enqueue({"n": "already there"})
    before = queue.counts()
    data = "x" * (MAX_BYTES - 5)  # built once: ["..."] is MAX_BYTES - 1 bytes of JSON
    over: list[Any] = [data, 0]  # ["...",0] is MAX_BYTES + 1
    with pytest.raises(nbqueue.PayloadError, match="payload is") as info:
        queue.enqueue(over)
    assert f"{MAX_BYTES + 1:,} bytes" in str(info.value)
    with pytest.raises(nbqueue.PayloadError, match=r"payloads\[1\]"):
        queue.enqueue_many([{"n": "fine"}, over])
    assert queue.counts() == before  # nothing written by either
    job = queue.enqueue([data])
    assert queue.counts()["pending"] == before["pending"] + 1
    stored = queue.get(job.id).payload
    assert len(stored) == 1 and len(stored[0]) == len(data) and stored[0] == data


# -- errors ------------------------------------------------------------------------------


def test_unknown_job_id(queue: Queue) -> None:
    with pytest.raises(nbqueue.JobNotFound):
        queue.get(12345)
    with pytest.raises(nbqueue.JobNotFound):
        queue.cancel(12345)
    with pytest.raises(nbqueue.JobNotFound):
        queue.requeue([12345])


def test_job_ids_must_be_ints(queue: Queue) -> None:
    with pytest.raises(nbqueue.InvalidArgument):
        queue.get("1")  # type: ignore[arg-type]


ERRORS = [
    nbqueue.InvalidArgument,
    nbqueue.PayloadError,
    nbqueue.JobNotFound,
    nbqueue.TaskNotFound,
    nbqueue.InvalidTransition,
    nbqueue.LeaseLost,
    nbqueue.JobFailed,
    nbqueue.WaitTimeout,
    nbqueue.StorageError,
    nbqueue.NotAQueueDatabase,
    nbqueue.SchemaTooNew,
    nbqueue.ReadOnlyDatabase,
    nbqueue.DatabaseFull,
    nbqueue.MissingDependency,
]


@pytest.mark.parametrize("error", ERRORS, ids=lambda e: e.__name__)
def test_every_error_is_an_nbqueue_error(error: type[Exception]) -> None:
    assert issubclass(error, nbqueue.NbqueueError)


def test_errors_are_catchable_as_builtins_too() -> None:
    assert issubclass(nbqueue.InvalidArgument, ValueError)
    assert issubclass(nbqueue.JobNotFound, LookupError)
    assert issubclass(nbqueue.WaitTimeout, TimeoutError)


# -- Job objects ------------------------------------------------------------------------


def test_refresh_rereads_in_place(queue: Queue) -> None:
    job = queue.enqueue({"n": 1})
    claimed = queue.claim()
    assert claimed is not None
    queue.complete(claimed, {"v": 1})
    assert job.status == "pending"
    assert job.refresh() is job
    assert job.status == "completed"
    assert job.value == {"v": 1}


def test_result_returns_the_value(queue: Queue) -> None:
    job = queue.enqueue({"n": 1})
    queue.complete(queue.claim(), [1, "two"])  # type: ignore[arg-type]
    assert job.result(timeout=5) == [1, "two"]
    assert job.status == "completed"  # the waited-for state is copied into the job


def test_result_raises_job_failed_when_dead(queue: Queue) -> None:
    job = queue.enqueue({"n": 1}, max_retries=0)
    run_and_fail(queue, job.id, "it broke for good")
    with pytest.raises(nbqueue.JobFailed, match="it broke for good") as info:
        job.result(timeout=5)
    assert info.value.job is not None and info.value.job.status == "dead"  # type: ignore[attr-defined]


def test_result_raises_job_failed_when_cancelled(queue: Queue) -> None:
    job = queue.enqueue({"n": 1})
    queue.cancel(job.id)
    with pytest.raises(nbqueue.JobFailed):
        job.result(timeout=5)


def test_result_times_out(queue: Queue) -> None:
    job = queue.enqueue({"n": 1})
    with pytest.raises(nbqueue.WaitTimeout) as info:
        job.result(timeout=0.2)
    assert isinstance(info.value, nbqueue.NbqueueError)
    assert queue.get(job.id).status == "pending"


def test_timestamps_are_aware_utc_and_ids_are_ints(queue: Queue) -> None:
    before = datetime.now(UTC) - timedelta(seconds=1)
    job = queue.enqueue({"n": 1})
    claimed = queue.claim()
    assert claimed is not None
    done = queue.complete(claimed, 1)
    assert type(job.id) is int
    for stamp in (done.run_at, done.created_at, done.updated_at, done.started_at, done.finished_at):
        assert isinstance(stamp, datetime)
        assert stamp.tzinfo is not None
        assert stamp.utcoffset() == timedelta(0)
        assert before <= stamp <= datetime.now(UTC) + timedelta(seconds=1)
    assert isinstance(queue.now(), datetime) and queue.now().utcoffset() == timedelta(0)


def test_manual_clock_drives_every_timestamp(clocked_queue: Queue, clock: ManualClock) -> None:
    job = clocked_queue.enqueue({"n": 1})
    assert job.created_at == job.updated_at == job.run_at == at(clock)
    clock.advance(timedelta(minutes=3))
    claimed = clocked_queue.claim(lease=60)
    assert claimed is not None
    assert claimed.started_at == at(clock)
    assert claimed.lease_until == at(clock, 60)
    assert clocked_queue.now() == at(clock)


def test_release_stamps_the_queue_clock(clocked_queue: Queue, clock: ManualClock) -> None:
    q = clocked_queue
    job = q.enqueue({"n": 1})
    claimed = q.claim(lease=60)
    assert claimed is not None
    clock.advance(100)
    assert q.release(claimed) is True
    released = q.get(job.id)
    assert released.status == "pending"
    assert released.updated_at == at(clock)  # the manual clock's time, not the wall clock's


@pytest.mark.parametrize("state", ["pending", "running", "failed"])
def test_cancel_stamps_the_queue_clock(clocked_queue: Queue, clock: ManualClock, state: str) -> None:
    q = clocked_queue
    job = q.enqueue({"n": 1})
    if state != "pending":
        claimed = q.claim(lease=60)
        assert claimed is not None
        if state == "failed":
            assert q.fail(claimed, "x") == "retry"
    assert q.get(job.id).status == state
    clock.advance(100)
    cancelled = q.cancel(job.id)
    assert cancelled.status == "cancelled"
    assert cancelled.updated_at == at(clock)
    assert cancelled.finished_at == at(clock)
    stored = q.get(job.id)
    assert (stored.updated_at, stored.finished_at) == (at(clock), at(clock))


def test_pending_jobs_counted_per_task_in_one_query(queue: Queue) -> None:
    """What `nbqueue stats` and a starting worker say waits for which task, by queue."""

    @queue.task(name="app.download")
    def download(n: int) -> int:
        return n

    for n in range(3):
        download.schedule((n,), queue="a")
    download.schedule((9,), queue="b")
    queue.enqueue({"raw": 1}, queue="a")
    running = queue.enqueue({"raw": 2}, queue="a", priority=10)
    assert (claimed := queue.claim(lease=60)) is not None and claimed.id == running.id
    assert queue.manager.pending_per_task() == {"app.download": 4, None: 1}
    assert queue.manager.pending_per_task(["b"]) == {"app.download": 1}
    assert queue.manager.pending_per_task(["nowhere"]) == {}
