"""Quick jobs claimed several to a transaction (nbqueue.batches), with nothing else changed:
jobs run in claim order, every success is written, and a slow job in a batch neither delays
the successes before it nor keeps the jobs after it claimed."""

from __future__ import annotations

import threading

import pytest

from nbqueue import Queue
from nbqueue.context import current

from .helpers import wait_until

QUICK = 60


@pytest.mark.parametrize("queues", [1, 2])
def test_a_single_runner_runs_quick_jobs_in_claim_order(queue: Queue, queues: int) -> None:
    """In one queue a batch's claims are one statement; with two, one claim at a time."""
    ran: list[int] = []

    @queue.task
    def note(i: int) -> int:
        ran.append(i)
        return i

    for i in range(QUICK):  # claim order is not insertion order, and spans the queues
        note.schedule([i], priority=i % 3, queue=f"q{i % queues}")
    queue.worker(lease=30).run_until_idle(timeout=60)
    expected = sorted(range(QUICK), key=lambda i: (-(i % 3), i))
    assert ran == expected
    assert queue.counts()["completed"] == QUICK


def test_a_slow_job_in_a_batch_holds_neither_results_nor_claims(queue: Queue) -> None:
    """Quick jobs, one slow one, more quick ones: while the slow one runs, the quick ones before
    it are completed in the database and no other job stays claimed by the busy runner."""
    gate = threading.Event()
    started = threading.Event()

    @queue.task
    def quick(i: int) -> int:
        return i

    @queue.task
    def slow() -> str:
        started.set()
        gate.wait(30)
        return "slow done"

    before = [quick.enqueue(i) for i in range(QUICK)]
    held = slow.enqueue()
    after = [quick.enqueue(i) for i in range(QUICK, QUICK + 20)]
    worker = queue.worker(lease=30).start()
    try:
        assert started.wait(20)
        # Within a moment (the keeper settles a batch after nbqueue.batches.HOLD), only the slow
        # job is running: those before it are written, those after it given back.
        wait_until(lambda: queue.counts()["running"] == 1, 5, "only the slow job running")
        assert queue.get(held.id).status == "running"
        assert {queue.get(j.id).status for j in before} == {"completed"}
        assert {queue.get(j.id).status for j in after} <= {"pending"}
        # Given back as if never claimed: no retry, no attempt, no attempt record.
        assert {(queue.get(j.id).retries, queue.get(j.id).attempts) for j in after} == {(0, 0)}
        assert all(queue.attempts(j.id).empty for j in after)
        # A second worker takes the jobs given back while the first is busy.
        queue.worker(lease=30).run_until_idle(timeout=30)
        assert {queue.get(j.id).status for j in after} == {"completed"}
        assert {queue.get(j.id).attempts for j in before + after} == {1}  # each ran once
    finally:
        gate.set()
        worker.stop(timeout=10)
    assert queue.get(held.id).value == "slow done"
    assert queue.counts()["completed"] == QUICK + 1 + 20


def test_stop_writes_every_success_and_leaves_nothing_claimed(queue: Queue) -> None:
    @queue.task
    def quick(i: int) -> int:
        return i

    jobs = [quick.enqueue(i) for i in range(500)]
    worker = queue.worker(lease=30).start()
    wait_until(lambda: queue.counts()["completed"] >= 50, 20, "some jobs done")
    assert worker.stop(timeout=10)
    counts = queue.counts()
    assert counts["running"] == 0
    assert counts["completed"] + counts["pending"] == len(jobs)
    assert counts["completed"] == worker.completed  # every success the worker counted is written


def test_the_jobs_a_batch_holds_are_known_as_not_running(queue: Queue) -> None:
    """The database counts a batch's jobs running from their claim to the write of their
    success; the Queue tells which of them its workers are not running (the board says so)."""
    seen: list[tuple[int, set[int], int]] = []

    @queue.task
    def look(i: int) -> int:
        here = current()
        assert here is not None
        seen.append((here.job.id, queue.held_in_batches(), queue.counts()["running"]))
        return i

    for i in range(QUICK):
        look.enqueue(i)
    queue.worker(lease=30).run_until_idle(timeout=60)
    assert all(me not in held for me, held, _ in seen)
    assert any(held for _, held, _ in seen), "no batch ever held a job"
    # What the database counts running is the one job running and those its batch holds.
    assert all(running == 1 + len(held) for _, held, running in seen)
    assert queue.held_in_batches() == set()
