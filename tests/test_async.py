"""Async jobs: coroutine handlers on the worker's own event loop, on both backends.

Real worker threads and a real event loop; the caller's loop is checked to stay free.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Any

import pytest

import nbqueue
from nbqueue import Queue
from tests.helpers import wait_until


def test_fifty_half_second_coroutines_finish_together_with_one_worker(queue: Queue) -> None:
    @queue.task(name="aio.nap")
    async def nap(i: int) -> int:
        await asyncio.sleep(0.5)
        return i

    jobs = [nap.enqueue(i) for i in range(50)]
    started = time.monotonic()
    with queue.worker(concurrency=1, lease=10) as worker:
        worker.run_until_idle(timeout=30)
    elapsed = time.monotonic() - started
    assert [queue.get(j.id).value for j in jobs] == list(range(50))
    assert elapsed < 5, f"50 coroutines of 0.5 s took {elapsed:.1f} s: they did not overlap"


def test_async_concurrency_caps_coroutines_in_flight(queue: Queue) -> None:
    lock = threading.Lock()
    now, peak = [0], [0]

    @queue.task(name="aio.capped")
    async def capped() -> None:
        with lock:
            now[0] += 1
            peak[0] = max(peak[0], now[0])
        await asyncio.sleep(0.1)
        with lock:
            now[0] -= 1

    for _ in range(30):
        capped.enqueue()
    with queue.worker(concurrency=2, async_concurrency=5, lease=10) as worker:
        worker.run_until_idle(timeout=30)
    assert queue.counts()["completed"] == 30
    assert 2 <= peak[0] <= 5


def test_each_coroutine_reports_to_its_own_job(queue: Queue) -> None:
    """64 coroutines share the loop; progress and printed output follow each across awaits."""

    @queue.task(name="aio.own")
    async def own(i: int) -> int:
        for step in range(3):
            print(f"job-{i} step {step}")
            nbqueue.progress(step + 1, 3, f"job-{i}")
            await asyncio.sleep(0.01 * (i % 7))
        return i

    jobs = [own.enqueue(i) for i in range(64)]
    with queue.worker(concurrency=2, async_concurrency=64, lease=10) as worker:
        worker.run_until_idle(timeout=60)
    for i, job in enumerate(jobs):
        done = queue.get(job.id)
        assert done.value == i
        assert done.output == "".join(f"job-{i} step {s}\n" for s in range(3))
        assert done.progress is not None and done.progress.message == f"job-{i}"


def test_a_timeout_interrupts_an_await(queue: Queue) -> None:
    reached: list[str] = []

    @queue.task(name="aio.slow", timeout=0.3, max_retries=0)
    async def slow() -> None:
        reached.append("start")
        await asyncio.sleep(30)
        reached.append("never")

    job = slow.enqueue()
    started = time.monotonic()
    with queue.worker(lease=10) as worker:
        worker.run_until_idle(timeout=20)
    done = queue.get(job.id)
    assert done.status == "dead" and "timed out" in (done.error or "")
    assert list(queue.attempts(job)["outcome"]) == ["timeout"]
    assert reached == ["start"]
    assert time.monotonic() - started < 5


def test_cancelling_a_running_coroutine_stops_it_at_its_next_await(queue: Queue) -> None:
    state: list[str] = []

    @queue.task(name="aio.long")
    async def long() -> None:
        state.append("running")
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            state.append("cancelled")
            raise

    @queue.task(name="aio.after")
    async def after() -> str:
        return "ran"

    job = long.enqueue()
    with queue.worker(concurrency=1, async_concurrency=1, lease=10):
        wait_until(lambda: state == ["running"], 10, "the coroutine running")
        queue.cancel(job.id)
        wait_until(lambda: "cancelled" in state, 10, "the coroutine cancelled")
        assert after.enqueue().result(timeout=10) == "ran"  # its slot came back
    assert queue.get(job.id).status == "cancelled"


def test_await_job_and_gather_keep_the_callers_loop_free(queue: Queue) -> None:
    @queue.task(name="aio.add")
    async def add(a: int, b: int) -> int:
        await asyncio.sleep(0.3)
        return a + b

    @queue.task(name="aio.broken", max_retries=0)
    async def broken() -> None:
        raise ValueError("no")

    async def main() -> tuple[Any, ...]:
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        beat = asyncio.create_task(ticker())
        a, b = add.enqueue(1, 2), add.enqueue(3, 4)
        first = await a
        both = await queue.gather([a, b])
        with pytest.raises(nbqueue.JobFailed, match="ValueError: no"):
            await broken.enqueue()
        beat.cancel()
        return first, both, ticks

    with queue.worker(lease=10):
        first, both, ticks = asyncio.run(main())
    assert first == 3 and both == [3, 7]
    assert ticks >= 15  # the loop ran its ticker while it waited


def test_wait_with_no_jobs_waits_for_every_unfinished_one(queue: Queue) -> None:
    @queue.task(name="aio.quick")
    async def quick(i: int) -> int:
        await asyncio.sleep(0.05)
        return i

    jobs = [quick.enqueue(i) for i in range(5)]
    with queue.worker(lease=10):
        done = queue.wait(timeout=20, progress=False)
    assert sorted(j.id for j in done) == sorted(j.id for j in jobs)
    assert all(j.status == "completed" for j in done)
    assert queue.wait(progress=False) == []  # nothing unfinished: returns at once


def test_run_sync_and_per_loop(queue: Queue) -> None:
    made: list[int] = []

    class Client:
        def __init__(self) -> None:
            made.append(1)
            self.loop = asyncio.get_running_loop()

    async def fetch(n: int) -> int:
        client = nbqueue.per_loop(Client)
        assert client.loop is asyncio.get_running_loop()
        await asyncio.sleep(0.01)
        return n * 2

    @queue.task(name="aio.sync_caller")
    def sync_caller(n: int) -> int:
        return nbqueue.run_sync(fetch(n)) + 1

    @queue.task(name="aio.async_caller")
    async def async_caller(n: int) -> int:
        return await fetch(n)

    jobs = [sync_caller.enqueue(i) for i in range(3)] + [async_caller.enqueue(i) for i in range(5)]
    with queue.worker(concurrency=1, lease=10) as worker:
        worker.run_until_idle(timeout=20)
    assert [queue.get(j.id).value for j in jobs] == [1, 3, 5, 0, 2, 4, 6, 8]
    assert len(made) == 2  # one client for the worker's loop, one for the sync thread's loop

    async def inside() -> None:
        with pytest.raises(nbqueue.NbqueueError, match="await it"):
            nbqueue.run_sync(fetch(1))

    asyncio.run(inside())


def test_an_object_of_the_callers_loop_used_in_a_job_is_explained(queue: Queue) -> None:
    """As with an async client made in a notebook cell: bound to the kernel's loop, used on the worker's."""
    made_in_a_cell = asyncio.Event()

    async def bind() -> None:
        loop_task = asyncio.create_task(made_in_a_cell.wait())
        await asyncio.sleep(0)
        loop_task.cancel()

    asyncio.run(bind())

    @queue.task(name="aio.uses_cell_object", max_retries=0)
    async def uses_cell_object() -> None:
        await made_in_a_cell.wait()

    job = uses_cell_object.enqueue()
    with queue.worker(lease=10) as worker:
        worker.run_until_idle(timeout=20)
    done = queue.get(job.id)
    assert done.status == "dead"
    assert "ForeignLoopError" in (done.error or "") and "per_loop" in (done.error or "")


@pytest.mark.slow  # real seconds: the loop is blocked for more than one
def test_a_coroutine_that_blocks_the_loop_is_logged_with_its_job_id(
    queue: Queue, caplog: pytest.LogCaptureFixture
) -> None:
    @queue.task(name="aio.blocker")
    async def blocker() -> str:
        time.sleep(1.6)  # blocking code inside a coroutine
        return "done"

    job = blocker.enqueue()
    with caplog.at_level(logging.WARNING, logger="nbqueue.worker"), queue.worker(lease=10) as worker:
        worker.run_until_idle(timeout=20)
    assert queue.get(job.id).value == "done"
    messages = [r.getMessage() for r in caplog.records if "blocked the worker's event loop" in r.getMessage()]
    assert messages and f"job {job.id}" in messages[0]


def test_an_async_handler_runs_in_process_mode(queue: Queue) -> None:
    @queue.task(name="aio.in_child")
    async def in_child(n: int) -> int:
        await asyncio.sleep(0.05)
        return n + 1

    job = in_child.enqueue(41)
    with queue.worker(mode="process", lease=20) as worker:
        worker.run_until_idle(timeout=60)
    assert queue.get(job.id).value == 42


def test_a_coroutine_job_is_retried_like_any_other(queue: Queue) -> None:
    calls: list[int] = []

    @queue.task(name="aio.flaky", max_retries=2, backoff=nbqueue.Backoff(base=0, cap=0, jitter=0))
    async def flaky() -> str:
        calls.append(1)
        await asyncio.sleep(0)
        if len(calls) < 3:
            raise ConnectionError("try again")
        return "third time"

    job = flaky.enqueue()
    with queue.worker(lease=10):
        assert job.result(timeout=20) == "third time"
    assert queue.get(job.id).retries == 2


NOISY = """
import asyncio, sys, warnings
import nbqueue

q = nbqueue.Queue(sys.argv[1])

@q.task(name="aio.noisy")
async def noisy():
    warnings.warn("careful now", UserWarning, stacklevel=1)
    print("to stderr", file=sys.stderr)
    await asyncio.sleep(0)
    return "ok"

job = noisy.enqueue()
with q.worker(lease=10) as worker:
    worker.run_until_idle(timeout=20)
print(repr(q.get(job.id).output))
"""


def test_warnings_and_stderr_of_a_job_go_into_its_record(queue_target: str) -> None:
    """In a process of its own (pytest records warnings itself): nothing reaches the process's stderr."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    done = subprocess.run(
        [sys.executable, "-c", NOISY, queue_target],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        env={**os.environ, "PYTHONPATH": str(root)},
    )
    assert "careful now" in done.stdout and "to stderr" in done.stdout
    assert done.stderr == ""
