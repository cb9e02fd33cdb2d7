"""Orphans recovered at once (issue #16): a job whose worker process on this host is gone is
taken back by another worker of the host within seconds, not at the end of its lease; a live
process's job, and another host's, is never touched. On both backends."""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from nbqueue import Queue, Task
from nbqueue.lifeline import HOST
from tests.helpers import wait_until

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL is POSIX")

TASK = "orphans.sleepy"
CHILD = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    import nbqueue

    q = nbqueue.Queue(sys.argv[1])
    started = Path(sys.argv[2])

    @q.task(name="orphans.sleepy", max_retries=2)
    def sleepy() -> str:
        started.write_text("started")
        time.sleep(600)
        return "never"

    q.worker(lease=60).start()
    time.sleep(600)
    """
)


def spawn_claimer(queue: Queue, target: str, tmp_path: Path) -> tuple[subprocess.Popen[bytes], int]:
    """A worker in a process of its own that claims the job and runs it (for ten minutes)."""
    started = tmp_path / "started"
    child = subprocess.Popen([sys.executable, "-c", CHILD, target, str(started)], stderr=subprocess.PIPE)
    wait_until(lambda: started.exists() or child.poll() is not None, 60, "the child worker runs the job")
    assert child.poll() is None, child.stderr.read().decode() if child.stderr else ""
    return child, child.pid


def register(queue: Queue) -> Task[[], str]:
    """The task here: it completes at once (the child's sleeps)."""

    @queue.task(name=TASK, max_retries=2)
    def sleepy() -> str:
        return "done here"

    return sleepy


def kill(child: subprocess.Popen[bytes]) -> None:
    if child.poll() is None:
        child.send_signal(signal.SIGKILL)
    child.wait(30)


@pytest.mark.slow
def test_a_killed_workers_job_is_back_within_five_seconds(
    queue: Queue, queue_target: str, tmp_path: Path
) -> None:
    job = register(queue).enqueue()
    child, pid = spawn_claimer(queue, queue_target, tmp_path)
    try:
        running = queue.get(job.id)
        assert running.status == "running" and running.attempts == 1
        with queue.worker(lease=60):  # a lease of a minute: not what brings the job back
            time.sleep(0.5)
            assert queue.get(job.id).status == "running"  # the child is alive: left alone
            kill(child)
            killed = time.monotonic()
            wait_until(lambda: queue.get(job.id).status == "completed", 30, "the job completed here")
            took = time.monotonic() - killed
    finally:
        kill(child)
    assert took < 5, f"the orphan came back after {took:.1f} s"
    frame = queue.attempts(job)
    assert list(frame["outcome"]) == ["lost", "completed"]
    assert frame["error"].iloc[0] == f"lost: worker process {pid} on {HOST} is gone"
    assert frame["pid"].iloc[0] == pid and list(frame["host"]) == [HOST, HOST]


@pytest.mark.slow
def test_a_live_processs_job_and_another_hosts_are_not_touched(
    queue: Queue, queue_target: str, backend: str, tmp_path: Path
) -> None:
    job = register(queue).enqueue()
    child, _ = spawn_claimer(queue, queue_target, tmp_path)
    try:
        assert queue.recover() == 0
        assert queue.silent_jobs([job]) == set()
        assert queue.get(job.id).status == "running"
    finally:
        kill(child)
    # The same claim, as if made on another host (whose pids mean other processes): not ours to judge.
    set_claimer(queue_target, backend, job.id, "elsewhere/1", child.pid)
    assert queue.recover() == 0
    assert queue.silent_jobs([job]) == set()
    assert queue.get(job.id).status == "running"
    # Back on this host, the gone process's job is recovered at once.
    set_claimer(queue_target, backend, job.id, HOST, child.pid)
    assert queue.silent_jobs([job]) == {job.id}
    assert queue.recover() == 1
    assert queue.get(job.id).status == "failed"
    assert list(queue.attempts(job)["outcome"]) == ["lost"]


def set_claimer(target: str, backend: str, job_id: int, host: str, pid: int) -> None:
    """Write the claiming host and process by hand."""
    if backend == "sqlite":
        with sqlite3.connect(target) as conn:
            conn.execute(
                "UPDATE nbqueue_jobs SET worker_host = ?, worker_pid = ? WHERE id = ?", (host, pid, job_id)
            )
        return
    import psycopg

    server, schema = target.split("?schema=")
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(
            f'UPDATE "{schema}".nbqueue_jobs SET worker_host = %s, worker_pid = %s WHERE id = %s',  # type: ignore[arg-type]
            (host, pid, job_id),
        )


@pytest.mark.slow
def test_a_killed_worker_not_yet_reaped_counts_as_gone(
    queue: Queue, queue_target: str, tmp_path: Path
) -> None:
    """A killed worker whose parent has not reaped it yet (a zombie) runs nothing: its job comes back."""
    job = register(queue).enqueue()
    child, pid = spawn_claimer(queue, queue_target, tmp_path)
    try:
        child.send_signal(signal.SIGKILL)
        wait_until(lambda: Path(f"/proc/{pid}").exists() is False or _zombie(pid), 10, "the child is dead")
        assert queue.recover() == 1
        assert list(queue.attempts(job)["outcome"]) == ["lost"]
    finally:
        kill(child)


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[-1].split()[0] == b"Z"
    except OSError:
        return False
