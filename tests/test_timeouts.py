"""Timeouts in the thread worker: a timed-out job is failed and retried by its rules, and whatever
the stuck handler returns later is refused by its lease.

Real worker threads, real files and the real PostgreSQL server.
"""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path

import pytest

import nbqueue
from nbqueue import Backoff, Queue
from tests.helpers import QUICK_RETRY, wait_until


@pytest.mark.slow  # real seconds: a timeout fires
def test_thread_timeout_fails_retries_keeps_capacity_and_refuses_the_late_result(
    queue: Queue, gate: threading.Event
) -> None:
    returned: list[str] = []
    deaths: list[nbqueue.Job] = []

    @queue.task(name="lr.stuck", max_retries=1, timeout=0.5, backoff=QUICK_RETRY, on_dead=deaths.append)
    def stuck() -> str:
        gate.wait(30)  # ignores the timeout: a thread cannot be killed
        returned.append("late")
        return "late"

    @queue.task(name="lr.quick")
    def quick(x: int) -> int:
        return x + 1

    job = stuck.enqueue()
    worker = queue.worker(lease=5).start()  # one runner
    try:
        wait_until(lambda: deaths, 20, "the timed-out job dead")
        dead = queue.get(job.id)
        assert dead.status == "dead"
        assert dead.attempts == 2  # max_retries=1: ran twice
        assert "timed out after 0.5 s" in (dead.error or "")
        assert [d.id for d in deaths] == [job.id]
        assert deaths[0].status == "dead"
        # Both attempts' handlers still sleep, yet the worker runs other jobs.
        assert quick.enqueue(1).result(timeout=20) == 2
        assert returned == []
    finally:
        gate.set()
        stopped = worker.stop(timeout=20)  # does not wait for the abandoned, stuck threads
    assert stopped
    wait_until(lambda: len(returned) == 2, 10, "the stuck handlers to return once released")
    assert returned == ["late", "late"]
    final = queue.get(job.id)
    assert final.status == "dead"
    assert final.result_json is None
    assert final.attempts == 2
    assert (worker.completed, worker.failed) == (1, 2)


@pytest.mark.slow  # real seconds: a timeout fires, then a retry
def test_a_timed_out_attempt_returning_during_its_retry_is_refused(queue: Queue) -> None:
    gates = [threading.Event(), threading.Event()]
    runs: list[threading.Thread] = []

    @queue.task(name="lr.two_gates", backoff=QUICK_RETRY)
    def two_gates() -> str:
        attempt = len(runs)
        runs.append(threading.current_thread())
        gates[attempt].wait(30)
        return f"attempt {attempt + 1}"

    job = two_gates.schedule(timeout=1.5, max_retries=1)  # a per-job timeout; the task has none
    assert job.timeout == 1.5
    worker = queue.worker(lease=5).start()
    try:
        wait_until(lambda: len(runs) == 2, 20, "the retry running")
        gates[0].set()  # the first attempt returns now, while the second one holds the claim
        runs[0].join(10)
        assert not runs[0].is_alive()
        during = queue.get(job.id)
        assert during.status == "running"
        assert during.attempts == 2
        assert during.result_json is None
        gates[1].set()
        assert job.result(timeout=20) == "attempt 2"
    finally:
        for event in gates:
            event.set()
        worker.stop(timeout=20)
    assert queue.get(job.id).attempts == 2


def test_run_until_idle_returns_once_a_timed_out_job_is_failed(tmp_path: Path, gate: threading.Event) -> None:
    """The timed-out job is dead and nothing else is due: the abandoned thread is not work in hand."""
    q = Queue(tmp_path / "jobs.db")

    @q.task(name="lr.abandoned_thread", max_retries=0, timeout=0.3)
    def stuck() -> str:
        gate.wait(30)
        return "late"

    job = stuck.enqueue()
    worker = q.worker(lease=5).start()
    try:
        wait_until(lambda: q.get(job.id).status == "dead", 10, "the timed-out job dead")
        worker.run_until_idle(timeout=3)  # raises WaitTimeout while the stuck handler sleeps
    finally:
        gate.set()
        worker.stop(timeout=10)
        q.close()


def test_stop_does_not_wait_for_a_timed_out_handler(tmp_path: Path, gate: threading.Event) -> None:
    """Nothing runs any more: stop() need not sit out its whole timeout for an abandoned thread."""
    q = Queue(tmp_path / "jobs.db")

    @q.task(name="lr.abandoned_at_stop", max_retries=0, timeout=0.3)
    def stuck() -> str:
        gate.wait(60)
        return "late"

    job = stuck.enqueue()
    worker = q.worker(lease=5).start()
    stopped: list[bool] = []
    stopper = threading.Thread(target=lambda: stopped.append(worker.stop(timeout=60)))
    try:
        wait_until(lambda: q.get(job.id).status == "dead", 10, "the timed-out job dead")
        stopper.start()
        wait_until(lambda: stopped, 5, "stop() returning while the abandoned handler still sleeps")
        assert stopped == [True]
        assert not gate.is_set()
    finally:
        gate.set()
        if stopper.is_alive():
            stopper.join(10)
        q.close()


@pytest.mark.slow  # real seconds: a timeout fires
def test_a_cooperative_handler_is_stopped_at_its_timeout(queue: Queue) -> None:
    stopped: list[str] = []

    @queue.task(name="lr.cooperative", max_retries=0, timeout=0.5)
    def cooperative() -> str:
        deadline = time.monotonic() + 30
        try:
            while time.monotonic() < deadline:
                nbqueue.progress(1, None, "working")
                time.sleep(0.01)
        except nbqueue.Cancelled:
            stopped.append("told to stop")
            raise
        return "ran to the end"

    job = cooperative.enqueue()
    worker = queue.worker(lease=5).start()
    try:
        with pytest.raises(nbqueue.JobFailed, match="timed out"):
            job.result(timeout=20)
        wait_until(lambda: stopped, 10, "the handler stopped")
    finally:
        worker.stop(timeout=20)
    assert stopped == ["told to stop"]
    assert queue.get(job.id).status == "dead"


NO_WAIT = Backoff(base=0, cap=0, jitter=0)  # the retry is due at once


@pytest.mark.slow
def test_run_until_idle_waits_for_the_retry_of_a_timed_out_job(queue: Queue, gate: threading.Event) -> None:
    """The timeout's failure is committed before the worker counts itself idle, so the retry it
    makes due now is seen and run: run_until_idle returns only once the job is completed."""
    hung: set[int] = set()

    @queue.task(name="lr.hangs_once", max_retries=1, timeout=0.3, backoff=NO_WAIT)
    def hangs_once(n: int) -> int:
        if n not in hung:  # the first attempt hangs past its timeout, the retry returns
            hung.add(n)
            gate.wait(30)
        return n

    worker = queue.worker(lease=5).start()
    try:
        for n in range(20):
            job = hangs_once.enqueue(n)
            worker.run_until_idle(timeout=20)
            done = queue.get(job.id)
            assert (n, done.status, done.attempts) == (n, "completed", 2)
            assert done.value == n
    finally:
        gate.set()
        worker.stop(timeout=10)


@pytest.mark.slow
def test_stop_during_a_timeout_never_joins_a_runner_that_has_not_started(
    queue: Queue, gate: threading.Event
) -> None:
    """The keeper replaces a timed-out runner while stop() may be going through the threads: stop()
    must never see the replacement before it has started ("cannot join thread before it is started").
    """
    started = threading.Semaphore(0)

    @queue.task(name="lr.times_out_at_stop", max_retries=0, timeout=0.2)
    def times_out() -> None:
        started.release()
        gate.wait(30)

    rng = random.Random(7)
    for attempt in range(30):
        job = times_out.enqueue()
        worker = queue.worker(lease=5).start()
        assert started.acquire(timeout=10), f"attempt {attempt}: the job did not start"
        while worker.status()["in_flight"]:  # spin: the keeper has just timed the job out
            pass
        # The keeper now records the failure, then starts a replacement runner: stop() lands in
        # that stretch (measured: about one try in four, without the fix) after a few milliseconds.
        until = time.perf_counter() + rng.uniform(0.0, 0.006)
        while time.perf_counter() < until:
            pass
        assert worker.stop(timeout=5), f"attempt {attempt}: the worker's threads did not stop"
        assert not worker.running
        assert queue.get(job.id).status == "dead"  # the keeper recorded the timeout before it ended


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_a_handler_overrunning_its_timeout_by_150_ms_is_failed(queue: Queue, mode: str) -> None:
    @queue.task(name="lr.overruns", max_retries=0, timeout=0.3)
    def overruns() -> str:
        time.sleep(0.45)
        return "too late"

    job = overruns.enqueue()
    with queue.worker(lease=5, mode=mode):
        with pytest.raises(nbqueue.JobFailed, match="timed out"):
            job.result(timeout=20)
    dead = queue.get(job.id)
    assert dead.status == "dead"
    assert "timed out after 0.3 s" in (dead.error or "")
    assert dead.result_json is None
