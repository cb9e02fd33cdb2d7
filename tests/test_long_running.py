"""Long-running work: progress, timeouts, process mode, cancellation, periodic tasks, retention, hooks.

Real worker threads, real child processes, real files and the real PostgreSQL server; the
manual clock only where a schedule or an age must be exact.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit, urlunsplit

import pytest

import nbqueue
from nbqueue import Backoff, Progress, Queue, tasks
from nbqueue import context as job_context
from nbqueue import worker as worker_module
from nbqueue.schedule import Cron, Every, make
from tests.helpers import wait_until

MakeQueue = Callable[..., Queue]
QUICK_RETRY = Backoff(base=0.1, cap=0.1, jitter=0)  # a retry is due a tenth of a second later
START = datetime(2023, 11, 14, 22, 13, 20, tzinfo=UTC)  # ManualClock's default start


def alive(pid: int) -> bool:
    """True while a process with this pid exists (a reaped child no longer does)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def kill_all(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def read_pids(path: Path) -> list[int]:
    if not path.exists():
        return []
    return [int(line) for line in path.read_text().splitlines() if line.strip()]


def write_pid(path: str) -> None:
    with open(path, "a") as file:
        file.write(f"{os.getpid()}\n")


@pytest.fixture(autouse=True)
def _isolated_periodics() -> Iterator[None]:
    """conftest restores the task registry but not the periodic one: do that here."""
    with tasks._registry_lock:
        saved = dict(tasks._periodic)
        tasks._periodic.clear()
    yield
    with tasks._registry_lock:
        tasks._periodic.clear()
        tasks._periodic.update(saved)


@pytest.fixture
def gate() -> Iterator[threading.Event]:
    """An event stuck handlers wait on; always opened at teardown so no thread stays stuck."""
    event = threading.Event()
    yield event
    event.set()


# -- progress ----------------------------------------------------------------------


def test_progress_moves_while_the_job_runs(queue: Queue) -> None:
    seen = [threading.Event() for _ in range(4)]  # seen[i]: the test has read step i

    @queue.task(name="lr.crawl")
    def crawl(pages: int) -> int:
        for i in range(1, pages + 1):
            while not seen[i].wait(0.02):  # a real loop reports often; throttling keeps a few
                nbqueue.progress(i, pages, f"page {i} of {pages}")
        return pages

    job = crawl.enqueue(3)
    observed: list[Progress | None] = [job.progress]
    try:
        with queue.worker(lease=5):
            for step in range(1, 4):
                wait_until(
                    lambda step=step: job.refresh().progress is not None and job.progress.done == step,
                    what=f"progress step {step}",
                )
                observed.append(job.progress)
                seen[step].set()
            assert job.result(timeout=10) == 3
    finally:
        for event in seen:
            event.set()
    assert observed == [None] + [Progress(i, 3, f"page {i} of 3") for i in range(1, 4)]
    assert [p.fraction for p in observed[1:] if p is not None] == [1 / 3, 2 / 3, 1.0]
    assert job.refresh().progress == Progress(3, 3, "page 3 of 3")  # the last report stays readable


def _count_progress_writes(queue: Queue) -> Callable[[], list[float]]:
    """A real trigger on the jobs table records every write of progress; returns a reader."""
    target = str(queue.target)
    if "://" not in target:
        with sqlite3.connect(target) as conn:
            conn.executescript(
                "CREATE TABLE lr_progress_writes (done REAL);"
                "CREATE TRIGGER lr_count_progress AFTER UPDATE OF progress_done ON nbqueue_jobs "
                "BEGIN INSERT INTO lr_progress_writes VALUES (NEW.progress_done); END;"
            )

        def read_sqlite() -> list[float]:
            with sqlite3.connect(target) as conn:
                return [row[0] for row in conn.execute("SELECT done FROM lr_progress_writes ORDER BY rowid")]

        return read_sqlite

    import psycopg

    parts = urlsplit(target)
    schema = parse_qs(parts.query)["schema"][0]
    server = urlunsplit(parts._replace(query=""))
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(f'CREATE TABLE "{schema}".lr_progress_writes (n serial, done double precision)')
        conn.execute(
            f'CREATE FUNCTION "{schema}".lr_count_progress() RETURNS trigger LANGUAGE plpgsql AS '
            f'$$ BEGIN INSERT INTO "{schema}".lr_progress_writes (done) VALUES (NEW.progress_done); '
            "RETURN NEW; END $$"
        )
        conn.execute(
            f'CREATE TRIGGER lr_count_progress AFTER UPDATE OF progress_done ON "{schema}".nbqueue_jobs '
            f'FOR EACH ROW EXECUTE FUNCTION "{schema}".lr_count_progress()'
        )

    def read_postgres() -> list[float]:
        with psycopg.connect(server) as conn:
            rows = conn.execute(f'SELECT done FROM "{schema}".lr_progress_writes ORDER BY n').fetchall()
        return [row[0] for row in rows]

    return read_postgres


def test_progress_in_a_tight_loop_is_throttled(queue: Queue) -> None:
    writes = _count_progress_writes(queue)

    @queue.task(name="lr.tight")
    def tight(n: int) -> float:
        started = time.monotonic()
        for i in range(1, n + 1):
            nbqueue.progress(i, n, "tight loop")
        return time.monotonic() - started

    job = tight.enqueue(10_000)
    queue.worker(lease=5).run_until_idle(timeout=60)
    elapsed = job.result(timeout=5)
    done = [d for d in writes() if d is not None]  # None: the claim clearing an earlier attempt's
    # The first report is written, then at most one per THROTTLE seconds, and the last one always.
    assert 2 <= len(done) <= 2 + elapsed / job_context.THROTTLE
    assert done[0] == 1 and done[-1] == 10_000
    assert done == sorted(done)
    assert job.refresh().progress == Progress(10_000, 10_000, "tight loop")


def test_progress_and_cancelled_outside_a_job_do_nothing() -> None:
    assert nbqueue.progress(1, 2, "not in a job") is None
    assert nbqueue.progress(5) is None
    assert nbqueue.cancelled() is False

    def handler(n: int) -> int:
        for i in range(n):
            nbqueue.progress(i, n)
            assert not nbqueue.cancelled()
        return n

    assert handler(3) == 3  # a plain call of a task's function works as before


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [
        (("1",), {}),
        ((None,), {}),
        ((True,), {}),
        ((float("nan"),), {}),
        ((float("inf"),), {}),
        ((1, "10"), {}),
        ((1, float("nan")), {}),
        ((1, False), {}),
        ((1, 2), {"message": 3}),
        ((1, 2), {"message": None}),
    ],
)
def test_bad_progress_arguments_are_refused(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    with pytest.raises(nbqueue.InvalidArgument):
        nbqueue.progress(*args, **kwargs)


def test_wait_with_a_progress_bar_follows_a_reporting_job(queue: Queue) -> None:
    @queue.task(name="lr.steps")
    def steps(n: int) -> int:
        for i in range(n):
            nbqueue.progress(i, n, f"step {i}")
            time.sleep(0.1)
        nbqueue.progress(n, n, "all done")
        return n

    job = steps.enqueue(6)
    with queue.worker(lease=5):
        [done] = queue.wait([job], timeout=30, progress=True)
    assert done.status == "completed"
    assert done.value == 6
    assert done.progress == Progress(6, 6, "all done")


# -- timeouts in the thread worker --------------------------------------------------


def test_thread_timeout_fails_retries_keeps_capacity_and_refuses_the_late_result(
    queue: Queue, gate: threading.Event
) -> None:
    returned: list[str] = []
    deaths: list[nbqueue.Job] = []

    @queue.task(name="lr.stuck", max_retries=1, timeout=0.5, backoff=QUICK_RETRY, on_dead=deaths.append)
    def stuck() -> str:
        gate.wait(30)  # ignores the timeout: a thread cannot be killed
        returned.append("late")
        return "late"

    @queue.task(name="lr.quick")
    def quick(x: int) -> int:
        return x + 1

    job = stuck.enqueue()
    worker = queue.worker(lease=5).start()  # one runner
    try:
        wait_until(lambda: deaths, 20, "the timed-out job dead")
        dead = queue.get(job.id)
        assert dead.status == "dead"
        assert dead.attempts == 2  # max_retries=1: ran twice
        assert "timed out after 0.5 s" in (dead.error or "")
        assert [d.id for d in deaths] == [job.id]
        assert deaths[0].status == "dead"
        # Both attempts' handlers still sleep, yet the worker runs other jobs.
        assert quick.enqueue(1).result(timeout=20) == 2
        assert returned == []
    finally:
        gate.set()
        stopped = worker.stop(timeout=20)  # does not wait for the abandoned, stuck threads
    assert stopped
    wait_until(lambda: len(returned) == 2, 10, "the stuck handlers to return once released")
    assert returned == ["late", "late"]
    final = queue.get(job.id)
    assert final.status == "dead"
    assert final.result_json is None
    assert final.attempts == 2
    assert (worker.completed, worker.failed) == (1, 2)


def test_a_timed_out_attempt_returning_during_its_retry_is_refused(queue: Queue) -> None:
    gates = [threading.Event(), threading.Event()]
    runs: list[threading.Thread] = []

    @queue.task(name="lr.two_gates", backoff=QUICK_RETRY)
    def two_gates() -> str:
        attempt = len(runs)
        runs.append(threading.current_thread())
        gates[attempt].wait(30)
        return f"attempt {attempt + 1}"

    job = two_gates.schedule(timeout=1.5, max_retries=1)  # a per-job timeout; the task has none
    assert job.timeout == 1.5
    worker = queue.worker(lease=5).start()
    try:
        wait_until(lambda: len(runs) == 2, 20, "the retry running")
        gates[0].set()  # the first attempt returns now, while the second one holds the claim
        runs[0].join(10)
        assert not runs[0].is_alive()
        during = queue.get(job.id)
        assert during.status == "running"
        assert during.attempts == 2
        assert during.result_json is None
        gates[1].set()
        assert job.result(timeout=20) == "attempt 2"
    finally:
        for event in gates:
            event.set()
        worker.stop(timeout=20)
    assert queue.get(job.id).attempts == 2


def test_run_until_idle_returns_once_a_timed_out_job_is_failed(tmp_path: Path, gate: threading.Event) -> None:
    """The timed-out job is dead and nothing else is due: the abandoned thread is not work in hand."""
    q = Queue(tmp_path / "jobs.db")

    @q.task(name="lr.abandoned_thread", max_retries=0, timeout=0.3)
    def stuck() -> str:
        gate.wait(30)
        return "late"

    job = stuck.enqueue()
    worker = q.worker(lease=5).start()
    try:
        wait_until(lambda: q.get(job.id).status == "dead", 10, "the timed-out job dead")
        worker.run_until_idle(timeout=3)  # raises WaitTimeout while the stuck handler sleeps
    finally:
        gate.set()
        worker.stop(timeout=10)
        q.close()


def test_stop_does_not_wait_for_a_timed_out_handler(tmp_path: Path, gate: threading.Event) -> None:
    """Nothing runs any more: stop() need not sit out its whole timeout for an abandoned thread."""
    q = Queue(tmp_path / "jobs.db")

    @q.task(name="lr.abandoned_at_stop", max_retries=0, timeout=0.3)
    def stuck() -> str:
        gate.wait(60)
        return "late"

    job = stuck.enqueue()
    worker = q.worker(lease=5).start()
    stopped: list[bool] = []
    stopper = threading.Thread(target=lambda: stopped.append(worker.stop(timeout=60)))
    try:
        wait_until(lambda: q.get(job.id).status == "dead", 10, "the timed-out job dead")
        stopper.start()
        wait_until(lambda: stopped, 5, "stop() returning while the abandoned handler still sleeps")
        assert stopped == [True]
        assert not gate.is_set()
    finally:
        gate.set()
        if stopper.is_alive():
            stopper.join(10)
        q.close()


def test_a_cooperative_handler_is_stopped_at_its_timeout(queue: Queue) -> None:
    stopped: list[str] = []

    @queue.task(name="lr.cooperative", max_retries=0, timeout=0.5)
    def cooperative() -> str:
        deadline = time.monotonic() + 30
        try:
            while time.monotonic() < deadline:
                nbqueue.progress(1, None, "working")
                time.sleep(0.01)
        except nbqueue.Cancelled:
            stopped.append("told to stop")
            raise
        return "ran to the end"

    job = cooperative.enqueue()
    worker = queue.worker(lease=5).start()
    try:
        with pytest.raises(nbqueue.JobFailed, match="timed out"):
            job.result(timeout=20)
        wait_until(lambda: stopped, 10, "the handler stopped")
    finally:
        worker.stop(timeout=20)
    assert stopped == ["told to stop"]
    assert queue.get(job.id).status == "dead"


# -- process mode --------------------------------------------------------------------


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
        from nbqueue.storage import sqlite as sqlite_storage

        lock = getattr(sqlite_storage, "_write_locks", {}).get(path)
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
        from nbqueue.storage import sqlite as sqlite_storage

        if str(q.target) not in getattr(sqlite_storage, "_write_locks", {}):
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


# -- cancelling running jobs -----------------------------------------------------------


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
    worker = queue.worker(lease=5).start()  # one runner: the next job needs the freed thread
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
    worker = queue.worker(lease=5, mode="process").start()
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


# -- periodic tasks --------------------------------------------------------------------


def tick_together(queues: list[Queue]) -> list[list[str]]:
    """Every queue ticks at the same moment, each in its own thread."""
    barrier = threading.Barrier(len(queues), timeout=10)
    results: list[Any] = [None] * len(queues)

    def tick(i: int) -> None:
        barrier.wait()
        try:
            results[i] = queues[i]._tick_periodic()
        except BaseException as exc:
            results[i] = exc

    threads = [threading.Thread(target=tick, args=(i,)) for i in range(len(queues))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return results


def keys(queue: Queue) -> list[str]:
    return [job.key or "" for job in reversed(queue.jobs(limit=1000))]


@pytest.mark.parametrize("plan", [{"every": timedelta(minutes=5)}, {"cron": "*/5 * * * *"}], ids=str)
def test_each_periodic_slot_is_enqueued_once_by_three_queues(
    make_queue: MakeQueue, clock: nbqueue.ManualClock, plan: dict[str, Any]
) -> None:
    queues = [make_queue(clock=clock) for _ in range(3)]

    @queues[0].periodic(name="lr.tick", args=(3,), **plan)
    def tick(n: int) -> int:
        return n

    # First sighting: the current slot (22:10) is recorded, nothing is enqueued.
    assert tick_together(queues) == [[], [], []]
    assert queues[0].counts()["pending"] == 0
    clock.advance(4 * 60)  # 22:17:20: the 22:15 slot
    assert sorted(tick_together(queues)) == [[], [], ["lr.tick"]]
    assert tick_together(queues) == [[], [], []]  # the same slot again: nothing
    clock.advance(60)  # 22:18:20: still the 22:15 slot
    assert tick_together(queues) == [[], [], []]
    assert keys(queues[1]) == ["periodic:lr.tick:2023-11-14T22:15:00+00:00"]

    clock.advance(timedelta(hours=3))  # nothing ran for three hours: one job, for the latest slot
    assert sorted(tick_together(queues)) == [[], [], ["lr.tick"]]
    assert keys(queues[2]) == [
        "periodic:lr.tick:2023-11-14T22:15:00+00:00",
        "periodic:lr.tick:2023-11-15T01:15:00+00:00",
    ]
    jobs = queues[0].jobs()
    assert {job.task for job in jobs} == {"lr.tick"}
    assert all(job.args == [3] and job.status == "pending" for job in jobs)


def test_a_cron_task_is_enqueued_once_per_slot_with_three_workers(
    make_queue: MakeQueue, clock: nbqueue.ManualClock
) -> None:
    queues = [make_queue(clock=clock) for _ in range(3)]
    ran: list[int] = []

    @queues[0].periodic(cron="*/5 * * * *", name="lr.cron")
    def every_five_minutes() -> int:
        ran.append(1)
        return len(ran)

    assert queues[0]._tick_periodic() == []  # first sighting, before any worker runs
    workers = [q.worker(lease=5) for q in queues]
    try:
        for worker in workers:
            worker.start()
        clock.advance(timedelta(minutes=5))  # 22:18:20: the 22:15 slot
        wait_until(lambda: ran, 10, "the slot's job run")
        time.sleep(1.3)  # every worker's keeper ticks at least once more within this slot
    finally:
        for worker in workers:
            worker.stop(timeout=10)
    assert len(ran) == 1
    assert keys(queues[0]) == ["periodic:lr.cron:2023-11-14T22:15:00+00:00"]
    assert queues[0].counts()["completed"] == 1


def test_every_second_with_three_real_workers_enqueues_each_slot_once(tmp_path: Path) -> None:
    """The real clock, on SQLite; both backends race for slots in the two tests above."""
    queues = [Queue(tmp_path / "jobs.db") for _ in range(3)]

    @queues[0].periodic(every=1, name="lr.beat")
    def beat() -> str:
        return "beat"

    workers = [q.worker(lease=5) for q in queues]
    try:
        for worker in workers:
            worker.start()
        wait_until(lambda: len(queues[0].jobs()) >= 3, 15, "three slots enqueued")
    finally:
        for worker in workers:
            worker.stop(timeout=10)
    found = keys(queues[0])
    assert len(found) >= 3
    assert all(key.startswith("periodic:lr.beat:") for key in found)
    assert Counter(found).most_common(1)[0][1] == 1  # no slot twice
    slots = [datetime.fromisoformat(key.removeprefix("periodic:lr.beat:")) for key in found]
    assert all(slot.microsecond == 0 for slot in slots)
    assert slots == sorted(slots)
    assert all(job.attempts <= 1 for job in queues[0].jobs())
    for q in queues:
        q.close()


def _at(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


# June 2024: the 7th and 14th are Fridays, the 8th a Saturday, the 9th a Sunday, the 13th a Thursday.
@pytest.mark.parametrize(
    ("expression", "at", "latest"),
    [
        ("*/5 * * * *", "2024-06-10 12:07:30", "2024-06-10 12:05"),
        ("*/5 * * * *", "2024-06-10 12:05:00", "2024-06-10 12:05"),
        ("* * * * *", "2024-06-10 12:05:59", "2024-06-10 12:05"),
        ("0-10/5 * * * *", "2024-06-10 12:59", "2024-06-10 12:10"),
        ("7,19,45 * * * *", "2024-06-10 12:30", "2024-06-10 12:19"),
        ("0 9-17 * * 1-5", "2024-06-08 10:00", "2024-06-07 17:00"),
        ("0 9-17 * * 1-5", "2024-06-10 08:59", "2024-06-07 17:00"),
        ("30 2 * * 7", "2024-06-10 00:00", "2024-06-09 02:30"),
        ("30 2 * * 0", "2024-06-10 00:00", "2024-06-09 02:30"),
        ("0 0 * * 1,3", "2024-06-11 12:00", "2024-06-10 00:00"),
        ("0 0 1,15 * *", "2024-06-14 08:00", "2024-06-01 00:00"),
        ("0 12 13 * 5", "2024-06-12 13:00", "2024-06-07 12:00"),  # day 13 OR Friday
        ("0 12 13 * 5", "2024-06-13 13:00", "2024-06-13 12:00"),  # the 13th, a Thursday
        ("0 12 13 * 5", "2024-06-14 12:30", "2024-06-14 12:00"),  # a Friday, not the 13th
        ("15 10 * 2 *", "2024-06-01 00:00", "2024-02-29 10:15"),
        ("0 0 29 2 *", "2025-06-01 00:00", "2024-02-29 00:00"),
        ("59 23 31 12 *", "2024-06-01 00:00", "2023-12-31 23:59"),
    ],
)
def test_cron_latest_slot(expression: str, at: str, latest: str) -> None:
    assert Cron.parse(expression).latest(_at(at)) == _at(latest)


def test_cron_evaluates_in_utc() -> None:
    at = datetime(2024, 6, 10, 16, 7, tzinfo=timezone(timedelta(hours=2)))  # 14:07 UTC
    latest = Cron.parse("0 15 * * *").latest(at)
    assert latest == _at("2024-06-09 15:00")  # 15:00 UTC yesterday, not 15:00 here today
    assert latest is not None and latest.tzinfo == UTC


def test_every_slots_are_aligned_to_the_epoch() -> None:
    assert Every(3600).latest(_at("2024-06-10 12:34:56")) == _at("2024-06-10 12:00")
    assert Every(90).latest(_at("2024-06-10 00:01:31")) == _at("2024-06-10 00:01:30")


def test_a_cron_that_never_matches_gives_up() -> None:
    """30 February never comes: documented to give up (None), not to loop or crash."""
    for expression in ("0 0 30 2 *", "0 0 31 4 *"):
        try:
            cron = Cron.parse(expression)
        except nbqueue.InvalidArgument:
            continue  # refusing it up front would be fine too
        assert cron.latest(_at("2024-06-01 00:00")) is None


def test_an_impossible_cron_does_not_stop_the_worker_heartbeating(tmp_path: Path) -> None:
    """The keeper thread also heartbeats: a schedule's error must not end it (SQLite is enough)."""
    q = Queue(tmp_path / "jobs.db")
    try:

        @q.periodic(cron="0 0 30 2 *", name="lr.never")
        def never() -> None:
            return None

    except nbqueue.InvalidArgument:
        pass  # refused at registration: fine

    @q.task(name="lr.longer_than_its_lease", max_retries=0)
    def slow() -> str:
        time.sleep(1.5)
        return "ok"

    job = slow.enqueue()
    try:
        with q.worker(lease=0.6):  # only the keeper's heartbeats keep this claim
            try:
                [done] = q.wait([job], timeout=5, progress=False)
            except nbqueue.WaitTimeout:
                done = q.get(job.id)
        assert done.status == "completed", f"job {done.status}: the keeper died, no heartbeats"
        assert done.value == "ok"
    finally:
        q.close()


@pytest.mark.parametrize(
    "expression",
    [
        "",
        "* * * *",
        "* * * * * *",
        "60 * * * *",
        "* 24 * * *",
        "* * 0 * *",
        "* * 32 * *",
        "* * * 0 *",
        "* * * 13 *",
        "* * * * 8",
        "*/0 * * * *",
        "a * * * *",
        "5-1 * * * *",
        "1,,2 * * * *",
        "-1 * * * *",
        None,
        5,
    ],
)
def test_bad_crons_are_refused(expression: Any) -> None:
    with pytest.raises(nbqueue.InvalidArgument):
        Cron.parse(expression)


def test_periodic_needs_exactly_one_schedule(tmp_path: Path) -> None:
    for cron, every in ((None, None), ("* * * * *", 60), (None, 0.5), (None, "5m"), (None, True)):
        with pytest.raises(nbqueue.InvalidArgument):
            make(cron, every)
    with Queue(tmp_path / "jobs.db") as q:
        with pytest.raises(nbqueue.InvalidArgument):
            q.periodic(cron="*/5 * * *")
        with pytest.raises(nbqueue.InvalidArgument):
            q.periodic(every=timedelta(milliseconds=10))
        with pytest.raises(nbqueue.PayloadError):

            @q.periodic(every=60, name="lr.bad_args", args=(object(),))
            def bad_args(x: object) -> None:
                return None

    assert make(None, timedelta(minutes=5)) == Every(300)
    assert str(make("*/5 * * * *", None)) == "cron */5 * * * *"


# -- retention ---------------------------------------------------------------------------


def _finish(q: Queue, state: str, n: int = 1) -> list[int]:
    """n raw jobs driven through the real API to completed, dead or cancelled."""
    ids = []
    for _ in range(n):
        job = q.enqueue({"state": state}, max_retries=0)
        if state == "cancelled":
            q.cancel(job.id)
        else:
            claim = q.claim(lease=60)
            assert claim is not None and claim.id == job.id
            if state == "completed":
                q.complete(claim, {"ok": True})
            else:
                q.fail(claim, "it broke")
        ids.append(job.id)
    return ids


def test_purge_in_small_batches_takes_the_oldest_first(clocked_queue: Queue, clock: Any) -> None:
    q = clocked_queue
    old = _finish(q, "completed", 7)
    dead = _finish(q, "dead", 2)
    clock.advance(10)
    assert q.purge("completed", older_than=5, limit=3) == 3
    assert [job.id for job in reversed(q.jobs("completed"))] == old[3:]
    assert q.purge("completed", older_than=5, limit=3) == 3
    assert q.purge("completed", older_than=5, limit=3) == 1
    assert q.purge("completed", older_than=5, limit=3) == 0
    assert [job.id for job in reversed(q.jobs("dead"))] == dead
    for limit in (0, -1, 1.5, True):
        with pytest.raises(nbqueue.InvalidArgument):
            q.purge("completed", limit=limit)  # type: ignore[arg-type]
    with pytest.raises(nbqueue.InvalidArgument):
        q.purge("running")


def test_worker_prunes_old_completed_jobs_in_batches_and_keeps_dead_ones(
    clocked_queue: Queue, clock: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(worker_module, "PRUNE_BATCH", 2)  # five old jobs take three batches
    q = clocked_queue
    _finish(q, "completed", 5)
    dead = _finish(q, "dead", 2)
    cancelled = _finish(q, "cancelled")
    clock.advance(10)
    [young] = _finish(q, "completed")
    waiting = q.enqueue({"state": "pending"})  # never pruned (and no worker runs a raw payload)
    worker = q.worker(lease=5, retention=5).start()
    try:
        wait_until(lambda: q.counts()["completed"] == 1, 10, "old completed jobs pruned")
        assert [job.id for job in q.jobs("completed")] == [young]
        clock.advance(10)  # now the young one is old too
        wait_until(lambda: q.counts()["completed"] == 0, 10, "the young job pruned")
    finally:
        worker.stop(timeout=10)
    assert [job.id for job in reversed(q.jobs("dead"))] == dead  # kept until a person acts
    assert [job.id for job in q.jobs("cancelled")] == cancelled
    assert q.get(waiting.id).status == "pending"


def test_worker_with_real_clock_retention(queue: Queue) -> None:
    _finish(queue, "completed", 3)
    dead = _finish(queue, "dead")
    time.sleep(0.6)  # older than the retention below
    worker = queue.worker(lease=5, retention=0.5).start()
    try:
        wait_until(lambda: queue.counts()["completed"] == 0, 10, "completed jobs pruned")
    finally:
        worker.stop(timeout=10)
    assert [job.id for job in queue.jobs("dead")] == dead


# -- hooks ----------------------------------------------------------------------------------


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


# -- command line -----------------------------------------------------------------------------


def test_cli_worker_in_process_mode_with_retention(tmp_path: Path) -> None:
    db = str(tmp_path / "jobs.db")
    (tmp_path / "lr_cli_tasks.py").write_text(
        textwrap.dedent(
            f"""
            import os

            import nbqueue

            q = nbqueue.Queue({db!r})


            @q.task(name="lr.cli.whoami", timeout=20)
            def whoami(tag):
                print(f"child says {{tag}}")
                nbqueue.progress(1, 1, "done")
                return {{"pid": os.getpid(), "tag": tag}}
            """
        )
    )
    q = Queue(db)
    stub = q.task(name="lr.cli.whoami")(lambda tag: None)  # the worker process has the real one
    job = stub.enqueue("x")
    command = [sys.executable, "-m", "nbqueue", "worker", db, "--import", "lr_cli_tasks"]
    options = ["--mode", "process", "--retention", "1s", "--lease", "5"]
    log = tmp_path / "worker.log"
    with open(log, "w") as stderr:  # a file, not a pipe: a job's child process may outlive the worker
        worker = subprocess.Popen(
            [*command, *options], cwd=tmp_path, stdout=stderr, stderr=stderr, start_new_session=True
        )
    try:
        result = job.result(timeout=30)
        assert result["tag"] == "x"
        assert result["pid"] not in (worker.pid, os.getpid())  # a child of the worker process
        done = q.get(job.id)
        assert "child says x" in (done.output or "")
        assert done.progress == Progress(1, 1, "done")

        def pruned() -> bool:
            try:
                q.get(job.id)
            except nbqueue.JobNotFound:
                return True
            return False

        wait_until(pruned, 15, "the completed job pruned by --retention 1s")
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=30) == 0
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(worker.pid, signal.SIGKILL)  # the worker and any child of a job it ran
        worker.wait(timeout=30)
        q.close()
    assert "nbqueue worker stopped: 1 completed, 0 failed" in log.read_text()


@pytest.mark.parametrize("bad", [["--mode", "fork"], ["--retention", "7x"], ["--retention", "soon"]])
def test_cli_refuses_bad_long_running_options(tmp_path: Path, bad: list[str]) -> None:
    from nbqueue import cli

    with pytest.raises(SystemExit) as exit_info:
        cli.main(["worker", str(tmp_path / "jobs.db"), *bad])
    assert exit_info.value.code == 2


def test_cli_parses_retention_durations() -> None:
    from nbqueue import cli

    args = cli.parser().parse_args(["worker", "x.db", "--mode", "process", "--retention", "7d"])
    assert (args.mode, args.retention) == ("process", 7 * 86400)
    assert cli.duration("1d12h") == 36 * 3600


# -- the board ----------------------------------------------------------------------------------


def test_board_shows_progress_and_its_button_cancels_a_running_job(queue: Queue) -> None:
    pytest.importorskip("ipywidgets")
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
    worker = queue.worker(lease=5).start()
    try:

        def bar_shown() -> bool:
            board.refresh()
            return "data-percent='25'" in board.table.value

        wait_until(bar_shown, 20, "the progress bar on the board")
        assert "a quarter" in board.table.value
        assert board.counts["running"] == 1
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
