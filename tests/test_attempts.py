"""Every attempt recorded (issue #16): q.attempts, q.activity, history's failures, silent jobs.

On both backends (the `backend` fixture), with the manual clock where time matters.
"""

from __future__ import annotations

import math
import os
import sqlite3
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import pandas as pd
import pytest

import nbqueue
from nbqueue import Job, ManualClock, Queue
from nbqueue.lifeline import HOST


def claim(q: Queue, lease: float = 30) -> Job:
    job = q.claim(lease=lease)
    assert job is not None
    return job


def outcomes(q: Queue, job: Job | int) -> list[str]:
    return list(q.attempts(job)["outcome"])


def test_a_job_that_fails_twice_then_completes_has_three_attempts(
    exact_queue: Queue, clock: ManualClock
) -> None:
    q = exact_queue
    job = q.enqueue({"n": 1}, max_retries=3)
    q.fail(claim(q), "boom 1")
    clock.advance(10)
    q.fail(claim(q), "boom 2")
    clock.advance(10)
    third = claim(q)
    clock.advance(1.5)
    q.complete(third, "ok")

    frame = q.attempts(job)
    assert list(frame.columns) == [
        "attempt", "started", "finished", "duration", "worker", "host", "pid", "outcome", "error",
    ]  # fmt: skip
    assert list(frame["attempt"]) == [1, 2, 3]
    assert list(frame["outcome"]) == ["failed", "failed", "completed"]
    errors = list(frame["error"])
    assert "boom 1" in errors[0] and "boom 2" in errors[1] and errors[2] is None
    assert frame["duration"].iloc[2] == pytest.approx(1.5)
    assert str(frame["started"].dt.tz) == "UTC" and str(frame["finished"].dt.tz) == "UTC"
    assert set(frame["host"]) == {HOST} and set(frame["pid"]) == {os.getpid()}
    assert frame["pid"].dtype.kind in "iu" or str(frame["pid"].dtype) == "Int64"

    history = q.history()
    assert int(history.loc[job.id, "failures"]) == 2 and int(history.loc[job.id, "attempts"]) == 3
    rate = history.groupby("task", dropna=False)[["attempts", "failures"]].sum()
    assert rate.to_numpy().tolist() == [[3, 2]]


def test_a_running_attempt_has_no_end(queue: Queue) -> None:
    job = queue.enqueue({"n": 1})
    claim(queue)
    frame = queue.attempts(job)
    assert list(frame["outcome"]) == ["running"]
    assert pd.isna(frame["finished"].iloc[0]) and math.isnan(frame["duration"].iloc[0])
    assert frame["error"].iloc[0] is None


def test_a_dead_job_and_a_lost_lease(exact_queue: Queue, clock: ManualClock) -> None:
    q = exact_queue
    dead = q.enqueue({"n": 1}, max_retries=0)
    q.fail(claim(q), ValueError("no way"))
    assert outcomes(q, dead) == ["dead"]
    assert "no way" in q.attempts(dead)["error"].iloc[0]

    lost = q.enqueue({"n": 2}, max_retries=1)
    claim(q, lease=10)
    clock.advance(11)
    assert q.recover() == 1
    assert outcomes(q, lost) == ["lost"]
    assert q.attempts(lost)["error"].iloc[0].startswith("lease expired")
    assert int(q.history().loc[lost.id, "failures"]) == 1


def test_a_timeout_is_recorded_as_one(queue: Queue) -> None:
    @queue.task(timeout=0.2, max_retries=0)
    def slow() -> None:
        time.sleep(1.0)

    job = slow.enqueue()
    with queue.worker(lease=5):
        [done] = queue.wait(job, timeout=20, progress=False)
    assert done.status == "dead"
    frame = queue.attempts(job)
    assert list(frame["outcome"]) == ["timeout"]
    assert frame["error"].iloc[0].startswith("timed out after")


def test_an_error_that_reads_like_a_timeout_is_recorded_as_what_it_is(queue: Queue) -> None:
    """The outcome is the value the worker reports, never read from the error's text."""
    job = queue.enqueue({"n": 1}, max_retries=1)
    queue.fail(claim(queue), "timed out after 3 s (the API's words)")
    assert outcomes(queue, job) == ["failed"]


def test_cancel_release_and_snooze_end_the_attempt(queue: Queue) -> None:
    cancelled = queue.enqueue({"n": 1}, priority=3)
    claim(queue)
    queue.cancel(cancelled)
    released = queue.enqueue({"n": 2}, priority=2)
    queue.release(claim(queue))
    assert outcomes(queue, cancelled) == ["cancelled"]
    assert outcomes(queue, released) == ["released"]
    assert queue.attempts(released)["error"].iloc[0] is None
    queue.complete(claim(queue), None)
    assert outcomes(queue, released) == ["released", "completed"]
    assert list(queue.attempts(released)["attempt"]) == [1, 2]


def test_a_worker_records_its_attempts_with_batched_completion(queue: Queue) -> None:
    @queue.task
    def double(x: int) -> int:
        return 2 * x

    jobs = [double.enqueue(i) for i in range(20)]
    with queue.worker(lease=30):
        queue.wait(jobs, timeout=30, progress=False)
    for job in jobs:
        frame = queue.attempts(job)
        assert list(frame["outcome"]) == ["completed"], frame
        assert frame["finished"].notna().all()
    assert int(queue.activity(5)["completed"].sum()) == 20


def test_unknown_and_deleted_jobs_have_no_attempts(queue: Queue) -> None:
    with pytest.raises(nbqueue.JobNotFound):
        queue.attempts(424242)
    job = queue.enqueue({"n": 1})
    queue.complete(claim(queue), None)
    assert len(queue.attempts(job)) == 1
    queue.delete(job)
    with pytest.raises(nbqueue.JobNotFound):
        queue.attempts(job)
    assert queue.manager.storage.attempts(job.id) == []  # the rows went with the job
    other = queue.enqueue({"n": 2})
    queue.complete(claim(queue), None)
    queue.purge("completed", older_than=0)
    assert queue.manager.storage.attempts(other.id) == []


def test_activity_counts_per_minute(exact_queue: Queue, clock: ManualClock) -> None:
    q = exact_queue
    clock.set(datetime(2026, 1, 1, 12, 0, 30, tzinfo=UTC).timestamp())
    for n in range(3):
        q.enqueue({"n": n}, max_retries=0)
    q.complete(claim(q), None)
    q.complete(claim(q), None)
    q.fail(claim(q), "bad")  # dead: a failed attempt
    clock.advance(60)  # 12:01:30
    q.enqueue({"n": 9})
    q.fail(claim(q), nbqueue.RetryAfter(1))  # a snooze: a run, no attempt spent
    clock.advance(1)
    q.complete(claim(q), None)

    frame = q.activity(3)
    assert list(frame.columns) == ["completed", "failed", "snoozed"]
    assert frame.index.name == "minute" and str(frame.index.tz) == "UTC"
    assert list(frame.index) == [
        pd.Timestamp(f"2026-01-01 {t}", tz="UTC") for t in ("11:59", "12:00", "12:01")
    ]
    assert frame.to_numpy().tolist() == [[0, 0, 0], [2, 1, 0], [1, 0, 1]]
    assert len(q.activity()) == 60 and q.activity(1).to_numpy().tolist() == [[1, 0, 1]]
    with pytest.raises(nbqueue.InvalidArgument):
        q.activity(0)


def test_a_silent_lease_is_noticed(clocked_queue: Queue, clock: ManualClock) -> None:
    q = clocked_queue
    job = q.enqueue({"n": 1})
    claimed = claim(q, lease=30)  # heartbeats every 10 s: silent after 20 s without one
    idle = q.enqueue({"n": 2})
    assert q.silent_jobs([job, idle]) == set()
    clock.advance(15)
    q.heartbeat(claimed)
    clock.advance(15)
    assert q.silent_jobs([job.id]) == set()
    clock.advance(6)
    assert q.silent_jobs([job, idle]) == {job.id}


def test_a_running_job_of_a_gone_process_is_silent(queue: Queue, queue_target: str, backend: str) -> None:
    job = queue.enqueue({"n": 1})
    claim(queue, lease=600)
    assert queue.silent_jobs([job]) == set()
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    set_worker_pid(queue_target, backend, job.id, gone.pid)
    assert queue.silent_jobs([job]) == {job.id}


def set_worker_pid(target: str, backend: str, job_id: int, pid: int) -> None:
    """Write the claiming process's pid by hand (as if another process had claimed the job)."""
    if backend == "sqlite":
        with sqlite3.connect(target) as conn:
            conn.execute("UPDATE nbqueue_jobs SET worker_pid = ? WHERE id = ?", (pid, job_id))
        return
    import psycopg

    server, schema = target.split("?schema=")
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(
            f'UPDATE "{schema}".nbqueue_jobs SET worker_pid = %s WHERE id = %s',  # type: ignore[arg-type]
            (pid, job_id),
        )


def scenario(q: Queue, clock: ManualClock) -> list[tuple[int, str, str | None]]:
    job = q.enqueue({"n": 1}, max_retries=1)
    q.fail(claim(q), "first")
    clock.advance(10)
    q.fail(claim(q), "second")
    frame = q.attempts(job)
    return [(int(a), str(o), None if e is None else e.splitlines()[-1]) for a, o, e in zip(
        frame["attempt"], frame["outcome"], frame["error"], strict=True
    )]  # fmt: skip


def test_both_backends_agree(tmp_path: Path, pg_url: str) -> None:
    found = []
    for target in (str(tmp_path / "jobs.db"), pg_url):
        clock = ManualClock()
        q = Queue(target, clock=clock, backoff=nbqueue.Backoff(base=2, cap=3600, jitter=0))
        try:
            found.append(scenario(q, clock))
        finally:
            q.close()
    assert found[0] == found[1] == [(1, "failed", "first"), (2, "dead", "second")]
