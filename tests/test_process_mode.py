"""Process mode: each job in a child process, killed at its timeout; results, output, progress
and errors come back up to the worker.

Real child processes, real files and the real PostgreSQL server.
"""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest

import nbqueue
from nbqueue import Progress, Queue
from tests.helpers import QUICK_RETRY, alive, kill_all, read_pids, wait_until, write_pid


def test_process_mode_kills_a_job_at_its_timeout(queue: Queue, tmp_path: Path) -> None:
    pid_file = tmp_path / "pids"

    @queue.task(name="lr.hang", max_retries=1, timeout=0.5, backoff=QUICK_RETRY)
    def hang(path: str) -> str:
        write_pid(path)
        time.sleep(60)
        return "never"

    job = hang.enqueue(str(pid_file))
    worker = queue.worker(lease=5, mode="process").start()
    try:
        wait_until(lambda: queue.get(job.id).status == "dead", 30, "the job dead")
        dead = queue.get(job.id)
        assert dead.attempts == 2
        assert "timed out after 0.5 s" in (dead.error or "")
        assert "killed" in (dead.error or "")
        pids = read_pids(pid_file)
        assert len(pids) == 2
        assert os.getpid() not in pids
        for pid in pids:
            wait_until(lambda pid=pid: not alive(pid), 10, f"process {pid} gone")
    finally:
        worker.stop(timeout=10)
        kill_all(read_pids(pid_file))
    assert worker.status()["mode"] == "process"


def test_process_mode_returns_results_output_progress_and_errors(queue: Queue, tmp_path: Path) -> None:
    go = tmp_path / "go"

    @queue.task(name="lr.child")
    def child(path: str, n: int) -> dict[str, Any]:
        print("hello from the child")
        nbqueue.progress(1, 2, "half way")
        deadline = time.monotonic() + 30
        while not os.path.exists(path) and time.monotonic() < deadline:
            time.sleep(0.02)
        return {"pid": os.getpid(), "double": n * 2, "cancelled": nbqueue.cancelled()}

    @queue.task(name="lr.child_fails", max_retries=0)
    def child_fails() -> None:
        raise ValueError("no good in the child")

    job = child.enqueue(str(go), 21)
    bad = child_fails.enqueue()
    worker = queue.worker(lease=5, mode="process", concurrency=2).start()
    try:
        wait_until(lambda: job.refresh().progress is not None, 20, "progress from the child")
        assert job.status == "running"
        assert job.progress == Progress(1, 2, "half way")
        go.touch()
        result = job.result(timeout=20)
        with pytest.raises(nbqueue.JobFailed, match="no good in the child"):
            bad.result(timeout=20)
    finally:
        go.touch()
        worker.stop(timeout=10)
    assert result["double"] == 42
    assert result["cancelled"] is False
    assert result["pid"] != os.getpid()
    assert not alive(result["pid"])
    done = queue.get(job.id)
    assert "hello from the child" in (done.output or "")
    dead = queue.get(bad.id)
    assert dead.status == "dead"
    assert "ValueError: no good in the child" in (dead.error or "")


# A process-mode child is forked from a parent whose other threads use the same SQLite file. These
# at-fork hooks make "another thread was writing at the moment of the fork" happen every time
# instead of now and then: just before the fork the forking thread opens a real write (nbqueue's
# in-process write lock and/or a SQLite write transaction on a connection of its own), and the
# parent finishes it right after. The child must still be able to report progress.
_writing_at_fork: dict[str, Any] = {}


def _start_writing_before_fork() -> None:
    path, how = _writing_at_fork.get("path"), _writing_at_fork.get("how")
    if path is None:
        return
    if how == "nbqueue-write-lock":
        from nbqueue.storage import sqlite as sqlite_storage  # internal: replace when the refactor lands

        locks = getattr(sqlite_storage, "_write_locks", {})  # internal: replace when the refactor lands
        lock = locks.get(path)
        if lock is not None:
            lock.acquire()
            _writing_at_fork["lock"] = lock
            _writing_at_fork["forks"] += 1
    else:
        conn = sqlite3.connect(path, isolation_level=None, timeout=10)
        conn.execute("BEGIN IMMEDIATE")
        _writing_at_fork["conn"] = conn
        _writing_at_fork["forks"] += 1


def _finish_writing_after_fork() -> None:
    conn = _writing_at_fork.pop("conn", None)
    if conn is not None:
        conn.execute("COMMIT")
        conn.close()
    lock = _writing_at_fork.pop("lock", None)
    if lock is not None:
        lock.release()


os.register_at_fork(before=_start_writing_before_fork, after_in_parent=_finish_writing_after_fork)


@pytest.mark.parametrize("how", ["sqlite-transaction", "nbqueue-write-lock"])
def test_process_mode_child_reports_progress_though_the_parent_was_writing_at_the_fork(
    tmp_path: Path, how: str
) -> None:
    """SQLite only: PostgreSQL has no in-process lock state for a child to inherit."""
    q = Queue(tmp_path / "jobs.db")
    if how == "nbqueue-write-lock":
        from nbqueue.storage import sqlite as sqlite_storage  # internal: replace when the refactor lands

        locks = getattr(sqlite_storage, "_write_locks", {})  # internal: replace when the refactor lands
        if str(q.target) not in locks:
            pytest.skip("no in-process write lock per file any more")

    @q.task(name="lr.reports_after_fork", timeout=4, max_retries=0)
    def reports() -> str:
        nbqueue.progress(1, 2, "half way")  # the child's own write to the queue
        return "reported"

    job = reports.enqueue()
    worker = q.worker(lease=10, mode="process")
    _writing_at_fork.update(path=str(q.target), how=how, forks=0)
    try:
        worker.start()
        [done] = q.wait([job], timeout=20, progress=False)
        forks = _writing_at_fork["forks"]
    finally:
        _writing_at_fork.clear()
        worker.stop(timeout=10)
        q.close()
    assert forks >= 1  # the write really was open when the child was forked
    assert done.status == "completed", f"the child hung on its progress write: {done.error}"
    assert done.progress == Progress(1, 2, "half way")


def test_stop_kills_a_hung_child_releases_its_job_and_returns_true(queue: Queue, tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"

    @queue.task(name="lr.hangs_at_stop")
    def hangs(path: str) -> str:
        write_pid(path)
        time.sleep(60)
        return "never"

    job = hangs.enqueue(str(pid_file))
    worker = queue.worker(lease=5, mode="process").start()
    try:
        [pid] = wait_until(lambda: read_pids(pid_file), 20, "the child started")
        assert alive(pid)
        assert worker.stop(timeout=1) is True
        assert not worker.running
        wait_until(lambda: not alive(pid), 5, "the child killed")
    finally:
        kill_all(read_pids(pid_file))
    released = queue.get(job.id)
    assert released.status == "pending"
    assert released.retries == 0
    assert released.error is None
