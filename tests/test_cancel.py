"""Cancelling a running job: nbqueue.progress() raises Cancelled, nbqueue.cancelled() turns true,
process mode kills the child, and the board's button does it too.

Real worker threads, real child processes, real files and the real PostgreSQL server.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

import nbqueue
from nbqueue import Queue
from tests.helpers import alive, kill_all, read_pids, wait_until, write_pid


@pytest.mark.parametrize("style", ["progress", "cancelled"])
def test_cancelling_a_running_job_stops_its_handler(queue: Queue, style: str) -> None:
    started = threading.Event()
    stopped: list[str] = []

    @queue.task(name="lr.loop")
    def loop() -> str:
        started.set()
        deadline = time.monotonic() + 30
        try:
            while time.monotonic() < deadline:
                if style == "progress":
                    nbqueue.progress(1, None, "looping")
                elif nbqueue.cancelled():
                    stopped.append("saw cancelled()")
                    return "stopped early"
                time.sleep(0.01)
        except nbqueue.Cancelled:
            stopped.append("raised Cancelled")
            raise
        return "ran to the end"

    @queue.task(name="lr.after")
    def after() -> str:
        return "still working"

    job = loop.enqueue()
    # one runner: the next job needs the freed thread
    worker = queue.worker(lease=5, cancel_interval=0.05).start()
    try:
        assert started.wait(20)
        assert queue.get(job.id).status == "running"
        assert queue.cancel(job.id).status == "cancelled"
        wait_until(lambda: stopped, 10, "the handler stopped")
        assert after.enqueue().result(timeout=20) == "still working"
    finally:
        worker.stop(timeout=10)
    assert stopped == (["raised Cancelled"] if style == "progress" else ["saw cancelled()"])
    final = queue.get(job.id)
    assert final.status == "cancelled"
    assert final.result_json is None
    with pytest.raises(nbqueue.JobFailed, match="cancelled"):
        job.result(timeout=5)


def test_cancelling_a_running_process_mode_job_kills_its_process(queue: Queue, tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"

    @queue.task(name="lr.hang_until_cancelled")
    def hang(path: str) -> str:
        write_pid(path)
        time.sleep(60)
        return "never"

    job = hang.enqueue(str(pid_file))
    worker = queue.worker(lease=5, mode="process", cancel_interval=0.05).start()
    try:
        wait_until(lambda: read_pids(pid_file), 20, "the child started")
        [pid] = read_pids(pid_file)
        assert alive(pid)
        assert queue.cancel(job.id).status == "cancelled"
        wait_until(lambda: not alive(pid), 10, "the child killed")
        wait_until(lambda: worker.status()["in_flight"] == [], 10, "the worker free")
    finally:
        worker.stop(timeout=10)
        kill_all(read_pids(pid_file))
    final = queue.get(job.id)
    assert final.status == "cancelled"
    assert final.result_json is None


def test_board_shows_progress_and_its_button_cancels_a_running_job(queue: Queue) -> None:
    from nbqueue.jupyter.views import JobBoard

    stopped: list[str] = []

    @queue.task(name="lr.watched")
    def watched() -> str:
        nbqueue.progress(1, 4, "a quarter")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if nbqueue.cancelled():
                stopped.append("cancelled")
                return "stopped"
            time.sleep(0.01)
        return "ran to the end"

    job = watched.enqueue()
    board = JobBoard(queue, interval=0)
    worker = queue.worker(lease=5, cancel_interval=0.05).start()
    try:

        def bar_shown() -> bool:
            # The counts and the rows are two reads: a refresh may count the job pending just
            # before the worker claims it and then list it with its progress. The next one agrees.
            board.refresh()
            return "data-percent='25'" in board.table.value and board.counts["running"] == 1

        wait_until(bar_shown, 20, "the progress bar on the board, the job counted running")
        assert "a quarter" in board.table.value
        board.select(job.id)
        assert not board.cancel_button.disabled
        board.cancel_button.click()
        assert f"cancelled job {job.id}" in board.message.value
        assert queue.get(job.id).status == "cancelled"
        wait_until(lambda: stopped, 10, "the handler stopped")
        assert board.cancel_button.disabled  # a finished job cannot be cancelled again
    finally:
        worker.stop(timeout=10)
        board.close()
    assert stopped == ["cancelled"]
    board.refresh()
    assert board.counts["cancelled"] == 1


def test_cancelling_a_handler_that_never_checks_hands_its_slot_on(queue: Queue) -> None:
    """Like a timeout: the stuck thread is left to its handler and a new runner takes the next job."""
    started = threading.Event()

    @queue.task(name="lr.deaf")
    def deaf() -> str:
        started.set()
        time.sleep(5)  # never calls progress() or cancelled()
        return "ran to the end"

    @queue.task(name="lr.next_in_line")
    def next_in_line() -> str:
        return "ran"

    job = deaf.enqueue()
    worker = queue.worker(lease=5, concurrency=1, cancel_interval=0.05).start()
    try:
        assert started.wait(20)
        assert queue.cancel(job.id).status == "cancelled"
        cancelled_at = time.monotonic()
        following = next_in_line.enqueue()
        assert following.result(timeout=10) == "ran"
        took = time.monotonic() - cancelled_at
        assert took < 1.5, f"the next job waited {took:.2f} s for the cancelled handler's slot"
        assert worker.status()["in_flight"] == []
    finally:
        assert worker.stop(timeout=10)
    assert queue.get(job.id).status == "cancelled"
    assert queue.get(job.id).result_json is None


@pytest.mark.slow
def test_the_default_cancel_interval_stops_a_handler_within_about_half_a_second(queue: Queue) -> None:
    """The other tests look every 0.05 s (cancel_interval); a worker left to its default looks
    every 0.5 s, in real time."""
    started = threading.Event()

    @queue.task(name="lr.default_period")
    def loop() -> str:
        started.set()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not nbqueue.cancelled():
            time.sleep(0.01)
        return "stopped"

    job = loop.enqueue()
    with queue.worker(lease=5) as worker:
        assert worker.cancel_interval == 0.5
        assert started.wait(20)
        queue.cancel(job.id)
        cancelled_at = time.monotonic()
        wait_until(lambda: worker.status()["in_flight"] == [], 10, "the handler stopped")
        took = time.monotonic() - cancelled_at
    assert took < 1.5, f"the cancel was seen after {took:.2f} s, not within the 0.5 s period"
    assert queue.get(job.id).status == "cancelled"
