"""Retention: purge in small batches, and the worker pruning old completed jobs (never dead ones).

Real worker threads, real files and the real PostgreSQL server; the manual clock where an age
must be exact.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

import nbqueue
from nbqueue import Queue, keeper
from tests.helpers import wait_until


def _finish(q: Queue, state: str, n: int = 1) -> list[int]:
    """n raw jobs driven through the real API to completed, dead or cancelled."""
    ids = []
    for _ in range(n):
        job = q.enqueue({"state": state}, max_retries=0)
        if state == "cancelled":
            q.cancel(job.id)
        else:
            claim = q.claim(lease=60)
            assert claim is not None and claim.id == job.id
            if state == "completed":
                q.complete(claim, {"ok": True})
            else:
                q.fail(claim, "it broke")
        ids.append(job.id)
    return ids


def test_purge_in_small_batches_takes_the_oldest_first(clocked_queue: Queue, clock: Any) -> None:
    q = clocked_queue
    old = _finish(q, "completed", 7)
    dead = _finish(q, "dead", 2)
    clock.advance(10)
    assert q.purge("completed", older_than=5, limit=3) == 3
    assert [job.id for job in reversed(q.jobs("completed"))] == old[3:]
    assert q.purge("completed", older_than=5, limit=3) == 3
    assert q.purge("completed", older_than=5, limit=3) == 1
    assert q.purge("completed", older_than=5, limit=3) == 0
    assert [job.id for job in reversed(q.jobs("dead"))] == dead
    for limit in (0, -1, 1.5, True):
        with pytest.raises(nbqueue.InvalidArgument):
            q.purge("completed", limit=limit)  # type: ignore[arg-type]
    with pytest.raises(nbqueue.InvalidArgument):
        q.purge("running")


def test_worker_prunes_old_completed_jobs_in_batches_and_keeps_dead_ones(
    clocked_queue: Queue, clock: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # five old jobs take three batches
    monkeypatch.setattr(keeper, "PRUNE_BATCH", 2)
    q = clocked_queue
    _finish(q, "completed", 5)
    dead = _finish(q, "dead", 2)
    cancelled = _finish(q, "cancelled")
    clock.advance(10)
    [young] = _finish(q, "completed")
    waiting = q.enqueue({"state": "pending"})  # never pruned (and no worker runs a raw payload)
    worker = q.worker(lease=5, retention=5, prune_interval=0.05).start()
    try:
        wait_until(lambda: q.counts()["completed"] == 1, 10, "old completed jobs pruned")
        assert [job.id for job in q.jobs("completed")] == [young]
        clock.advance(10)  # now the young one is old too
        wait_until(lambda: q.counts()["completed"] == 0, 10, "the young job pruned")
    finally:
        worker.stop(timeout=10)
    assert [job.id for job in reversed(q.jobs("dead"))] == dead  # kept until a person acts
    assert [job.id for job in q.jobs("cancelled")] == cancelled
    assert q.get(waiting.id).status == "pending"


def test_worker_with_real_clock_retention(queue: Queue) -> None:
    _finish(queue, "completed", 3)
    dead = _finish(queue, "dead")
    time.sleep(0.6)  # older than the retention below
    worker = queue.worker(lease=5, retention=0.5).start()
    try:
        wait_until(lambda: queue.counts()["completed"] == 0, 10, "completed jobs pruned")
    finally:
        worker.stop(timeout=10)
    assert [job.id for job in queue.jobs("dead")] == dead
