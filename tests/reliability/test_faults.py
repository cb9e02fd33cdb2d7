"""Faults: the file, the disk, the clock and the handlers misbehave.

Each fault must surface as a clear NbqueueError subclass (never a raw sqlite3
error), and no job may be lost or half-written. Real files, real threads, a
real `chattr +i` (root only) to make an open database unwritable.
"""

from __future__ import annotations

import logging
import os
import random
import shutil
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

import nbqueue
from nbqueue import Backoff, ManualClock, Queue
from tests.helpers import wait_until

PAD = "x" * 1500  # a payload that fills a good part of a page


def assert_nbqueue_error(exc: BaseException) -> None:
    """An error a caller can catch as NbqueueError, raised by nbqueue itself (not sqlite3 or json)."""
    kind = f"{type(exc).__module__}.{type(exc).__qualname__}"
    assert isinstance(exc, nbqueue.NbqueueError), f"raw {kind} escaped: {exc}"
    assert type(exc).__module__.startswith("nbqueue"), kind


def rows_by_status(path: Path) -> dict[str, int]:
    """Count the rows themselves (not the trigger-kept counts table), through plain sqlite3."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        rows = conn.execute("SELECT status, count(*) FROM nbqueue_jobs GROUP BY status").fetchall()
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    finally:
        conn.close()
    return {s.value: dict(rows).get(s.value, 0) for s in nbqueue.State}


@contextmanager
def unwritable(path: Path) -> Iterator[None]:
    """Make a database that is open right now unwritable: `chattr +i` on the file and its -wal.

    chmod does not stop root, nor a process that already has the file open; the
    immutable flag stops both. The -shm file is left alone: SQLite maps it into
    memory, and an immutable mapping kills the whole process with SIGBUS, a fault
    no library can turn into an exception. Always undone, even when the test fails.
    """
    chattr = shutil.which("chattr")
    if os.geteuid() != 0 or chattr is None:
        pytest.skip("needs root and chattr to make an open file unwritable")
    files = [str(p) for p in (path, Path(f"{path}-wal")) if p.exists()]
    try:
        if subprocess.run([chattr, "+i", *files], check=False, capture_output=True).returncode != 0:
            pytest.skip("chattr +i does not work on this filesystem")
        yield
    finally:
        subprocess.run([chattr, "-i", *files], check=False, capture_output=True)


class Records(logging.Handler):
    """Collects what nbqueue logs, so a test can see what the worker went through."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []
        self._guard = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        with self._guard:
            self.records.append(record)

    def since(self, start: int, level: int = logging.WARNING) -> list[logging.LogRecord]:
        with self._guard:
            return [r for r in self.records[start:] if r.levelno >= level]

    def __len__(self) -> int:
        with self._guard:
            return len(self.records)


@pytest.fixture
def records() -> Iterator[Records]:
    handler = Records()
    logger = logging.getLogger("nbqueue")
    old_level, old_propagate = logger.level, logger.propagate
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False  # a flood of tracebacks would bury pytest's report
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)
        logger.propagate = old_propagate


# -- the file becomes read-only under a running worker -------------------------------------


@pytest.mark.slow
def test_read_only_file_under_a_running_worker_loses_nothing(tmp_path: Path) -> None:
    path = tmp_path / "jobs.db"
    q = Queue(path)

    @q.task(name="faults.square", max_retries=50, backoff=Backoff(base=0.05, cap=0.2, jitter=0))
    def square(x: int) -> int:
        time.sleep(0.05)
        return x * x

    jobs = [square.enqueue(i) for i in range(30)]
    worker = q.worker(lease=1).start()
    try:
        wait_until(lambda: q.counts()["completed"] >= 3, timeout=20, what="the worker under way")
        with unwritable(path):
            assert q.counts()["pending"] > 0, "the fault must hit a worker with work left"
            for attempt in (lambda: q.enqueue({"during": "read-only"}), q.claim):
                with pytest.raises(Exception) as caught:
                    attempt()
                assert_nbqueue_error(caught.value)
                assert isinstance(caught.value, nbqueue.StorageError), caught.value
            time.sleep(1.0)  # the worker meets the fault for a while
            assert worker.running
            assert sum(q.counts().values()) == 30  # reading still works; nothing is lost
        # Writable again: the worker carries on by itself, and every job completes.
        wait_until(lambda: q.counts()["completed"] == 30, timeout=60, what="all 30 jobs completed")
        assert [q.get(j.id).value for j in jobs] == [i * i for i in range(30)]
        assert worker.running
        assert q.enqueue({"after": "writable"}).status == "pending"
        assert rows_by_status(path) == q.counts()
    finally:
        worker.stop(timeout=10)
        q.close()


@pytest.mark.slow
def test_worker_backs_off_while_the_database_cannot_be_written(tmp_path: Path, records: Records) -> None:
    """A worker whose claims keep failing must wait between tries, not spin logging tracebacks.

    (A bound on how often it retries, not a speed test: 30 log records in a second is
    already a flood; a worker that pauses even 0.1 s between tries logs about 10.)
    """
    path = tmp_path / "jobs.db"
    q = Queue(path)
    gate, started = threading.Event(), threading.Event()

    @q.task(name="faults.gated", max_retries=50, backoff=Backoff(base=0.05, cap=0.2, jitter=0))
    def gated(n: int) -> int:
        if n == 0:
            started.set()
            gate.wait(30)
        return n

    jobs = [gated.enqueue(i) for i in range(10)]
    worker = q.worker(lease=5).start()
    try:
        assert started.wait(20)
        with unwritable(path):
            start = len(records)
            gate.set()  # job 0 returns into a read-only file; jobs 1-9 are due
            time.sleep(1.0)
            flood = records.since(start)
            assert worker.running
        wait_until(lambda: q.counts()["completed"] == 10, timeout=60, what="all 10 jobs completed")
        assert [q.get(j.id).value for j in jobs] == list(range(10))
    finally:
        gate.set()
        worker.stop(timeout=10)
        q.close()
    assert flood, "the fault was not noticed at all"
    assert len(flood) <= 30, (
        f"{len(flood)} warnings/errors logged in 1 s of read-only database, e.g. {flood[-1].getMessage()!r}"
    )


# -- the disk fills up ------------------------------------------------------------------------


def limit_pages(q: Queue, spare: int) -> None:
    """Let this thread's connection grow the file by only `spare` more pages (a full disk)."""
    conn = q.manager.storage._conn()  # type: ignore[attr-defined]
    pages = conn.execute("PRAGMA page_count").fetchone()[0]
    assert conn.execute(f"PRAGMA max_page_count = {pages + spare}").fetchone()[0] == pages + spare


def test_disk_full_refuses_cleanly_and_keeps_every_earlier_job(tmp_path: Path) -> None:
    path = tmp_path / "jobs.db"
    with Queue(path) as q:
        q.enqueue({"warm": True})  # tables and indexes exist before the limit
        limit_pages(q, 12)
        written: dict[int, int] = {}
        with pytest.raises(Exception) as caught:
            for i in range(10_000):
                written[q.enqueue({"i": i, "pad": PAD}).id] = i
        assert_nbqueue_error(caught.value)
        assert isinstance(caught.value, nbqueue.DatabaseFull), caught.value
        assert "full" in str(caught.value)
        assert len(written) >= 3, "the limit should let a few jobs in first"
        counts = q.counts()
        assert counts["pending"] == len(written) + 1 == sum(counts.values())
        assert rows_by_status(path) == counts  # no half-written row, the counts table agrees
        assert all(q.get(job_id).payload == {"i": i, "pad": PAD} for job_id, i in written.items())

        # One transaction for many: if it does not fit, none of it is written.
        with pytest.raises(nbqueue.DatabaseFull):
            q.enqueue_many([{"batch": n, "pad": PAD} for n in range(50)])
        assert q.counts() == counts
        assert rows_by_status(path) == counts

        # Space again: the queue goes on, ids continue, nothing was lost.
        q.manager.storage._conn().execute("PRAGMA max_page_count = 1073741823")  # type: ignore[attr-defined]
        more = q.enqueue_many([{"batch": n} for n in range(50)])
        assert min(more) > max(written)
        assert q.counts()["pending"] == len(written) + 51


def test_disk_full_while_recording_an_outcome_keeps_the_claim(tmp_path: Path) -> None:
    path = tmp_path / "jobs.db"
    with Queue(path) as q:
        ids = q.enqueue_many([{"n": 1}, {"n": 2}])
        claim = q.claim(lease=60)
        other = q.claim(lease=60)
        assert claim is not None and other is not None
        limit_pages(q, 1)
        with pytest.raises(nbqueue.DatabaseFull):
            q.complete(claim, result={"big": "r" * 200_000})
        with pytest.raises(nbqueue.DatabaseFull):
            q.fail(other, "e" * 200_000)
        for job_id in ids:
            job = q.get(job_id)
            assert (job.status.value, job.result_json, job.error) == ("running", None, None)
        # The same claims still hold: the outcome can be recorded once it fits.
        q.complete(claim, result={"small": True})
        assert q.fail(other, "short error") == "retry"
        assert q.get(claim.id).value == {"small": True}
        assert rows_by_status(path) == q.counts()


# -- a corrupt, truncated or foreign file ------------------------------------------------------


def filled_queue(path: Path) -> list[int]:
    """A real queue file of a few dozen pages, closed (the WAL folded back into it)."""
    with Queue(path) as q:
        ids = q.enqueue_many([{"i": i, "pad": "p" * 200} for i in range(300)])
        for _ in range(30):
            claim = q.claim()
            assert claim is not None
            q.complete(claim, {"r": "x" * 100})
    assert not Path(f"{path}-wal").exists()
    return ids


def use_everything(path: Path, ids: list[int]) -> list[BaseException]:
    """Open the queue and call every kind of verb; collect what is raised."""
    errors: list[BaseException] = []
    try:
        q = Queue(path)
    except Exception as exc:
        return [exc]
    calls: list[Callable[[], Any]] = [
        q.counts,
        lambda: q.jobs(limit=1000),
        lambda: q.jobs(status="completed"),
        lambda: [q.get(i) for i in ids],
        lambda: q.enqueue({"new": True}),
        q.claim,
        q.recover,
        lambda: q.requeue(None),
        lambda: q.purge(),
        q.queues,
    ]
    try:
        for call in calls:
            try:
                call()
            except Exception as exc:
                errors.append(exc)
    finally:
        q.close()
    return errors


@pytest.mark.parametrize("seed", [7, 8])
def test_corrupt_file_raises_storage_errors(tmp_path: Path, seed: int) -> None:
    path = tmp_path / "jobs.db"
    ids = filled_queue(path)
    data = bytearray(path.read_bytes())
    size = len(data)
    start = size // 4  # the header page stays: the file still looks like a queue
    data[start : start + size // 2] = random.Random(seed).randbytes(size // 2)
    path.write_bytes(bytes(data))
    errors = use_everything(path, ids)
    for exc in errors:
        assert_nbqueue_error(exc)
    assert any(isinstance(e, nbqueue.NotAQueueDatabase) for e in errors), errors
    assert "not a readable nbqueue database" in str(
        next(e for e in errors if isinstance(e, nbqueue.NotAQueueDatabase))
    )


@pytest.mark.parametrize("keep", [0.5, 0.1, 60])
def test_truncated_file_is_not_a_queue(tmp_path: Path, keep: float) -> None:
    path = tmp_path / "jobs.db"
    ids = filled_queue(path)
    size = path.stat().st_size
    os.truncate(path, int(size * keep) if keep < 1 else int(keep))
    errors = use_everything(path, ids)
    assert errors, "a truncated queue must not look healthy"
    for exc in errors:
        assert_nbqueue_error(exc)
        assert isinstance(exc, nbqueue.StorageError), exc
    assert path.stat().st_size < size  # nbqueue did not "repair" it by rewriting


def corrupt_one_payload(path: Path, marker: bytes) -> None:
    """Overwrite a job's JSON text in the file, same length, so that SQLite cannot notice."""
    data = path.read_bytes()
    assert data.count(marker) == 1
    path.write_bytes(data.replace(marker, b"!" + marker[1:]))


def test_a_row_that_is_not_json_is_a_storage_error(tmp_path: Path) -> None:
    """SQLite has no page checksums: a flipped byte inside a payload reads back as text that
    is not JSON. Reading that job raises a StorageError naming it (not json.JSONDecodeError);
    a listing shows it with its damage (one bad row never hides the others); claiming neither
    crashes nor lets the damaged row block or hold the good job."""
    path = tmp_path / "jobs.db"
    with Queue(path) as q:
        bad = q.enqueue({"who": "CORRUPT-ME"})
        good = q.enqueue({"who": "fine"})
    corrupt_one_payload(path, b'{"who":"CORRUPT-ME"}')
    with Queue(path) as q:
        assert q.get(good.id).payload == {"who": "fine"}
        with pytest.raises(Exception) as caught:
            q.get(bad.id)
        assert_nbqueue_error(caught.value)
        assert isinstance(caught.value, nbqueue.DamagedJob)
        assert str(bad.id) in str(caught.value)
        for listing in (q.jobs(), q.jobs(status="pending")):
            assert [j.id for j in listing] == [good.id, bad.id]
            damaged = listing[1]
            assert damaged.payload is None and "cannot be read" in (damaged.error or "")
        assert [j.id for j in q.jobs(brief=True)] == [good.id, bad.id]  # it never reads the payload
        claimed = []
        for _ in range(3):
            try:
                job = q.claim(lease=60)
            except nbqueue.StorageError:  # allowed; a raw error is not
                continue
            if job is not None:
                claimed.append(job.id)
        assert claimed == [good.id]
        assert q.counts()["running"] == 1, "the damaged row must not be left running"


def test_a_worker_survives_a_row_it_cannot_read(tmp_path: Path) -> None:
    """One unreadable row must not stop the worker: the other jobs still run."""
    path = tmp_path / "jobs.db"
    with Queue(path) as q:

        @q.task(name="faults.echo", max_retries=0)
        def echo(text: str) -> str:
            return text

        bad = echo.enqueue("CORRUPT-ME")  # the first in line
        good = [echo.enqueue(f"fine {i}") for i in range(4)]
    corrupt_one_payload(path, b'"CORRUPT-ME"')
    with Queue(path) as q:
        worker = q.worker(lease=0.5).start()
        try:
            wait_until(
                lambda: q.counts()["completed"] == 4,
                timeout=10,
                what="the 4 readable jobs completed",
            )
            assert worker.running
        finally:
            worker.stop(timeout=5)
        assert [q.get(j.id).value for j in good] == [f"fine {i}" for i in range(4)]
        with pytest.raises(nbqueue.StorageError):
            q.get(bad.id)


def test_schema_from_a_newer_nbqueue_is_refused_and_left_untouched(tmp_path: Path) -> None:
    path = tmp_path / "jobs.db"
    with Queue(path) as q:
        job = q.enqueue({"keep": "me"})
    conn = sqlite3.connect(path)
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    conn.execute("PRAGMA user_version = 2147483647")
    conn.commit()
    conn.close()
    before = path.read_bytes()
    with pytest.raises(nbqueue.SchemaTooNew, match="upgrade"):
        Queue(path)
    done = subprocess.run(
        [sys.executable, "-m", "nbqueue", "stats", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    assert done.stderr.count("\n") == 1 and "upgrade" in done.stderr
    assert path.read_bytes() == before  # no migration, no rewrite
    # Set back by hand, the file opens again with its job.
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version = {version}")
    conn.commit()
    conn.close()
    with Queue(path) as q:
        assert q.get(job.id).payload == {"keep": "me"}


# -- the clock jumps backwards ------------------------------------------------------------------


def test_clock_jumping_back_an_hour_keeps_leases_and_claims_nothing_twice(tmp_path: Path) -> None:
    clock = ManualClock()
    with Queue(tmp_path / "jobs.db", clock=clock, backoff=Backoff(base=2, cap=60, jitter=0)) as q:
        ids = q.enqueue_many([{"n": i} for i in range(4)])
        first, second = q.claim(lease=30), q.claim(lease=30)
        assert first is not None and second is not None
        clock.advance(-3600)
        assert q.recover() == 0  # the leases are live: nothing is taken back
        assert [q.get(i).status.value for i in (first.id, second.id)] == ["running", "running"]
        q.heartbeat(first)
        q.complete(first, result="done after the jump")
        assert q.fail(second, "went wrong") == "retry"
        clock.advance(2)  # the retry's backoff, on the new clock
        claimed = [first.id, second.id]
        clock.advance(3600)  # and the clock catches up with the jobs queued before the jump
        while (job := q.claim(lease=30)) is not None:
            claimed.append(job.id)
            q.complete(job)
        assert sorted(claimed) == sorted([*ids, second.id])  # the retry once more, nothing else twice
        assert q.get(first.id).value == "done after the jump"
        assert q.get(second.id).attempts == 2
        assert q.counts()["completed"] == 4


def test_worker_survives_the_clock_jumping_back(tmp_path: Path) -> None:
    clock = ManualClock()
    with Queue(tmp_path / "jobs.db", clock=clock) as q:
        started, go = threading.Event(), threading.Event()

        @q.task(name="faults.slow")
        def slow(n: int) -> int:
            if n == 1:
                started.set()
                go.wait(20)
            return n

        first = slow.enqueue(1)
        worker = q.worker(lease=0.6).start()  # heartbeats every 0.2 s of real time
        try:
            assert started.wait(20)
            clock.advance(-3600)
            time.sleep(0.6)  # heartbeats and recover passes under the new clock
            running = q.get(first.id)
            assert (running.status.value, running.attempts) == ("running", 1)
            go.set()
            assert first.result(timeout=20) == 1
            later = slow.enqueue(2)  # queued after the jump: due at once on the new clock
            assert later.result(timeout=20) == 2
        finally:
            go.set()
            worker.stop(timeout=10)
        assert q.get(first.id).attempts == 1


# -- a handler that hangs ------------------------------------------------------------------------


def test_a_handler_hanging_past_its_timeout_is_retried_and_its_late_return_refused(tmp_path: Path) -> None:
    with Queue(tmp_path / "jobs.db") as q:
        gate, returned = threading.Event(), threading.Event()
        calls: list[int] = []

        @q.task(name="faults.hang_once", timeout=0.3, max_retries=2, backoff=Backoff(0.05, 0.05, 0))
        def hang_once() -> str:
            calls.append(1)
            if len(calls) == 1:
                gate.wait(30)  # ignores cancellation, like a call stuck in C code
                returned.set()
                return "late"
            return "second"

        job = hang_once.enqueue()
        # One thread: the retry must not wait for the hung handler to give its thread back.
        worker = q.worker(concurrency=1, lease=5).start()
        try:
            assert job.result(timeout=20) == "second"
            done = q.get(job.id)
            assert (done.attempts, done.retries) == (2, 1)
            assert "timed out" in (done.error or "")
            gate.set()  # the first attempt returns now, long after it was failed
            assert returned.wait(10)
            deadline = time.monotonic() + 1.0  # its late "late" must never land
            while time.monotonic() < deadline:
                after = q.get(job.id)
                assert (after.status.value, after.value, after.attempts) == ("completed", "second", 2)
                time.sleep(0.05)
            assert worker.status()["completed"] == 1
        finally:
            gate.set()
            worker.stop(timeout=10)


def test_without_a_timeout_a_hung_handler_keeps_its_lease(tmp_path: Path) -> None:
    """Documented behaviour: heartbeats come from the worker, not the handler, so a handler that
    hangs with no `timeout` holds its job for as long as the process lives; recover() never
    takes it back. Give a task that can hang a `timeout=`."""
    with Queue(tmp_path / "jobs.db") as q:
        gate, hung = threading.Event(), threading.Event()

        @q.task(name="faults.hang", max_retries=3)
        def hang() -> str:
            hung.set()
            gate.wait(30)
            return "finally"

        job = hang.enqueue()
        worker = q.worker(lease=0.6).start()
        try:
            assert hung.wait(20)
            time.sleep(1.5)  # over two leases
            assert q.recover() == 0
            held = q.get(job.id)
            assert (held.status.value, held.attempts, held.retries) == ("running", 1, 0)
            assert held.lease_until is not None and held.lease_until > q.now()
            gate.set()
            assert job.result(timeout=20) == "finally"
        finally:
            gate.set()
            worker.stop(timeout=10)
        assert q.get(job.id).attempts == 1
