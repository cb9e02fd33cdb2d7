"""Jobs that wait without holding a worker, on both backends: nbqueue.wait_for, sleep,
wait_for_jobs and q.send (the contract: docs "Jobs that wait without holding a worker").

Real worker threads, real SQLite files and the real PostgreSQL server; the processes (two
workers, a SIGKILL, process mode, a queue written before waits existed) are in
tests/test_waits_processes.py.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

import nbqueue
from nbqueue import Queue, State
from tests import helpers
from tests.helpers import QUICK, QUICK_RETRY, MakeQueue, raw_rows, status, wait_until


def until_status(q: Queue, job: nbqueue.Job | int, state: str) -> None:
    helpers.until_status(q, job, state, timeout=10.0)  # each resumption here is quick


def open_wait_name(q: Queue, job: nbqueue.Job) -> str | None:
    """The name of the wait a waiting job is in (None unless it waits)."""
    for found, wait, _ in q.waiting_rows():
        if found.id == job.id:
            return None if wait is None else str(wait.name)
    return None


def outcomes(q: Queue, job: nbqueue.Job) -> list[str]:
    return list(q.attempts(job)["outcome"])


# -- no wake-up is lost --------------------------------------------------------------------------


def test_a_value_sent_while_pending_is_returned_at_once(queue: Queue) -> None:
    @queue.task(name="w.pending_send")
    def ask() -> Any:
        return nbqueue.wait_for("answer", prompt="what?")

    job = ask.enqueue()
    assert queue.send(job, "answer", {"n": 42}, by="ada") is False  # kept for its wait
    with queue.worker(**QUICK):
        assert job.result(timeout=10) == {"n": 42}
    assert outcomes(queue, job) == ["completed"]  # one run: it never suspended
    [row] = queue.waits(job)
    assert (row.name, row.kind, row.value, row.sent_by) == ("answer", "event", '{"n":42}', "ada")
    assert row.sent_at is not None and row.reached_at is not None


def test_a_value_sent_while_running_just_before_the_wait_is_not_lost(queue: Queue) -> None:
    running, go = threading.Event(), threading.Event()

    @queue.task(name="w.running_send")
    def ask() -> Any:
        running.set()
        assert go.wait(10)
        return nbqueue.wait_for("answer")

    job = ask.enqueue()
    with queue.worker(**QUICK):
        assert running.wait(10)
        assert status(queue, job) == "running"
        assert queue.send(job, "answer", "early") is False  # kept: the job has not reached its wait
        go.set()
        assert job.result(timeout=10) == "early"
    assert outcomes(queue, job) == ["completed"]


def test_a_send_racing_the_suspension_wakes_the_job_either_way(queue: Queue) -> None:
    """Sends fired from another thread the moment each job reaches (or is about to reach) its
    wait: whichever commits first, every job completes with its value, none stays waiting."""
    reached: list[int] = []
    lock = threading.Lock()

    @queue.task(name="w.race")
    def ask(n: int) -> Any:
        with lock:
            reached.append(n)
        return nbqueue.wait_for("answer")

    jobs = [ask.enqueue(n) for n in range(20)]
    sent: set[int] = set()
    with queue.worker(concurrency=4, **QUICK):
        deadline = time.monotonic() + 20
        while len(sent) < len(jobs) and time.monotonic() < deadline:
            with lock:
                ready = [n for n in reached if n not in sent]
            for n in ready:
                queue.send(jobs[n], "answer", n * 10)
                sent.add(n)
            time.sleep(0.001)
        done = queue.wait(jobs, timeout=20, progress=False)
    assert [j.value for j in done] == [n * 10 for n in range(20)]
    assert queue.counts()["waiting"] == 0


# -- what a waiting job holds: nothing -------------------------------------------------------------


def test_a_job_sleeping_three_days_holds_no_slot_lease_or_limit_unit(
    clocked_queue: Queue, clock: nbqueue.ManualClock
) -> None:
    q = clocked_queue
    q.limit("k", concurrency=1)
    calls: Counter[str] = Counter()

    @q.task(name="w.sleeper", limits=["k"])
    def sleeper() -> str:
        calls["sleeper"] += 1
        nbqueue.sleep("three-days", timedelta(days=3))
        return "awake"

    @q.task(name="w.other", limits=["k"])
    def other(n: int) -> int:
        return n

    first = sleeper.enqueue()
    with q.worker(concurrency=1, lease=30, **QUICK):  # one slot: the sleeper must not keep it
        until_status(q, first, "waiting")
        job = q.get(first.id)
        assert job.lease_until is None  # its lease released (worker_id stays, as a record of the run)
        assert job.waits_for is not None and job.waits_for.startswith("sleep three-days, wakes in 3 d")
        assert q.limits().set_index("key").loc["k", "in_flight"] == 0
        assert q.counts()["running"] == 0
        seconds = [other.enqueue(n) for n in range(3)]
        assert [j.value for j in q.wait(seconds, timeout=10, progress=False)] == [0, 1, 2]
        assert status(q, first) == "waiting"  # the others ran; it still sleeps
        clock.advance(timedelta(days=3, seconds=-10))
        time.sleep(0.7)  # longer than the keeper's wake chore and an idle worker's look
        assert status(q, first) == "waiting"  # not yet: 10 s to go
        clock.advance(11)
        assert first.result(timeout=10) == "awake"
    assert calls["sleeper"] == 2
    assert outcomes(q, first) == ["suspended", "completed"]


def test_sleep_until_wakes_at_its_time_and_later_runs_return_at_once(
    clocked_queue: Queue, clock: nbqueue.ManualClock
) -> None:
    q = clocked_queue
    wake = q.now() + timedelta(hours=5)
    runs: Counter[str] = Counter()

    @q.task(name="w.until")
    def later() -> str:
        runs["run"] += 1
        nbqueue.sleep_until("at-five", wake)
        runs["past the sleep"] += 1
        return "woke"

    job = later.enqueue()
    with q.worker(**QUICK):
        until_status(q, job, "waiting")
        [row] = q.waits(job)
        assert (row.name, row.kind) == ("at-five", "sleep")
        assert row.deadline is not None and abs(row.deadline - wake.timestamp() * 1e6) < 1000
        frame = q.waiting()
        assert {"id", "task", "waits_for", "prompt", "choices", "deadline", "since"} <= set(frame.columns)
        assert frame["waits_for"].iloc[0] == "sleep at-five, wakes in 5 h"
        clock.advance(timedelta(hours=4, minutes=59))
        time.sleep(0.7)
        assert status(q, job) == "waiting"
        clock.advance(61)
        assert job.result(timeout=10) == "woke"
    assert runs == Counter({"run": 2, "past the sleep": 1})


@pytest.mark.slow  # seconds on PostgreSQL: 1,000 runs, each ending in a wait
def test_a_thousand_waiting_jobs_are_never_claimable(
    make_queue: MakeQueue, backend: str, queue_target: str
) -> None:
    q = make_queue()

    @q.task(name="w.many")
    def many(n: int) -> Any:
        return nbqueue.wait_for("go")

    ids = [many.enqueue(n).id for n in range(1000)]
    with q.worker(concurrency=8, lease=30) as worker:
        worker.run_until_idle(timeout=60)
    assert q.counts()["waiting"] == 1000
    assert q.claim(lease=5) is None  # 1,000 waiting, none claimable
    free = q.enqueue({"free": True}, priority=-100)  # behind all of them by priority
    # The claim index's own predicate holds no waiting job: the claim never scans them.
    predicate = claim_index_predicate(queue_target, backend)
    assert "waiting" not in predicate
    assert count_where(queue_target, backend, predicate) == 1  # the free job only
    assert count_where(queue_target, backend, "status = 'waiting'") == 1000
    got = q.claim(lease=5)
    assert got is not None and got.id == free.id
    q.complete(got, "ok")
    assert q.send_many(ids[:3], "go", "now") == 3
    assert q.counts()["pending"] == 3


def claim_index_predicate(target: str, backend: str) -> str:
    """The WHERE of the partial index claims read (nbqueue_claim on both backends)."""
    if backend == "sqlite":
        [(sql,)] = raw_rows(target, backend, "SELECT sql FROM sqlite_master WHERE name = 'nbqueue_claim'")
        return str(sql).split(" WHERE ", 1)[1]
    [(predicate,)] = raw_rows(
        target,
        backend,
        "SELECT pg_get_expr(i.indpred, i.indrelid) FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
        "WHERE c.relname = 'nbqueue_claim' AND c.relnamespace = current_schema()::regnamespace",
    )
    return str(predicate)


def count_where(target: str, backend: str, where: str) -> int:
    [(n,)] = raw_rows(target, backend, f"SELECT count(*) FROM nbqueue_jobs WHERE {where}")
    return int(n)


def test_run_until_idle_returns_while_jobs_only_wait_and_result_keeps_waiting(queue: Queue) -> None:
    @queue.task(name="w.idle")
    def ask() -> Any:
        return nbqueue.wait_for("answer")

    job = ask.enqueue()
    worker = queue.worker(**QUICK)
    began = time.monotonic()
    worker.run_until_idle(timeout=10)
    assert time.monotonic() - began < 5
    assert status(queue, job) == "waiting"
    assert queue.claim(lease=5) is None  # never claimed while it waits
    with pytest.raises(nbqueue.WaitTimeout):
        job.result(timeout=0.3)
    with pytest.raises(nbqueue.WaitTimeout):
        queue.wait([job], timeout=0.3, progress=False)
    assert job.id in queue.manager.unfinished_ids()
    queue.send(job, "answer", 7)
    worker.run_until_idle(timeout=10)
    assert job.result(timeout=1) == 7


def test_an_idempotency_key_stays_held_while_the_job_waits(queue: Queue) -> None:
    @queue.task(name="w.keyed")
    def ask() -> Any:
        return nbqueue.wait_for("answer")

    job = ask.schedule(key="report-7")
    with queue.worker(**QUICK) as worker:
        worker.run_until_idle(timeout=10)
        assert status(queue, job) == "waiting"
        again = ask.schedule(key="report-7")
        assert again.id == job.id  # the waiting job holds the key
        assert sum(queue.counts().values()) == 1
        queue.send(job, "answer", "done")
        assert job.result(timeout=10) == "done"
    fresh = ask.schedule(key="report-7")  # finished: the key is free again
    assert fresh.id != job.id


def test_purge_never_deletes_a_waiting_job_or_a_job_one_waits_for(queue: Queue) -> None:
    gate = threading.Event()

    @queue.task(name="w.quick")
    def quick(n: int) -> int:
        return n

    @queue.task(name="w.slow")
    def slow(n: int) -> int:
        gate.wait(10)
        return n

    @queue.task(name="w.parent")
    def parent() -> list[Any]:
        return nbqueue.wait_for_jobs([quick.enqueue(1), slow.enqueue(2)])

    @queue.task(name="w.alone")
    def alone() -> Any:
        return nbqueue.wait_for("answer")

    p, a = parent.enqueue(), alone.enqueue()
    try:
        with queue.worker(concurrency=3, **QUICK):
            until_status(queue, p, "waiting")
            until_status(queue, a, "waiting")
            wait_until(lambda: queue.counts()["completed"] == 1, 10, "the quick child done")
            [done_child] = queue.jobs(status="completed")
            assert queue.purge(["completed", "dead", "cancelled"], older_than=0) == 0
            assert queue.get(done_child.id).status == "completed"  # the waiting parent needs it
            with pytest.raises(nbqueue.InvalidArgument):
                queue.purge("waiting")
            assert status(queue, p) == "waiting" and status(queue, a) == "waiting"
            gate.set()
            assert p.result(timeout=10) == [1, 2]
    finally:
        gate.set()
    assert status(queue, a) == "waiting"  # still there, still waiting


def test_a_retention_worker_keeps_waiting_jobs_and_the_jobs_they_wait_for(
    clocked_queue: Queue, clock: nbqueue.ManualClock
) -> None:
    q = clocked_queue

    @q.task(name="w.kept")
    def ask() -> Any:
        return nbqueue.wait_for("answer")

    @q.task(name="w.done")
    def done() -> str:
        return "ok"

    @q.task(name="w.later", queue="elsewhere")  # no worker serves that queue
    def later() -> str:
        return "later"

    @q.task(name="w.waits_for_two")
    def waits_for_two() -> list[Any]:
        return nbqueue.wait_for_jobs([done.enqueue(), later.enqueue()])

    waiter, finished, parent = ask.enqueue(), done.enqueue(), waits_for_two.enqueue()
    with q.worker(queues="default", retention=60, prune_interval=0.05, **QUICK) as worker:
        worker.run_until_idle(timeout=10)
        assert q.counts()["completed"] == 2 and q.counts()["waiting"] == 2
        clock.advance(timedelta(days=30))
        wait_until(lambda: q.counts()["completed"] == 1, 10, "the completed job nobody waits for pruned")
        needed, _ = q.relatives(parent)
        assert [status(q, j) for j in needed] == ["completed", "pending"]  # the done child is kept
        assert status(q, waiter) == "waiting" and status(q, parent) == "waiting"
        assert q.send(waiter, "answer", 1) is True
        assert waiter.result(timeout=10) == 1
    with pytest.raises(nbqueue.JobNotFound):
        q.get(finished.id)


# -- replay: steps once, waits once per run -----------------------------------------------------


def test_steps_before_the_wait_run_once_across_ten_suspensions(queue: Queue) -> None:
    calls: Counter[str] = Counter()

    def draft() -> str:
        calls["draft"] += 1
        return "the draft"

    @queue.task(name="w.ten", max_retries=3)
    def converse() -> list[Any]:
        text = nbqueue.step("draft", draft)
        replies = [nbqueue.wait_for(f"reply-{n}") for n in range(10)]
        return [text, replies]

    job = converse.enqueue()
    with queue.worker(**QUICK):
        for n in range(10):
            name = f"reply-{n}"
            wait_until(lambda name=name: open_wait_name(queue, job) == name, 10, f"waiting for {name}")
            assert queue.get(job.id).retries == 0
            assert queue.send(job, f"reply-{n}", n) is True
        assert job.result(timeout=10) == ["the draft", list(range(10))]
    assert calls["draft"] == 1
    assert outcomes(queue, job) == ["suspended"] * 10 + ["completed"]
    done = queue.get(job.id)
    assert done.retries == 0
    assert list(queue.steps(job)["step"]) == ["draft"]
    assert [r.name for r in queue.waits(job)] == [f"reply-{n}" for n in range(10)]


def test_a_retry_after_suspensions_keeps_the_values_and_spends_one_retry(queue: Queue) -> None:
    """A suspended run is not an attempt: three suspensions, then one failure, fit max_retries=1;
    the retry gets the recorded values at once and never waits again."""
    failures: list[int] = []

    @queue.task(name="w.retry", max_retries=1, backoff=QUICK_RETRY)
    def flaky() -> list[Any]:
        values = [nbqueue.wait_for(f"reply-{n}") for n in range(3)]
        if not failures:
            failures.append(1)
            raise ConnectionError("the API hiccuped after the answers")
        return values

    job = flaky.enqueue()
    with queue.worker(**QUICK):
        for n in range(3):
            name = f"reply-{n}"
            wait_until(lambda name=name: open_wait_name(queue, job) == name, 10, f"waiting for {name}")
            queue.send(job, name, n)
        assert job.result(timeout=10) == [0, 1, 2]
    assert outcomes(queue, job) == ["suspended"] * 3 + ["failed", "completed"]
    assert queue.get(job.id).retries == 1


def test_except_exception_does_not_swallow_the_suspension(queue: Queue) -> None:
    swallowed: list[BaseException] = []

    @queue.task(name="w.swallow", max_retries=0)
    def careless() -> Any:
        try:
            return nbqueue.wait_for("answer")
        except Exception as exc:  # what careless code writes: must not catch the suspension
            swallowed.append(exc)
            return "swallowed"

    job = careless.enqueue()
    with queue.worker(**QUICK):
        until_status(queue, job, "waiting")
        assert swallowed == []
        queue.send(job, "answer", "real")
        assert job.result(timeout=10) == "real"
    assert swallowed == []
    assert issubclass(nbqueue.Suspended, BaseException)
    assert not issubclass(nbqueue.Suspended, Exception)


def test_a_wait_named_like_a_step_or_reached_twice_in_a_run_is_refused(queue: Queue) -> None:
    @queue.task(name="w.clash", max_retries=0)
    def clash() -> Any:
        nbqueue.step("fetch", lambda: 1)
        return nbqueue.wait_for("fetch")

    @queue.task(name="w.twice", max_retries=0)
    def twice() -> Any:
        return [nbqueue.wait_for("answer"), nbqueue.wait_for("answer")]

    @queue.task(name="w.sleep_twice", max_retries=0)
    def sleep_twice() -> None:
        nbqueue.sleep("nap", 0)
        nbqueue.sleep("nap", 0)

    a, b, c = clash.enqueue(), twice.enqueue(), sleep_twice.enqueue()
    queue.send(b, "answer", 1)  # so that the first wait returns and the second is reached
    with queue.worker(**QUICK):
        for job in (a, b, c):
            with pytest.raises(nbqueue.JobFailed):
                job.result(timeout=10)
    assert "a wait needs a name of its own" in (queue.get(a.id).error or "")
    assert "InvalidArgument" in (queue.get(a.id).error or "")
    assert "twice in one run" in (queue.get(b.id).error or "")
    assert "twice in one run" in (queue.get(c.id).error or "")
    for job in (a, b, c):
        assert queue.get(job.id).status == "dead"


def test_the_per_run_timeout_never_counts_waiting_time(queue: Queue) -> None:
    @queue.task(name="w.timed", timeout=0.5, max_retries=0)
    def timed() -> Any:
        return nbqueue.wait_for("answer")

    job = timed.enqueue()
    with queue.worker(lease=5, **QUICK):
        until_status(queue, job, "waiting")
        time.sleep(0.8)  # longer than the job's timeout
        assert status(queue, job) == "waiting"
        queue.send(job, "answer", "late but fine")
        assert job.result(timeout=10) == "late but fine"
    assert outcomes(queue, job) == ["suspended", "completed"]


def test_an_async_handler_waits_and_resumes(queue: Queue) -> None:
    calls: Counter[str] = Counter()

    async def fetch() -> str:
        await asyncio.sleep(0.01)
        calls["fetch"] += 1
        return "page"

    @queue.task(name="w.async")
    async def agent() -> list[Any]:
        page = await nbqueue.step("fetch", fetch)
        answer = nbqueue.wait_for("answer", choices=["yes", "no"])  # a plain call: nothing to await
        nbqueue.sleep("nap", 0)
        return [page, answer]

    job = agent.enqueue()
    with queue.worker(**QUICK):
        until_status(queue, job, "waiting")
        assert queue.send(job, "answer", "yes") is True
        assert job.result(timeout=10) == ["page", "yes"]
    assert calls["fetch"] == 1
    assert outcomes(queue, job) == ["suspended", "completed"]


# -- deadlines --------------------------------------------------------------------------------


def test_a_deadline_with_a_default_returns_the_default(
    clocked_queue: Queue, clock: nbqueue.ManualClock
) -> None:
    q = clocked_queue

    @q.task(name="w.default")
    def ask() -> Any:
        return {"got": nbqueue.wait_for("answer", timeout=timedelta(hours=1), default=None)}

    job = ask.enqueue()
    with q.worker(**QUICK):
        until_status(q, job, "waiting")
        [row] = q.waits(job)
        assert row.deadline is not None and row.reached_at is not None
        assert row.deadline - row.reached_at == 3600 * 10**6
        clock.advance(3601)
        assert job.result(timeout=10) == {"got": None}
    [row] = q.waits(job)
    assert row.expired_at is not None and row.value is None
    assert outcomes(q, job) == ["suspended", "completed"]


def test_a_deadline_without_default_is_dead_at_once_recorded_and_forgotten_on_requeue(
    clocked_queue: Queue, clock: nbqueue.ManualClock
) -> None:
    q = clocked_queue
    runs: Counter[str] = Counter()

    @q.task(name="w.expires", max_retries=3, backoff=QUICK_RETRY)
    def ask() -> Any:
        runs["run"] += 1
        return nbqueue.wait_for("answer", timeout=60)

    job = ask.enqueue()
    with q.worker(**QUICK):
        until_status(q, job, "waiting")
        clock.advance(61)
        until_status(q, job, "dead")
        dead = q.get(job.id)
        assert "WaitExpired" in (dead.error or "")
        assert dead.retries == 0 or dead.attempts == 2  # no retry was spent on it
        assert runs["run"] == 2
        assert outcomes(q, job) == ["suspended", "dead"]
        [row] = q.waits(job)
        assert row.expired_at is not None and row.value is None
        with pytest.raises(nbqueue.InvalidTransition):
            q.send(job, "answer", "too late")  # the job is finished
        time.sleep(0.3)
        assert runs["run"] == 2  # no retry ran
        # A fresh start forgets the expiry: the wait is reached anew, with a new deadline.
        assert q.requeue(job) == 1
        until_status(q, job, "waiting")
        [row] = q.waits(job)
        assert row.expired_at is None
        assert row.deadline is not None and row.deadline > q.manager.now_us()
        assert q.send(job, "answer", "in time") is True
        assert job.result(timeout=10) == "in time"
    assert runs["run"] == 4


def test_an_expiry_is_recorded_and_a_send_after_it_is_refused(
    clocked_queue: Queue, clock: nbqueue.ManualClock
) -> None:
    """Caught in the handler, the expiry lets the job go on waiting for something else; the
    expired wait keeps its expiry (every later run sees the same) and refuses sends."""
    q = clocked_queue
    seen: list[str] = []

    @q.task(name="w.caught", max_retries=3)
    def ask() -> Any:
        try:
            first = nbqueue.wait_for("quick", timeout=10)
        except nbqueue.WaitExpired:
            first = "expired"
        seen.append(first)
        return [first, nbqueue.wait_for("second")]

    job = ask.enqueue()
    with q.worker(**QUICK):
        until_status(q, job, "waiting")
        clock.advance(11)
        wait_until(lambda: open_wait_name(q, job) == "second", 10, "waiting for the second")
        quick = next(r for r in q.waits(job) if r.name == "quick")
        assert quick.expired_at is not None
        with pytest.raises(nbqueue.InvalidArgument, match="expired"):
            q.send(job, "quick", "too late")
        assert q.send(job, "second", 2) is True
        assert job.result(timeout=10) == ["expired", 2]
    assert seen == ["expired", "expired"]  # the later run saw the recorded expiry
    assert q.get(job.id).retries == 0


# -- sends: who may send what ---------------------------------------------------------------------


def test_sends_to_finished_or_unknown_jobs_and_second_sends_are_refused(queue: Queue) -> None:
    @queue.task(name="w.sends")
    def ask() -> Any:
        return nbqueue.wait_for("answer")

    job = ask.enqueue()
    assert queue.send(job.id, "answer", 1) is False
    with pytest.raises(nbqueue.InvalidArgument, match="already"):
        queue.send(job, "answer", 2)
    with pytest.raises(nbqueue.JobNotFound):
        queue.send(10**9, "answer", 1)
    with queue.worker(**QUICK):
        assert job.result(timeout=10) == 1
    with pytest.raises(nbqueue.InvalidTransition):
        queue.send(job, "other", 1)
    cancelled = ask.enqueue()
    queue.cancel(cancelled)
    with pytest.raises(nbqueue.InvalidTransition):
        queue.send(cancelled, "answer", 1)
    # send_many is all or nothing: one refused job, nothing recorded for the others
    a, b = ask.enqueue(), ask.enqueue()
    with pytest.raises(nbqueue.InvalidTransition):
        queue.send_many([a, b, job], "answer", "x")
    assert [r.value for r in queue.waits(a) + queue.waits(b)] == []


def test_choices_are_enforced_on_a_waiting_job(queue: Queue) -> None:
    @queue.task(name="w.choices")
    def ask() -> Any:
        return nbqueue.wait_for("review", prompt="Publish?", choices=["approve", "reject"])

    job = ask.enqueue()
    with queue.worker(**QUICK):
        until_status(queue, job, "waiting")
        with pytest.raises(nbqueue.InvalidArgument, match="approve"):
            queue.send(job, "review", "maybe")
        assert status(queue, job) == "waiting"
        [row] = queue.waits(job)
        assert row.value is None and row.choices is not None
        frame = queue.waiting()
        assert list(frame["id"]) == [job.id]
        assert frame["prompt"].iloc[0] == "Publish?" and frame["kind"].iloc[0] == "event"
        assert queue.get(job.id).waits_for == 'review: a person is asked \'Publish?\' ("approve" or "reject")'
        assert queue.send(job, "review", "reject") is True
        assert job.result(timeout=10) == "reject"


def test_a_value_sent_ahead_outside_the_choices_is_dropped_and_may_be_sent_again(queue: Queue) -> None:
    @queue.task(name="w.ahead")
    def ask() -> Any:
        return nbqueue.wait_for("review", choices=["approve", "reject"])

    job = ask.enqueue()
    assert queue.send(job, "review", "maybe") is False  # its choices are not known yet
    with queue.worker(**QUICK):
        until_status(queue, job, "waiting")
        [row] = queue.waits(job)
        assert row.value is None and row.sent_by is None  # dropped when the wait read it
        with pytest.raises(nbqueue.InvalidArgument):
            queue.send(job, "review", "maybe")  # now its choices are known
        assert queue.send(job, "review", "approve") is True
        assert job.result(timeout=10) == "approve"


# -- wait_for_jobs ---------------------------------------------------------------------------------


def test_wait_for_jobs_gives_results_in_order_and_makes_children_once(
    queue: Queue, gate: threading.Event
) -> None:
    runs: Counter[str] = Counter()

    @queue.task(name="w.double")
    def double(n: int) -> int:
        assert gate.wait(10)  # the children finish only once the parent waits for them
        return n * 2

    @queue.task(name="w.fan_out")
    def fan_out() -> list[Any]:
        runs["parent"] += 1
        kids = [double.enqueue(n) for n in (3, 1, 2)]
        results = nbqueue.wait_for_jobs(kids)
        more = nbqueue.wait_for("more")  # one more suspension: the children are still made once
        return [results, more]

    job = fan_out.enqueue()
    with queue.worker(concurrency=4, **QUICK):
        wait_until(lambda: (open_wait_name(queue, job) or "").startswith("jobs:"), 10, "waiting for jobs")
        gate.set()
        wait_until(lambda: open_wait_name(queue, job) == "more", 10, "waiting for more")
        assert queue.send(job, "more", "yes") is True
        assert job.result(timeout=10) == [[6, 2, 4], "yes"]
    assert runs["parent"] == 3  # the first run, after the children, after "more"
    assert sum(queue.counts().values()) == 4  # the parent and its three children, made once
    parents, _ = queue.relatives(job)  # the jobs it waited for are linked as its parents
    assert len(parents) == 3 and all(status(queue, p) == "completed" for p in parents)


def test_a_dead_child_fails_the_waiter_and_its_requeue_rearms_it(queue: Queue, tmp_path: Path) -> None:
    fixed = tmp_path / "fixed"

    @queue.task(name="w.flaky", max_retries=0)
    def flaky(n: int) -> int:
        if not fixed.exists():
            raise ValueError("not fixed yet")
        return n

    @queue.task(name="w.ok")
    def ok(n: int) -> int:
        return n

    @queue.task(name="w.waiter")
    def waiter() -> list[Any]:
        return nbqueue.wait_for_jobs([ok.enqueue(1), flaky.enqueue(2)])

    job = waiter.enqueue()
    with queue.worker(concurrency=2, **QUICK):
        until_status(queue, job, "upstream_failed")
    failed = queue.get(job.id)
    [dead_child] = queue.jobs(status="dead")
    assert failed.root_cause == dead_child.id
    fixed.touch()
    assert queue.requeue(dead_child) == 1  # (no worker runs: the re-armed state stays to be seen)
    rearmed = queue.get(job.id)
    assert rearmed.status in ("waiting", "blocked") and rearmed.root_cause is None
    with queue.worker(concurrency=2, **QUICK):
        until_status(queue, dead_child, "completed")
        try:
            value = job.result(timeout=5)
        except nbqueue.WaitTimeout:
            stuck = queue.get(job.id)
            pytest.fail(f"the re-armed waiter never ran again: {stuck.status}, due at {stuck.run_at}")
        assert value == [1, 2]
    assert sum(queue.counts().values()) == 3  # no child made twice


def test_all_done_gives_an_outcome_for_the_failed_job(queue: Queue) -> None:
    @queue.task(name="w.boom", max_retries=0)
    def boom() -> None:
        raise RuntimeError("kaboom")

    @queue.task(name="w.fine")
    def fine() -> str:
        return "fine"

    @queue.task(name="w.gather")
    def gather() -> list[Any]:
        results = nbqueue.wait_for_jobs([fine.enqueue(), boom.enqueue()], when="all_done")
        good, bad = results
        assert isinstance(bad, nbqueue.Outcome) and not bad.ok
        return [good, bad.ok, "kaboom" in str(bad.error)]

    job = gather.enqueue()
    with queue.worker(concurrency=2, **QUICK):
        assert job.result(timeout=10) == ["fine", False, True]


def test_waiting_for_a_job_already_dead_fails_at_once_or_gives_its_outcome(queue: Queue) -> None:
    @queue.task(name="w.dies", max_retries=0)
    def dies() -> None:
        raise ValueError("broken")

    @queue.task(name="w.strict")
    def strict(ids: list[int]) -> list[Any]:
        return nbqueue.wait_for_jobs(ids)

    @queue.task(name="w.lenient")
    def lenient(ids: list[int]) -> list[Any]:
        return [o.ok if isinstance(o, nbqueue.Outcome) else o for o in nbqueue.wait_for_jobs(ids, "all_done")]

    dead = dies.enqueue()
    with queue.worker(**QUICK) as worker:
        worker.run_until_idle(timeout=10)
        assert status(queue, dead) == "dead"
        a, b = strict.enqueue([dead.id]), lenient.enqueue([dead.id])
        assert b.result(timeout=10) == [False]  # no suspension: its job was done already
        until_status(queue, a, "upstream_failed")
    assert queue.get(a.id).root_cause == dead.id
    assert outcomes(queue, b) == ["completed"]


def test_cancelling_a_waiting_job_cancels_it_and_its_unfinished_children(queue: Queue) -> None:
    @queue.task(name="w.never", queue="elsewhere")  # no worker serves that queue
    def never() -> None:
        pass

    @queue.task(name="w.cancel_me")
    def parent() -> Any:
        return nbqueue.wait_for_jobs([never.enqueue()])

    @queue.task(name="w.sleepy")
    def sleepy() -> None:
        nbqueue.sleep("long", timedelta(days=1))

    job, napper = parent.enqueue(), sleepy.enqueue()
    with queue.worker(queues="default", **QUICK):
        until_status(queue, job, "waiting")
        until_status(queue, napper, "waiting")
        [child] = queue.jobs(queue="elsewhere")
        assert child.status == "pending"
        with pytest.raises(nbqueue.InvalidArgument, match="sleep"):
            queue.send(napper, "long", "wake up")  # a sleep takes no value
        assert queue.cancel(job).status == "cancelled"
        assert queue.cancel(napper).status == "cancelled"
        with pytest.raises(nbqueue.InvalidTransition):
            queue.send(napper, "anything", 1)
        assert status(queue, child) == "cancelled"  # made by the waiting job, unfinished
        with pytest.raises(nbqueue.JobFailed):
            job.result(timeout=1)
    assert queue.counts()["waiting"] == 0


def test_send_many_answers_many_in_one_call(queue: Queue) -> None:
    @queue.task(name="w.bulk")
    def ask(n: int) -> Any:
        return [n, nbqueue.wait_for("review", choices=["approve", "reject"])]

    jobs = [ask.enqueue(n) for n in range(5)]
    with queue.worker(concurrency=2, **QUICK):
        wait_until(lambda: queue.counts()["waiting"] == 5, 10, "all five waiting")
        assert len(queue.waiting()) == 5
        with pytest.raises(nbqueue.InvalidArgument):
            queue.send_many(jobs, "review", "maybe")  # none: all or nothing
        assert queue.counts()["waiting"] == 5
        assert queue.send_many(jobs, "review", "approve", by="bot") == 5
        assert [j.value for j in queue.wait(jobs, timeout=10, progress=False)] == [
            [n, "approve"] for n in range(5)
        ]
    assert {queue.waits(j)[0].sent_by for j in jobs} == {"bot"}


def test_send_many_wakes_only_the_jobs_waiting_for_that_name(queue: Queue) -> None:
    runs: Counter[str] = Counter()

    @queue.task(name="w.named")
    def ask(name: str) -> Any:
        runs[name] += 1
        return nbqueue.wait_for(name) if name == "x" else [nbqueue.wait_for(name), nbqueue.wait_for("x")]

    on_x, on_y = ask.enqueue("x"), ask.enqueue("y")
    with queue.worker(**QUICK):
        wait_until(lambda: queue.counts()["waiting"] == 2, 10, "both waiting")
        later = ask.enqueue("x")  # pending (or just claimed): the value is kept for its wait
        assert queue.send_many([later, on_y, on_x], "x", 7) in (1, 2)
        assert on_x.result(timeout=10) == 7 and later.result(timeout=10) == 7
        assert status(queue, on_y) == "waiting" and open_wait_name(queue, on_y) == "y"  # not woken
        assert queue.send(on_y, "y", 8) is True
        assert on_y.result(timeout=10) == [8, 7]  # the value sent ahead under "x" was kept
    assert runs["y"] == 2  # suspended once, woken once: by its own wait's value, not by "x"


# -- jobs claimed together: their waits read once, written together --------------------------------


def test_a_value_sent_to_a_job_claimed_in_the_same_batch_after_its_waits_were_read_is_not_lost(
    queue: Queue,
) -> None:
    """A relay: each job sends the baton to the next while the next is claimed in the same batch,
    often after the batch's waits were read. A job that read no value suspends, and the
    suspension, finding the value, makes it pending again: every job gets its baton."""
    ids: list[int] = []

    @queue.task(name="w.relay")
    def relay(n: int) -> int:
        got = 0 if n == 0 else nbqueue.wait_for("baton")
        if n + 1 < len(ids):
            queue.send(ids[n + 1], "baton", n + 1)
        return int(got)

    ids.extend(job.id for job in relay.map(range(60)))
    with queue.worker(concurrency=1, **QUICK):
        done = queue.wait(ids, timeout=30, progress=False)
    assert [j.value for j in done] == list(range(60))
    assert queue.counts()["waiting"] == 0


def test_a_batch_of_a_waiting_task_s_jobs_reads_their_waits_with_its_claim(
    queue: Queue, backend: str
) -> None:
    """Once a task's job has reached a wait in this process, a worker's batch of its jobs reads
    their waits in the transaction that claims them (SQLite: a read of its own after the commit
    costs three times as much; PostgreSQL reads when the first needs them, a round trip either
    way). What they read is the same: values sent ahead are returned at once, in one run."""
    runs: Counter[int] = Counter()

    @queue.task(name="w.claimed_with_waits")
    def ask(n: int) -> Any:
        runs[n] += 1
        return [n, nbqueue.wait_for("go")]

    storage = queue.manager.storage
    read_alone, peeked = Counter[int](), Counter[bool]()
    peek_waits, finish_batch = storage.peek_waits, storage.finish_batch

    def counted_read(job_ids: Any) -> Any:  # the real read, counted by how many jobs it reads
        read_alone[len(job_ids)] += 1
        return peek_waits(job_ids)

    def counted_batch(*args: Any) -> Any:  # the real batch, counted by whether it read the waits
        written = finish_batch(*args)
        peeked[written[3] is not None] += 1
        return written

    first = ask.enqueue(-1)
    worker = queue.worker(concurrency=1, **QUICK)  # started by each run_until_idle, then stopped
    worker.run_until_idle(timeout=10)  # the task reaches a wait: this process now knows it waits
    assert status(queue, first) == "waiting"
    jobs = ask.map(range(40))
    assert queue.send_many(jobs[::2], "go", "ahead") == 0  # kept: they are pending
    storage.peek_waits, storage.finish_batch = counted_read, counted_batch  # type: ignore[method-assign]
    worker.run_until_idle(timeout=10)
    assert [runs[n] for n in range(40)] == [1] * 40  # the values sent ahead: no job ran twice
    assert [status(queue, job) for job in jobs] == ["completed", "waiting"] * 20
    assert [job.result(timeout=0) for job in jobs[::2]] == [[n, "ahead"] for n in range(0, 40, 2)]
    many = sum(count for size, count in read_alone.items() if size > 1)
    if backend == "sqlite":
        assert peeked[True] >= 1 and many == 0  # each batch of several read them with its claim
    else:
        assert peeked[True] == 0 and many >= 1


def test_jobs_claimed_together_record_each_their_own_wait(queue: Queue) -> None:
    """Sixty jobs claimed in batches reach waits of three names, half with a deadline: each row
    is its job's (prompt, deadline), and each job resumes with its own value."""

    @queue.task(name="w.mixed")
    def ask(n: int) -> Any:
        timeout = timedelta(days=1) if n % 2 else None
        return [n, nbqueue.wait_for(f"q{n % 3}", timeout=timeout, prompt=f"job {n}?")]

    jobs = ask.map(range(60))
    with queue.worker(concurrency=1, **QUICK) as worker:
        worker.run_until_idle()
        assert queue.counts()["waiting"] == 60
        for n, job in enumerate(jobs):
            [row] = queue.waits(job)
            assert (row.name, row.kind, row.prompt) == (f"q{n % 3}", "event", f"job {n}?")
            assert (row.deadline is not None) == bool(n % 2)
        for n, job in enumerate(jobs):
            assert queue.send(job, f"q{n % 3}", n * 2) is True
        done = queue.wait(jobs, timeout=20, progress=False)
    assert [j.value for j in done] == [[n, n * 2] for n in range(60)]


def test_a_wait_named_like_a_step_of_the_same_run_is_refused_in_a_batch(queue: Queue) -> None:
    @queue.task(name="w.clash_batch", max_retries=0)
    def clash(n: int) -> Any:
        nbqueue.step("fetch", lambda: n)
        return nbqueue.wait_for("fetch")

    jobs = clash.map(range(30))
    with queue.worker(concurrency=1, **QUICK) as worker:
        worker.run_until_idle()
    for job in jobs:
        found = queue.get(job.id)
        assert found.status == "dead" and "a wait needs a name of its own" in (found.error or "")


def test_outside_a_job_the_waits_are_plain_or_refused() -> None:
    with pytest.raises(nbqueue.NbqueueError, match="inside a job"):
        nbqueue.wait_for("x")
    began = time.monotonic()
    nbqueue.sleep("nap", 0.05)
    assert time.monotonic() - began >= 0.05
    with pytest.raises(nbqueue.InvalidArgument):
        nbqueue.wait_for("x", choices=[])  # checked before anything else


def test_states_are_what_the_contract_says() -> None:
    assert State.WAITING.value == "waiting"
    assert State.WAITING not in nbqueue.jobs.FINISHED


def test_replay_from_a_step_forgets_the_waits_and_children_after_it(queue: Queue) -> None:
    """q.replay(job, from_step=) forgets the waits, sleeps and children recorded after that step:
    the replayed run waits again and makes its children afresh; those before it are kept."""
    made: Counter[str] = Counter()

    @queue.task(name="w.child")
    def child(tag: str) -> str:
        made[tag] += 1
        return tag

    @queue.task(name="w.replayed")
    def replayed() -> list[Any]:
        first = nbqueue.wait_for_jobs([child.enqueue("before")])
        nbqueue.step("middle", lambda: "m")
        answer = nbqueue.wait_for("go")
        second = nbqueue.wait_for_jobs([child.enqueue("after")])
        return [first, answer, second]

    job = replayed.enqueue()
    with queue.worker(concurrency=2, **QUICK):
        until_status(queue, job, "waiting")
        wait_until(lambda: open_wait_name(queue, job) == "go", 10, "waiting for go")
        queue.send(job, "go", 1)
        assert job.result(timeout=10) == [["before"], 1, ["after"]]
        queue.replay(job, from_step="middle")
        wait_until(lambda: open_wait_name(queue, job) == "go", 10, "waiting for go again")
        queue.send(job, "go", 2)
        assert job.result(timeout=10) == [["before"], 2, ["after"]]
    assert made == {"before": 1, "after": 2}  # the child after the step was made afresh
