"""The in-process worker: real threads running real jobs on a real file."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest

import nbqueue
from nbqueue import Backoff, Queue, tasks
from nbqueue.keeper import Housekeeping


def test_worker_runs_tasks(queue: Queue) -> None:
    @queue.task
    def square(x: int) -> int:
        return x * x

    jobs = [square.enqueue(i) for i in range(10)]
    worker = queue.worker(lease=5)
    worker.run_until_idle(timeout=20)
    assert [queue.get(j.id).value for j in jobs] == [i * i for i in range(10)]
    assert queue.counts()["completed"] == 10
    assert not worker.running
    assert worker.completed == 10


def test_run_until_idle_does_not_wait_for_later_retries(queue: Queue) -> None:
    @queue.task(max_retries=3, backoff=Backoff(base=600, cap=600, jitter=0))
    def flaky() -> None:
        raise RuntimeError("try again later")

    @queue.task
    def fine() -> str:
        return "ok"

    bad = flaky.enqueue()
    good = fine.enqueue()
    later = fine.schedule(delay=600)
    queue.worker(lease=5).run_until_idle(timeout=20)
    failed = queue.get(bad.id)
    assert failed.status == "failed"
    assert (failed.attempts, failed.retries) == (1, 1)
    assert queue.get(good.id).status == "completed"
    assert queue.get(later.id).status == "pending"


def test_raising_handler_fails_the_job_with_its_traceback(queue: Queue) -> None:
    @queue.task(max_retries=0)
    def explode(n: int) -> None:
        raise ValueError(f"kaboom {n}")

    job = explode.enqueue(7)
    queue.worker(lease=5).run_until_idle(timeout=20)
    dead = queue.get(job.id)
    assert dead.status == "dead"
    assert "Traceback (most recent call last)" in (dead.error or "")
    assert "in explode" in (dead.error or "")
    assert "ValueError: kaboom 7" in (dead.error or "")
    with pytest.raises(nbqueue.JobFailed, match="kaboom 7"):
        job.result(timeout=5)


def test_worker_claims_only_tasks_it_knows(queue: Queue) -> None:
    @queue.task(name="known")
    def known() -> str:
        return "ran"

    @queue.task(name="gone.away")
    def gone() -> str:
        return "should not run"

    orphan = gone.enqueue()
    tasks.unregister("gone.away")  # as in a worker process that never imported it
    raw = queue.enqueue({"raw": "payload"})  # no task at all: only claim() takes these
    ok = known.enqueue()
    worker = queue.worker(lease=5)
    worker.run_until_idle(timeout=20)
    assert queue.get(ok.id).status == "completed"
    for job_id in (orphan.id, raw.id):
        left = queue.get(job_id)
        assert left.status == "pending"  # never dropped, never failed
        assert left.attempts == 0
        assert left.error is None
    # Once the handler is known again, the job runs.
    queue.task(name="gone.away")(lambda: "back")
    queue.worker(lease=5).run_until_idle(timeout=20)
    assert queue.get(orphan.id).value == "back"
    assert queue.get(raw.id).status == "pending"


def test_concurrency_runs_jobs_in_parallel(queue: Queue) -> None:
    barrier = threading.Barrier(4, timeout=10)

    @queue.task(max_retries=0)
    def meet(i: int) -> int:
        barrier.wait()  # breaks (and the job dies) unless all four run at the same time
        return i

    jobs = [meet.enqueue(i) for i in range(4)]
    with queue.worker(concurrency=4, lease=30):
        results = [job.result(timeout=20) for job in jobs]
    assert results == [0, 1, 2, 3]
    assert not barrier.broken


@pytest.mark.slow  # real seconds: a job outlives its lease
def test_heartbeats_keep_a_long_job_alive(queue: Queue) -> None:
    @queue.task(max_retries=3)
    def slow() -> str:
        time.sleep(1.2)
        return "done"

    job = slow.enqueue()
    with queue.worker(lease=0.3):
        assert job.result(timeout=20) == "done"
    done = queue.get(job.id)
    assert done.attempts == 1
    assert done.retries == 0
    assert done.error is None


def test_task_timeout_fails_a_hung_job(queue: Queue, gate: threading.Event) -> None:
    @queue.task(timeout=0.3, max_retries=0)
    def hang() -> str:
        gate.wait(20)
        return "too late"

    job = hang.enqueue()
    with queue.worker(lease=5):
        with pytest.raises(nbqueue.JobFailed, match="timed out"):
            job.result(timeout=15)
        gate.set()
    dead = queue.get(job.id)
    assert dead.status == "dead"
    assert "timed out" in (dead.error or "")
    assert dead.result_json is None


def test_stop_releases_a_running_job(queue: Queue, gate: threading.Event) -> None:
    started = threading.Event()

    @queue.task
    def hang() -> str:
        started.set()
        gate.wait(20)
        return "finished"

    job = hang.enqueue()
    worker = queue.worker(lease=30).start()
    assert started.wait(10)
    assert queue.get(job.id).status == "running"
    worker.stop(timeout=0.2)
    released = queue.get(job.id)
    assert released.status == "pending"
    assert released.retries == 0
    assert released.error is None
    gate.set()  # the old handler returns now; its result must be discarded
    time.sleep(0.2)
    assert queue.get(job.id).status == "pending"
    # A later worker runs it again, and this time it completes.
    queue.worker(lease=30).run_until_idle(timeout=20)
    assert queue.get(job.id).value == "finished"
    assert queue.get(job.id).attempts == 2


def test_context_manager_starts_and_stops(queue: Queue) -> None:
    @queue.task
    def hello() -> str:
        return "hi"

    with queue.worker(lease=5) as worker:
        assert isinstance(worker, nbqueue.Worker)
        assert worker.running
        assert hello.enqueue().result(timeout=10) == "hi"
    assert not worker.running


def test_job_output_is_captured_not_printed(queue: Queue, capfd: pytest.CaptureFixture[str]) -> None:
    @queue.task
    def chatty() -> int:
        print("hello from the job")
        print("a warning from the job", file=sys.stderr)
        return 1

    job = chatty.enqueue()
    queue.worker(lease=5).run_until_idle(timeout=20)
    print("printed by the test itself")
    out, err = capfd.readouterr()
    done = queue.get(job.id)
    assert done.status == "completed"
    assert "hello from the job" in (done.output or "")
    assert "a warning from the job" in (done.output or "")
    assert "hello from the job" not in out
    assert "a warning from the job" not in err
    assert "printed by the test itself" in out  # other threads still print normally


@pytest.mark.parametrize(("max_retries", "status"), [(0, "dead"), (1, "failed")])
def test_a_failed_jobs_printed_output_is_kept_with_its_error(
    queue: Queue, max_retries: int, status: str
) -> None:
    @queue.task(max_retries=max_retries, backoff=Backoff(base=600, cap=600, jitter=0))
    def noisy() -> None:
        print("fetched 3 of 5 pages")
        print("about to give up", file=sys.stderr)
        raise ValueError("page 4 is broken")

    job = noisy.enqueue()
    queue.worker(lease=5).run_until_idle(timeout=20)  # the retry, if any, is ten minutes away
    failed = queue.get(job.id)
    assert failed.status == status
    assert "fetched 3 of 5 pages" in (failed.output or "")
    assert "about to give up" in (failed.output or "")
    assert "ValueError: page 4 is broken" in (failed.error or "")


def test_enqueue_wakes_an_idle_worker(queue: Queue) -> None:
    @queue.task
    def ping() -> str:
        return "pong"

    with queue.worker(lease=5) as worker:
        time.sleep(0.3)  # let it go idle
        assert worker.running
        job = ping.enqueue()
        assert job.result(timeout=2) == "pong"


def test_an_idle_worker_stops_at_once_whatever_its_idle_interval(queue: Queue) -> None:
    """stop() wakes the runners it waits for until they end: a runner that had checked for
    stopping just before stop() and only then began its idle wait missed the one wake-up and
    slept out its whole idle_interval (on PostgreSQL, 0.5 s at most run_until_idle calls; 20 s here)."""

    @queue.task(name="known")
    def known() -> str:
        return "ran"

    queue.enqueue({"raw": "payload"})  # pending, but no worker runs it
    for _ in range(3):
        known.enqueue()
        began = time.monotonic()
        queue.worker(lease=5, idle_interval=20).run_until_idle(timeout=60)
        assert time.monotonic() - began < 5, "stop() waited out an idle runner's interval"
    assert (queue.counts()["completed"], queue.counts()["pending"]) == (3, 1)


def test_worker_rejects_bad_options(queue: Queue) -> None:
    for options in ({"concurrency": 0}, {"concurrency": 1.5}, {"lease": 0}, {"lease": -1}):
        with pytest.raises(nbqueue.InvalidArgument):
            queue.worker(**options)
    periods = ("cancel_interval", "periodic_interval", "tidy_interval", "idle_interval", "prune_interval")
    for name in periods:
        for bad in (0, -1, float("nan"), "1s", True, *([] if name == "prune_interval" else [None])):
            with pytest.raises(nbqueue.InvalidArgument, match=name):
                queue.worker(**{name: bad})


def test_the_keepers_periods_are_settings_of_the_worker(queue: Queue) -> None:
    """The documented defaults, and a test's own shorter periods (seconds or a timedelta)."""
    worker = queue.worker()
    assert (worker.cancel_interval, worker.idle_interval) == (0.5, 0.5)
    assert (worker.housekeeping.periodic, worker.housekeeping.tidy) == (1.0, 10.0)
    assert (worker.housekeeping.recover, queue.worker(lease=1).housekeeping.recover) == (2.0, 0.25)
    assert [queue.worker(retention=r).housekeeping.prune for r in (5, 100, 3600)] == [1.0, 10.0, 60.0]
    quick = queue.worker(
        cancel_interval=0.05,
        periodic_interval=timedelta(milliseconds=50),
        tidy_interval=1,
        idle_interval=0.01,
        prune_interval=0.05,
        recover_interval=0.1,
    )
    assert (quick.cancel_interval, quick.idle_interval) == (0.05, 0.01)
    assert quick.housekeeping == Housekeeping(recover=0.1, periodic=0.05, tidy=1.0, prune=0.05)


EXIT_SCRIPT = """
import atexit, io, sys
import nbqueue

def main(path, how):
    stream = io.StringIO()
    if how == "replaced":
        sys.stdout = stream  # like a kernel's own stdout, which it closes at shutdown
    q = nbqueue.Queue(path)

    @q.task(name="chatty")
    def chatty():
        print("hello from the job")
        return 1

    job = chatty.enqueue()
    q.worker(lease=5).run_until_idle(timeout=30)
    assert q.get(job.id).output.strip() == "hello from the job"
    q.close()
    (stream if how == "replaced" else sys.__stdout__).close()  # the router's stream, gone
    atexit.register(print, "a last word at exit")  # written to the router as the interpreter ends

main(sys.argv[1], sys.argv[2])
"""


@pytest.mark.parametrize("how", ["replaced", "closed"])
def test_a_closed_stdout_at_interpreter_exit_leaves_no_traceback(tmp_path: Path, how: str) -> None:
    """The worker's output router stays in sys.stdout after its jobs; a write or flush at exit to a
    stream that was closed meanwhile goes nowhere quietly (it raised ValueError)."""
    script = tmp_path / "exits.py"
    script.write_text(EXIT_SCRIPT)
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "jobs.db"), how],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    assert "Exception ignored" not in done.stderr
    assert done.stderr == ""
