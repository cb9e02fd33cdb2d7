"""Process mode: each job in a child process, killed (with what it started) at its timeout, on
cancel and at stop; results, output, progress and errors come back up to the worker as JSON only.

Real child processes, real files and the real PostgreSQL server.
"""

from __future__ import annotations

import fcntl
import gc
import json
import os
import sqlite3
import struct
import subprocess
import sys
import threading
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import pytest

import nbqueue
from nbqueue import Progress, Queue
from tests.helpers import QUICK_RETRY, alive, kill_all, read_pids, wait_until, write_pid

# A classic pickle that runs a shell command when it is loaded.
EVIL_PICKLE = "cposix\nsystem\n(S'touch {sentinel}'\ntR."


@pytest.mark.slow  # real seconds: a timeout fires
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
        assert list(queue.attempts(job)["outcome"]) == ["timeout", "timeout"]
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


@pytest.mark.slow  # real seconds: a hung child is waited for, then killed
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


@pytest.mark.parametrize("how", ["connection", "descriptor"])
def test_a_pickle_sent_up_the_pipe_is_never_loaded(queue: Queue, tmp_path: Path, how: str) -> None:
    """The child answers in JSON only; a handler that writes a pickle to the pipe (through the
    connection object it can reach, or the pipe's file descriptor) runs no code in the worker."""
    sentinel = tmp_path / "pwned"
    blob = EVIL_PICKLE.format(sentinel=sentinel).encode()

    @queue.task(name="lr.sends_a_pickle", max_retries=0)
    def sends_a_pickle(how: str, blob_hex: str) -> str:
        blob = bytes.fromhex(blob_hex)
        if how == "connection":
            for obj in gc.get_objects():
                if isinstance(obj, Connection) and not obj.closed and obj.writable:
                    obj.send_bytes(blob)
        else:
            for fd in [int(name) for name in os.listdir("/proc/self/fd") if int(name) > 2]:
                try:
                    is_pipe = os.readlink(f"/proc/self/fd/{fd}").startswith("pipe:")
                except OSError:  # the listing's own descriptor, closed by now
                    continue
                if is_pipe and fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE == os.O_WRONLY:
                    os.write(fd, struct.pack("!i", len(blob)) + blob)  # a Connection's framing
        time.sleep(2)  # the parent reads the pickle before any real answer
        return "innocent"

    job = sends_a_pickle.enqueue(how, blob.hex())
    with queue.worker(lease=5, mode="process"):
        with pytest.raises(nbqueue.JobFailed):
            job.result(timeout=20)
    time.sleep(0.2)  # os.system would have run by now
    assert not sentinel.exists(), "the worker unpickled what the child sent"
    dead = queue.get(job.id)
    assert dead.status == "dead"
    assert "broke nbqueue's protocol" in (dead.error or "")
    assert "not JSON (nothing it sends is unpickled)" in (dead.error or "")


# "timeout" waits for a real timeout to fire: slow.
@pytest.mark.parametrize("how", [pytest.param("timeout", marks=pytest.mark.slow), "cancel", "stop"])
def test_killing_a_child_kills_the_subprocesses_it_started(queue: Queue, tmp_path: Path, how: str) -> None:
    pid_file = tmp_path / "pids"

    @queue.task(name="lr.starts_a_sleeper", max_retries=0, timeout=1.5 if how == "timeout" else None)
    def starts_a_sleeper(path: str) -> None:
        sleeper = subprocess.Popen(["sleep", "60"])  # a grandchild of the worker
        with open(path, "a") as file:
            file.write(f"{os.getpid()}\n{sleeper.pid}\n")
        time.sleep(60)

    job = starts_a_sleeper.enqueue(str(pid_file))
    worker = queue.worker(lease=5, mode="process").start()
    try:
        pids = wait_until(lambda: len(read_pids(pid_file)) == 2 and read_pids(pid_file), 20, "both started")
        assert all(alive(pid) for pid in pids)
        if how == "timeout":
            wait_until(lambda: queue.get(job.id).status == "dead", 20, "the job timed out")
        elif how == "cancel":
            queue.cancel(job.id)
        else:
            assert worker.stop(timeout=0.5)
        for pid in pids:
            wait_until(lambda pid=pid: not alive(pid), 10, f"process {pid} killed")
    finally:
        worker.stop(timeout=10)
        kill_all(read_pids(pid_file))
    assert queue.get(job.id).status == {"timeout": "dead", "cancel": "cancelled", "stop": "pending"}[how]


def test_a_handler_that_cannot_be_sent_to_a_child_is_dead_at_once(queue: Queue) -> None:
    lock = threading.Lock()

    @queue.task(name="lr.holds_a_lock", max_retries=3, backoff=QUICK_RETRY)
    def holds_a_lock() -> str:
        with lock:
            return "unreachable"

    job = holds_a_lock.enqueue()
    with queue.worker(lease=5, mode="process"), pytest.raises(nbqueue.JobFailed):
        job.result(timeout=20)
    dead = queue.get(job.id)
    assert dead.status == "dead"
    assert dead.attempts == 1  # max_retries=3, yet no retry: it could never succeed
    assert "cannot send the handler of task 'lr.holds_a_lock' to a child process" in (dead.error or "")
    assert "lock" in (dead.error or "")
    assert "run it in thread mode" in (dead.error or "")


@pytest.mark.filterwarnings("error")
def test_a_child_starts_and_runs_while_another_thread_holds_the_sqlite_write_transaction(
    tmp_path: Path,
) -> None:
    """SQLite only. The child is never a fork of the worker's process (which has threads, one of them
    in a write transaction here): Python 3.12+ would warn that such a fork may deadlock, and the
    warning is an error in this test. The handler is sent by value; while it is pickled (after the
    claim, before the child starts) another thread opens a write transaction and holds it."""
    q = Queue(tmp_path / "jobs.db")
    path = str(q.target)
    pickled, holding, release = threading.Event(), threading.Event(), threading.Event()
    ran = tmp_path / "ran"

    class OpensTheWrite:
        def __reduce__(self) -> tuple[Any, ...]:  # runs in the worker's runner thread
            pickled.set()
            assert holding.wait(20)
            return (str, ("shipped",))

    marker = OpensTheWrite()

    @q.task(name="lr.starts_under_a_write", max_retries=0)
    def starts_under_a_write() -> dict[str, Any]:
        with sqlite3.connect(path, timeout=2) as conn:  # WAL: a reader is not blocked by the writer
            count = conn.execute("SELECT count(*) FROM nbqueue_jobs").fetchone()[0]
        nbqueue.progress(1, 2, "half way")
        ran.touch()
        return {"marker": marker, "ppid": os.getppid(), "jobs": count}

    def hold() -> None:
        if pickled.wait(20):
            conn = sqlite3.connect(path, isolation_level=None, timeout=10)
            conn.execute("BEGIN IMMEDIATE")
            holding.set()
            release.wait(30)
            conn.execute("COMMIT")
            conn.close()

    job = starts_under_a_write.enqueue()
    holder = threading.Thread(target=hold)
    holder.start()
    worker = q.worker(lease=10, mode="process").start()
    try:
        wait_until(ran.exists, 30, "the child running while the write transaction is open")
        assert holding.is_set() and holder.is_alive()
        release.set()
        [done] = q.wait([job], timeout=30, progress=False)
    finally:
        release.set()
        holding.set()
        holder.join(10)
        worker.stop(timeout=10)
        q.close()
    assert pickled.is_set(), "the handler was not sent by value"
    assert done.status == "completed", done.error
    assert done.value == {"marker": "shipped", "ppid": done.value["ppid"], "jobs": 1}
    assert done.value["ppid"] != os.getpid()  # a child of the fork server, not of the worker
    assert done.progress == Progress(1, 2, "half way")


SCRIPT = """
import json, os, sys
import nbqueue

def triple(x):  # a function of __main__: a child cannot import it, so it travels by value
    return {"value": 3 * x, "pid": os.getpid(), "parent": os.getppid()}

def main(path):
    q = nbqueue.Queue(path)
    offset = 100
    tripled = q.task(name="triple")(triple)

    @q.task(name="shifted")
    def shifted(x):  # a closure over a picklable value
        return x + offset

    jobs = [tripled.enqueue(7), shifted.enqueue(1)]
    with q.worker(mode="process", concurrency=2):
        print(json.dumps([os.getpid(), *(job.result(timeout=60) for job in jobs)]))

if __name__ == "__main__":
    main(sys.argv[1])
"""


@pytest.mark.parametrize("temp", ["short", "too deep for a socket"])
def test_functions_of_main_and_closures_run_in_process_mode(tmp_path: Path, temp: str) -> None:
    """A deep TMPDIR leaves no room for the fork server's socket path: children are spawned instead."""
    script = tmp_path / "worker_script.py"
    script.write_text(SCRIPT)
    temp_dir = tmp_path / ("t" if temp == "short" else "deep-" + "d" * 80)
    temp_dir.mkdir()
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "jobs.db")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "TMPDIR": str(temp_dir)},
    )
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    script_pid, tripled, shifted = json.loads(done.stdout)
    assert tripled["value"] == 21
    assert tripled["pid"] != script_pid  # ran in a child
    forked_by_the_server = tripled["parent"] != script_pid  # a spawned child is the worker's own
    assert forked_by_the_server == (temp == "short")
    assert shifted == 101
