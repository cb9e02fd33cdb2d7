"""Real kernels via jupyter_client: the worker never writes into cells, and a new kernel recovers jobs."""

from __future__ import annotations

import contextlib
import json
import os
import queue as stdqueue
import re
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from jupyter_client.manager import KernelManager, start_new_kernel

from nbqueue import Queue, State
from tests.helpers import wait_until

pytestmark = pytest.mark.slow  # run by make test, not make test-fast

N_JOBS = 20
SHOWN = ("stream", "display_data", "execute_result", "update_display_data", "error")


class Kernel:
    """A running python3 kernel and every iopub message it sent while we listened."""

    def __init__(self, cwd: Path) -> None:
        self.km: KernelManager
        self.km, self.kc = start_new_kernel(kernel_name="python3", startup_timeout=60, cwd=str(cwd))
        self.messages: list[dict[str, Any]] = []

    def run(self, code: str, timeout: float = 30) -> list[dict[str, Any]]:
        """Execute a cell; return the iopub messages sent for it. Fails on an error reply."""
        msg_id = self.kc.execute(code, store_history=False)
        mine: list[dict[str, Any]] = []
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"the cell did not finish within {timeout} s:\n{code}")
            try:
                msg = self.kc.get_iopub_msg(timeout=left)
            except stdqueue.Empty:
                continue
            self.messages.append(msg)
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            mine.append(msg)
            if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                break
        while True:
            reply = self.kc.get_shell_msg(timeout=max(1.0, deadline - time.monotonic()))
            if reply["parent_header"].get("msg_id") == msg_id:
                break
        content = reply["content"]
        if content["status"] != "ok":
            raise AssertionError(
                f"the cell failed: {content.get('ename')}: {content.get('evalue')}\n{code}\n"
                + "\n".join(content.get("traceback", []))
            )
        return mine

    def drain(self, seconds: float) -> None:
        """Keep listening for late messages (output sent while no cell runs)."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            with contextlib.suppress(stdqueue.Empty):
                self.messages.append(self.kc.get_iopub_msg(timeout=left))

    def kill(self) -> None:
        self.km.shutdown_kernel(now=True)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.kc.stop_channels()
        if self.km.is_alive():
            self.km.shutdown_kernel(now=True)


def stdout_of(messages: list[dict[str, Any]]) -> str:
    return "".join(m["content"]["text"] for m in messages if m["msg_type"] == "stream")


def shown(messages: list[dict[str, Any]]) -> str:
    """Everything a front end would show for these messages, as one string."""
    return "\n".join(json.dumps(m["content"]) for m in messages if m["msg_type"] in SHOWN)


@pytest.fixture
def kernels(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """Start kernels in tmp_path with private IPython/Jupyter dirs; all shut down at teardown."""
    monkeypatch.setenv("IPYTHONDIR", str(tmp_path / "ipython"))
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "runtime"))
    started: list[Kernel] = []

    def start() -> Kernel:
        kernel = Kernel(tmp_path)
        started.append(kernel)
        return kernel

    try:
        yield start
    finally:
        for kernel in started:
            kernel.close()


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Any]:
    """Open the queue file from the test process, as a second process would."""
    opened: list[Queue] = []

    def open_(path: Path) -> Queue:
        q = Queue(str(path))
        opened.append(q)
        return q

    yield open_
    for q in opened:
        q.close()


def test_the_kernel_is_this_virtualenv(kernels: Any) -> None:
    kernel = kernels()
    try:
        out = stdout_of(kernel.run("import sys\nprint(sys.prefix)\nprint(sys.executable)"))
        prefix, executable = out.split()
        assert prefix == sys.prefix
        assert os.path.samefile(executable, sys.executable)
        assert "nbqueue" in stdout_of(kernel.run("import nbqueue\nprint(nbqueue.__file__)"))
    finally:
        kernel.close()
    assert not kernel.km.is_alive()


def test_job_output_never_lands_in_a_cell(kernels: Any, tmp_path: Path, db: Any) -> None:
    path = tmp_path / "jobs.db"
    kernel = kernels()
    try:
        kernel.run(f"%load_ext nbqueue\n%nbqueue {path}")
        kernel.run(
            "import sys, time\n"
            "def chatty(i):\n"
            "    for k in range(40):\n"
            "        print(f'CHATTY-OUT job {i} line {k}')\n"
            "    print(f'CHATTY-ERR job {i}', file=sys.stderr)\n"
            "    sys.stdout.flush()\n"
            "    time.sleep(0.2)\n"
            "    return i * i\n"
        )
        status = kernel.run("%worker start --concurrency 2")
        assert "worker running \\u00b7 2 threads" in shown(status)  # %worker reads as a sentence
        kernel.run(
            f"jobs = [get_ipython().run_line_magic('enqueue', f'chatty({{i}})') for i in range({N_JOBS})]"
        )
        q = db(path)
        assert q.counts()["completed"] < N_JOBS  # they take 2 s at least: most run during the next cell
        before = datetime.now(UTC)
        sleeping = kernel.run("time.sleep(2)\nprint('MAIN-CELL-OK')")
        after = datetime.now(UTC)
        wait_until(lambda: q.counts()["completed"] == N_JOBS, 30, "every job completed")
        kernel.run("print('LATER-CELL-OK')")
        kernel.drain(0.5)

        # the cell's own print still reaches the cell, and nothing else does
        assert stdout_of(sleeping) == "MAIN-CELL-OK\n"
        jobs = sorted(q.jobs(limit=100), key=lambda j: j.args[0])
        assert [j.task for j in jobs] == ["__main__.chatty"] * N_JOBS
        assert any(j.finished_at is not None and before <= j.finished_at <= after for j in jobs), (
            "no job finished while the sleeping cell ran, so the test proved nothing"
        )
        everything = shown(kernel.messages)
        assert "CHATTY" not in everything
        assert "LATER-CELL-OK" in everything

        # what the jobs printed is in their records, each job its own and nothing else
        for job in jobs:
            i = job.args[0]
            assert job.status is State.COMPLETED
            assert job.value == i * i
            assert job.output is not None
            assert f"CHATTY-OUT job {i} line 0\n" in job.output
            assert f"CHATTY-OUT job {i} line 39\n" in job.output
            assert f"CHATTY-ERR job {i}\n" in job.output
            assert set(re.findall(r"job (\d+)", job.output)) == {str(i)}
            assert job.output.count("\n") == 41
    finally:
        kernel.close()


def test_a_new_kernel_gets_the_jobs_of_a_killed_one_back(kernels: Any, tmp_path: Path, db: Any) -> None:
    path = tmp_path / "jobs.db"
    q = db(path)
    first = kernels()
    try:
        first.run(f"%load_ext nbqueue\n%nbqueue {path}")
        first.run("import time\ndef sleepy():\n    time.sleep(30)\n    return 'slow'\n")
        first.run("%worker start --lease 1")
        first.run("job = %enqueue sleepy()")
        [job] = q.jobs()
        wait_until(lambda: q.get(job.id).status is State.RUNNING, 10, "the job running in kernel A")
        first.kill()
        assert not first.km.is_alive()
    finally:
        first.close()
    assert q.get(job.id).status is State.RUNNING  # a hard kill releases nothing: the lease must expire

    second = kernels()
    try:
        second.run(f"%load_ext nbqueue\n%nbqueue {path}")
        # @q.task names it as %enqueue did (__main__.sleepy), so this task takes the job back
        second.run("@nbqueue_queue.task\ndef sleepy():\n    return 'fast'\n")
        second.run("%worker start --lease 1")
        wait_until(lambda: q.get(job.id).finished, 20, "the job finished in kernel B")
        done = q.get(job.id)
        assert done.status is State.COMPLETED
        assert done.value == "fast"
        assert (done.attempts, done.retries) == (2, 1)
        second.km.shutdown_kernel()
        assert not second.km.is_alive()
    finally:
        second.close()


def test_jobs_of_a_restarted_kernel_run_once_their_function_is_defined_again(
    kernels: Any, tmp_path: Path, db: Any
) -> None:
    """The README's layout: `%worker start` in the first cell, the functions below it. After a
    restart, re-running the cells in order takes the old jobs up: the running worker adopts the
    function when its cell runs, and until then %worker says which function is missing."""
    path = tmp_path / "jobs.db"
    q = db(path)
    first = kernels()
    try:
        first.run(f"%load_ext nbqueue\n%nbqueue {path}")
        first.run("def slow_work(n):\n    return n * 2\n")
        for i in range(3):
            first.run(f"%enqueue slow_work({i})")
    finally:
        first.close()
    assert [j.status for j in q.jobs()] == [State.PENDING] * 3

    second = kernels()
    try:
        second.run(f"%load_ext nbqueue\n%nbqueue {path}")
        started = second.run("%worker start")
        said = shown(started)
        assert "no task here for 3 pending jobs of slow_work: define it in this notebook" in said, said
        time.sleep(0.5)
        assert [j.status for j in q.jobs()] == [State.PENDING] * 3  # nothing runs them yet
        second.run("def slow_work(n):\n    return n * 2\n")  # the cell below, run again
        wait_until(lambda: all(j.finished for j in q.jobs()), 20, "the old jobs ran in the new kernel")
        assert sorted(j.value for j in q.jobs()) == [0, 2, 4]
        status = shown(second.run("%worker status"))
        assert "worker running" in status and "no task here" not in status, status
    finally:
        second.close()
