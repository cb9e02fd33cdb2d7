"""Hooks: on_complete / on_dead run after the outcome is committed; a hook's error is logged.

Real worker threads, real files and the real PostgreSQL server.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest

import nbqueue
from nbqueue import Queue
from tests.helpers import wait_until


def test_hooks_see_committed_outcomes_and_their_errors_are_logged(
    queue: Queue, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="nbqueue.worker")
    seen: list[tuple[Any, ...]] = []

    def on_complete(job: nbqueue.Job) -> None:
        seen.append(("complete", job.id, job.status, job.value, queue.get(job.id).status))

    def on_dead(job: nbqueue.Job) -> None:
        last = (job.error or "").strip().splitlines()[-1]
        seen.append(("dead", job.id, job.status, last, queue.get(job.id).status))

    def exploding(job: nbqueue.Job) -> None:
        raise RuntimeError(f"the hook broke on job {job.id}")

    @queue.task(name="lr.hook_raises_on_complete", on_complete=exploding)
    def fine() -> str:
        return "fine"

    @queue.task(name="lr.hook_raises_on_dead", max_retries=0, on_dead=exploding)
    def doomed() -> None:
        raise ValueError("doomed")

    @queue.task(name="lr.doubles", on_complete=on_complete)
    def doubles(x: int) -> int:
        return 2 * x

    @queue.task(name="lr.breaks", max_retries=0, on_dead=on_dead)
    def breaks() -> None:
        raise ValueError("broken input")

    first, second = fine.enqueue(), doomed.enqueue()
    good, bad = doubles.enqueue(21), breaks.enqueue()
    worker = queue.worker(lease=5)
    worker.run_until_idle(timeout=30)  # hooks run before a job counts as done with

    assert sorted(seen, key=lambda s: s[1]) == [
        ("complete", good.id, "completed", 42, "completed"),
        ("dead", bad.id, "dead", "ValueError: broken input", "dead"),
    ]
    assert queue.get(first.id).status == "completed"
    assert queue.get(first.id).value == "fine"
    assert queue.get(second.id).status == "dead"
    assert (worker.completed, worker.failed) == (2, 2)
    failures = [r for r in caplog.records if r.name == "nbqueue.worker" and r.levelno == logging.ERROR]
    messages = sorted(r.getMessage() for r in failures)
    assert messages == [
        f"on_complete hook of task lr.hook_raises_on_complete failed for job {first.id}",
        f"on_dead hook of task lr.hook_raises_on_dead failed for job {second.id}",
    ]
    assert all(r.exc_info and "the hook broke" in str(r.exc_info[1]) for r in failures)


def test_on_dead_runs_for_a_job_whose_lease_expired(queue: Queue) -> None:
    deaths: list[nbqueue.Job] = []

    @queue.task(name="lr.abandoned", max_retries=0, on_dead=deaths.append)
    def abandoned() -> str:
        return "never run"

    job = abandoned.enqueue()
    claim = queue.claim(tasks=["lr.abandoned"], lease=0.1)  # a worker that then vanished
    assert claim is not None and claim.id == job.id
    with queue.worker(lease=5, recover_interval=0.05):
        wait_until(lambda: deaths, 10, "the on_dead hook")
    assert [d.id for d in deaths] == [job.id]
    assert deaths[0].status == "dead"
    assert "lease expired" in (deaths[0].error or "")
