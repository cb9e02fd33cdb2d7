"""Streams across processes, on both backends: a follower in another process reads a running
job's items live, and a job run in process mode (`q.worker(mode="process")`) emits from its
child process, under its worker's claim.

Real child processes, real SQLite files and the real PostgreSQL server. The in-process contract
is in tests/test_streams.py.
"""

from __future__ import annotations

import json
import os
import queue as queues
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import nbqueue
from nbqueue import Dropped, Queue
from tests.helpers import QUICK, QUICK_RETRY, alive, wait_until

ROOT = Path(__file__).resolve().parents[1]


def child_env() -> dict[str, str]:
    """A child Python that imports this checkout of nbqueue."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


# Follows a job's stream and prints each item as a line: the wall-clock moment it read it and
# the item as JSON; "end" when the stream ends.
FOLLOWER = textwrap.dedent(
    """
    import json, sys, time
    import nbqueue

    q = nbqueue.Queue(sys.argv[1])
    job = q.get(int(sys.argv[2]))
    print("ready", flush=True)
    for item in job.stream(timeout=60):
        print(json.dumps([time.time(), item]), flush=True)
    print("end", flush=True)
    q.close()
    """
)


class Lines:
    """A child's stdout, line by line, read by a thread (a read with a timeout never hangs a test)."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self._lines: queues.Queue[str] = queues.Queue()
        assert proc.stdout is not None
        threading.Thread(target=self._read, args=(proc.stdout,), daemon=True).start()

    def _read(self, out: Any) -> None:
        for line in out:
            self._lines.put(line)

    def next(self, timeout: float = 20) -> str:
        try:
            return self._lines.get(timeout=timeout).rstrip("\n")
        except queues.Empty:
            raise AssertionError(f"no line from the child within {timeout} s") from None


def test_a_follower_in_another_process_reads_the_items_live_and_in_order(
    queue_target: str, queue: Queue, gate: threading.Event
) -> None:
    @queue.task(name="sp.live")
    def live() -> int:
        for i in range(5):
            nbqueue.emit({"i": i, "text": f"item {i}"})
        assert gate.wait(30)  # held until the other process has read the first five
        for i in range(5, 300):
            nbqueue.emit({"i": i, "text": f"item {i}"})
            if i % 50 == 0:
                time.sleep(0.02)
        return 300

    job = live.enqueue()
    proc = subprocess.Popen(
        [sys.executable, "-c", FOLLOWER, queue_target, str(job.id)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=child_env(),
    )
    lines = Lines(proc)
    try:
        assert lines.next() == "ready"
        with queue.worker(**QUICK):
            first = [json.loads(lines.next()) for _ in range(5)]
            assert [item for _, item in first] == [{"i": i, "text": f"item {i}"} for i in range(5)]
            assert queue.get(job.id).status == "running"  # read while the job runs (held)
            gate.set()
            assert job.result(timeout=30) == 300
            finished = queue.get(job.id).finished_at
            rest = []
            while (line := lines.next()) != "end":
                rest.append(json.loads(line))
        assert proc.wait(timeout=30) == 0
    finally:
        gate.set()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.stderr is not None and proc.stderr.read() == ""
    seen = first + rest
    assert [item["i"] for _, item in seen] == list(range(300))  # all, in order, none twice
    assert finished is not None
    assert all(at < finished.timestamp() for at, _ in first)  # seen before the job finished


def test_process_mode_emits_from_the_child_in_order_before_the_outcome(queue: Queue, tmp_path: Path) -> None:
    go = tmp_path / "go"

    @queue.task(name="sp.child", max_retries=0)
    def child(path: str, n: int) -> dict[str, Any]:
        refused = ""
        nbqueue.emit({"pid": os.getpid()})
        try:
            nbqueue.emit({1, 2})  # refused at the call, in the child too
        except nbqueue.PayloadError as exc:
            refused = str(exc)
        deadline = time.monotonic() + 30
        while not os.path.exists(path) and time.monotonic() < deadline:
            time.sleep(0.02)
        for i in range(n):
            nbqueue.emit(i)
        return {"pid": os.getpid(), "refused": refused}

    @queue.task(name="sp.child_async")
    async def child_async(n: int) -> int:
        import asyncio

        for i in range(n):
            nbqueue.emit(f"t{i}")
            await asyncio.sleep(0)
        return n

    job = child.enqueue(str(go), 700)
    coro = child_async.enqueue(300)
    worker = queue.worker(lease=5, mode="process", concurrency=2, **QUICK).start()
    try:
        wait_until(lambda: list(job.stream(follow=False))[:1], 20, "the child's first item")
        assert queue.get(job.id).status == "running"  # read live, from the parent's writes
        go.touch()
        result = job.result(timeout=30)
        items = list(job.stream(follow=False))  # every item is stored once result() returns
        assert coro.result(timeout=30) == 300
        assert list(coro.stream(follow=False)) == [f"t{i}" for i in range(300)]
    finally:
        go.touch()
        worker.stop(timeout=10)
    assert result["pid"] != os.getpid()
    assert items == [{"pid": result["pid"]}, *range(700)]
    assert "emitted" in result["refused"]


def test_process_mode_retry_starts_a_new_stream(queue: Queue, tmp_path: Path) -> None:
    marker = tmp_path / "first attempt ran"

    @queue.task(name="sp.retry", max_retries=1, backoff=QUICK_RETRY)
    def flaky(marker: str) -> str:
        if not os.path.exists(marker):  # each attempt in a fresh child: a file tells them apart
            Path(marker).touch()
            nbqueue.emit("a")
            nbqueue.emit("b")
            raise ConnectionError("the first attempt fails after a and b")
        nbqueue.emit("c")
        return "ok"

    job = flaky.enqueue(str(marker))
    with queue.worker(lease=5, mode="process", **QUICK):
        assert job.result(timeout=30) == "ok"
    assert list(queue.attempts(job)["outcome"]) == ["failed", "completed"]
    assert list(job.stream()) == ["c"]
    assert list(job.stream(attempt=1)) == ["a", "b"]
    assert list(job.stream(attempt=2)) == ["c"]


def run_a_stale_child(q: Queue, clock: nbqueue.ManualClock, tmp_path: Path) -> tuple[list[Any], list[str]]:
    """A process-mode child held past its lease, recovered (max_retries=0: dead), then let go to
    emit on until its emit raises or its worker kills it (a stale child is killed once its worker
    sees the claim gone): the job's stream afterwards, and the child's log of its emits."""
    go, log = tmp_path / "go", tmp_path / "log"

    @q.task(name="sp.stale", max_retries=0)
    def held(go: str, log: str) -> str:
        def note(text: str) -> None:
            with open(log, "a") as file:
                file.write(text + "\n")

        note(f"pid {os.getpid()}")
        nbqueue.emit("before")
        deadline = time.monotonic() + 30
        while not os.path.exists(go) and time.monotonic() < deadline:
            time.sleep(0.02)
        try:
            for i in range(40):  # ~0.5 s: several of the child's batches, each refused upstairs
                nbqueue.emit(f"stale {i}")
                note(f"emitted {i}")
                time.sleep(0.01)
        except nbqueue.LeaseLost:
            note("lease lost")
            raise
        note("end")
        return "emitted on"

    def lines() -> list[str]:
        return log.read_text().splitlines() if log.exists() else []

    job = held.enqueue(str(go), str(log))
    worker = q.worker(lease=10, mode="process", **QUICK).start()
    try:
        wait_until(lambda: list(job.stream(follow=False)) == ["before"], 20, "the first item")
        pid = int(lines()[0].split()[1])
        clock.advance(11)  # the claim ran out
        wait_until(lambda: q.recover() or q.get(job.id).status == "dead", 10, "the job recovered")
        go.touch()
        wait_until(lambda: lines()[-1] in ("end", "lease lost") or not alive(pid), 20, "the stale child done")
        time.sleep(0.2)  # its items, if any were to be written, are written by now
    finally:
        go.touch()
        worker.stop(timeout=10)
    assert q.get(job.id).status == "dead"
    return list(job.stream()), lines()[1:]


def test_a_stale_process_mode_run_has_its_items_refused(
    clocked_queue: Queue, clock: nbqueue.ManualClock, tmp_path: Path
) -> None:
    items, log = run_a_stale_child(clocked_queue, clock, tmp_path)
    assert "emitted 0" in log  # it emitted on, stale, until a refused batch told it
    assert items == ["before"]  # none of the stale child's items stored


@pytest.mark.slow
def test_a_stale_process_mode_childs_emit_raises_lease_lost(
    clocked_queue: Queue, clock: nbqueue.ManualClock, tmp_path: Path
) -> None:
    _, log = run_a_stale_child(clocked_queue, clock, tmp_path)
    # as a thread-mode handler's emit does once a write was refused (a batch: within ~0.1 s)
    assert "lease lost" in log, log[-3:]


def test_dropped_notes_read_in_another_process(queue_target: str, queue: Queue) -> None:
    @queue.task(name="sp.bounded", stream_bytes=100)
    def bounded() -> int:
        for i in range(100):
            nbqueue.emit(f"{i:08d}")  # 10 bytes each: the newest 10 are kept
        return 100

    job = bounded.enqueue()
    with queue.worker(**QUICK):
        assert job.result(timeout=30) == 100
    reader = textwrap.dedent(
        """
        import json, sys
        import nbqueue

        q = nbqueue.Queue(sys.argv[1])
        items = list(q.get(int(sys.argv[2])).stream())
        note = nbqueue.Dropped
        print(json.dumps([["Dropped", i.count] if isinstance(i, note) else ["item", i] for i in items]))
        q.close()
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", reader, queue_target, str(job.id)],
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [["Dropped", 90]] + [["item", f"{i:08d}"] for i in range(90, 100)]
    assert list(job.stream()) == [Dropped(90)] + [f"{i:08d}" for i in range(90, 100)]
