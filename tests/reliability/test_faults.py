"""Faults: the storage, the clock and the handlers misbehave, on both backends.

Each fault must surface as a clear NbqueueError subclass (never a raw sqlite3 or
psycopg error), and no job may be lost or half-written. A fault with a twin on
PostgreSQL is one test over both backends (the `place` fixture): a SQLite file
made immutable with a real `chattr +i` (root only) is a PostgreSQL role whose
sessions are made read-only; another process holding SQLite's write lock is
another session holding a table lock while our statements have a timeout; a row
damaged by hand is damaged by hand in either. Faults with no twin (a full disk,
a corrupt or truncated file) say why in their docstring.

On PostgreSQL each test gets a schema of its own, reached as a login role of its
own (`nbq_role_...`), so that a fault set on that role (read-only sessions, a
statement timeout) touches nothing else on the shared server; both are dropped
afterwards. Checks read the truth directly from the file or the server.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit, urlunsplit

import pytest

import nbqueue
from nbqueue import Backoff, ManualClock, Queue
from tests.helpers import run_cli, wait_until
from tests.reliability.conftest import Records

PAD = "x" * 1500  # a payload that fills a good part of a page

# A worker thread that dies of a fault is a failure, not a warning: the worker would go on
# with fewer threads (or none) while `worker.running` stays true.
pytestmark = pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")
STATES = [s.value for s in nbqueue.State]


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


# -- where the queue lives: a SQLite file, or a PostgreSQL schema and role of its own ---------

# Damage written into one job's row by hand: (column, text). None: the payload's marker
# gets a "!" for its first character (in SQLite, a byte flipped in the file itself).
DAMAGES: dict[str, tuple[str, str | None]] = {
    "not-json": ("payload", None),
    "nested-100000-deep": ("payload", "[" * 100_000 + "]" * 100_000),
    "backoff-not-a-backoff": ("backoff", '{"base": "x"}'),
    "priority-not-an-integer": ("priority", "high"),  # SQLite only: a BIGINT column refuses text
}
DAMAGE_CASES = [
    pytest.param(backend, damage, id=f"{backend}-{damage}")
    for damage in DAMAGES
    for backend in ("sqlite", "postgres")
    if not (backend == "postgres" and damage == "priority-not-an-integer")
]


class Place(Protocol):
    """One queue's storage, as a test sees it: open queues on it, read the truth, break it."""

    backend: str
    target: str

    def open(self, **options: Any) -> Queue:
        """A Queue on this place (closed at teardown)."""
        ...

    def rows_by_status(self) -> dict[str, int]:
        """The rows themselves per state, read directly (not through nbqueue)."""
        ...

    def damage(self, job_id: int, kind: str, marker: bytes) -> None:
        """Write one of DAMAGES into the job's row by hand; every Queue on it is closed first."""
        ...

    def statement_timeout(self, seconds: float) -> None:
        """Queues opened from now on have their statements cancelled after `seconds` (PostgreSQL)."""
        ...

    def unwritable(self) -> contextlib.AbstractContextManager[None]:
        """While inside, the queue cannot be written; reading still can."""
        ...

    def locked(self, seconds: float) -> contextlib.AbstractContextManager[None]:
        """Another process or session holds the write lock for `seconds`, starting before the
        block runs; leaving the block waits until it is let go."""
        ...

    def schema_version(self) -> int: ...

    def set_schema_version(self, version: int) -> None: ...

    def snapshot(self) -> Any:
        """Everything stored, to compare before and after (no change at all)."""
        ...

    def cleanup(self) -> None: ...


class SQLitePlace:
    backend = "sqlite"

    def __init__(self, path: Path) -> None:
        self.path = path
        self.target = str(path)
        self._opened: list[Queue] = []

    def open(self, **options: Any) -> Queue:
        q = Queue(self.path, **options)
        self._opened.append(q)
        return q

    def close_all(self) -> None:
        for q in self._opened:
            q.close()
        self._opened.clear()

    def rows_by_status(self) -> dict[str, int]:
        return rows_by_status(self.path)

    def damage(self, job_id: int, kind: str, marker: bytes) -> None:
        self.close_all()
        column, text = DAMAGES[kind]
        if text is None:
            corrupt_one_payload(self.path, marker)
            return
        conn = sqlite3.connect(self.path)
        try:
            with conn:
                changed = conn.execute(f"UPDATE nbqueue_jobs SET {column} = ? WHERE id = ?", (text, job_id))
                assert changed.rowcount == 1
        finally:
            conn.close()

    def statement_timeout(self, seconds: float) -> None:
        """SQLite has no statement timeout: a writer waits for the lock (busy_timeout)."""

    def unwritable(self) -> contextlib.AbstractContextManager[None]:
        return unwritable(self.path)

    @contextmanager
    def locked(self, seconds: float) -> Iterator[None]:
        """Another process in BEGIN IMMEDIATE: SQLite's write lock, held for `seconds`."""
        code = (
            "import sqlite3, sys, time\n"
            "conn = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
            "conn.execute('BEGIN IMMEDIATE')\n"
            "print('locked', flush=True)\n"
            "time.sleep(float(sys.argv[2]))\n"
            "conn.execute('COMMIT')\n"
        )
        holder = subprocess.Popen(
            [sys.executable, "-c", code, str(self.path), str(seconds)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert holder.stdout is not None
            assert holder.stdout.readline().strip() == "locked", holder.stderr.read() if holder.stderr else ""
            yield
            assert holder.wait(timeout=seconds + 30) == 0, holder.stderr.read() if holder.stderr else ""
        finally:
            if holder.poll() is None:
                holder.kill()
                holder.wait()

    def schema_version(self) -> int:
        conn = sqlite3.connect(self.path)
        try:
            return int(conn.execute("PRAGMA user_version").fetchone()[0])
        finally:
            conn.close()

    def set_schema_version(self, version: int) -> None:
        conn = sqlite3.connect(self.path)
        try:
            conn.execute(f"PRAGMA user_version = {int(version)}")
            conn.commit()
        finally:
            conn.close()

    def snapshot(self) -> bytes:
        return self.path.read_bytes()

    def cleanup(self) -> None:
        self.close_all()


class PostgresPlace:
    """A schema of its own, reached as a login role of its own (faults are set on the role).

    The role may create schemas in the database, so the queue creates (and owns) its
    schema on first open, as a real deployment's role would.
    """

    backend = "postgres"

    def __init__(self, server: str) -> None:
        import psycopg
        from psycopg import sql as pg_sql

        self._sql = pg_sql
        self.server = server
        token = uuid.uuid4().hex[:12]
        self.role = f"nbq_role_{token}"
        self.schema = f"nbq_test_{token}"
        parts = urlsplit(server)
        host = f"{parts.hostname}:{parts.port}" if parts.port else str(parts.hostname)
        query = "&".join(filter(None, [parts.query, f"schema={self.schema}"]))
        self.target = urlunsplit((parts.scheme, f"{self.role}@{host}", parts.path, query, ""))
        self.admin = psycopg.connect(server, autocommit=True)
        self._opened: list[Queue] = []
        database = self.admin.execute("SELECT current_database()").fetchone()[0]  # type: ignore[index]
        self.admin.execute(self._sql.SQL("CREATE ROLE {} LOGIN").format(self._sql.Identifier(self.role)))
        self._on_the_database(
            self._sql.SQL("GRANT CREATE ON DATABASE {} TO {}").format(
                self._sql.Identifier(database), self._sql.Identifier(self.role)
            )
        )

    def _on_the_database(self, statement: Any) -> None:
        """Run a GRANT or DROP OWNED, which rewrites the database's own catalog row: another test
        process doing the same at that moment fails it with "tuple concurrently updated"."""
        import psycopg

        for attempt in range(20):
            try:
                self.admin.execute(statement)
                return
            except psycopg.errors.InternalError as exc:
                if "concurrently updated" not in str(exc) or attempt == 19:
                    raise
                time.sleep(0.05)

    def _table(self, name: str) -> Any:
        return self._sql.Identifier(self.schema, name)

    def open(self, **options: Any) -> Queue:
        q = Queue(self.target, **options)
        self._opened.append(q)
        return q

    def close_all(self) -> None:
        for q in self._opened:
            q.close()
        self._opened.clear()

    def rows_by_status(self) -> dict[str, int]:
        query = self._sql.SQL("SELECT status, count(*) FROM {} GROUP BY status").format(
            self._table("nbqueue_jobs")
        )
        found = dict(self.admin.execute(query).fetchall())
        return {s: int(found.get(s, 0)) for s in STATES}

    def damage(self, job_id: int, kind: str, marker: bytes) -> None:
        self.close_all()
        column, text = DAMAGES[kind]
        if text is None:  # the same damage as SQLite's flipped byte: "!" for the marker's first character
            was = marker.decode()
            text = self._get_payload(job_id).replace(was, "!" + was[1:])
        query = self._sql.SQL("UPDATE {} SET {} = %s WHERE id = %s").format(
            self._table("nbqueue_jobs"), self._sql.Identifier(column)
        )
        assert self.admin.execute(query, (text, job_id)).rowcount == 1

    def _get_payload(self, job_id: int) -> str:
        query = self._sql.SQL("SELECT payload FROM {} WHERE id = %s").format(self._table("nbqueue_jobs"))
        row = self.admin.execute(query, (job_id,)).fetchone()
        assert row is not None
        return str(row[0])

    def _set_on_role(self, setting: str, value: str | None) -> None:
        role = self._sql.Identifier(self.role)
        if value is None:
            statement = self._sql.SQL("ALTER ROLE {} RESET {}").format(role, self._sql.Identifier(setting))
        else:
            statement = self._sql.SQL("ALTER ROLE {} SET {} = {}").format(
                role, self._sql.Identifier(setting), self._sql.Literal(value)
            )
        self.admin.execute(statement)

    def end_sessions(self) -> int:
        """Terminate every session of the role (and wait until each has gone)."""
        rows = self.admin.execute(
            "SELECT pg_terminate_backend(pid, 10000) FROM pg_stat_activity WHERE usename = %s",
            (self.role,),
        ).fetchall()
        return len(rows)

    def statement_timeout(self, seconds: float) -> None:
        self._set_on_role("statement_timeout", f"{round(seconds * 1000)}ms")

    @contextmanager
    def unwritable(self) -> Iterator[None]:
        """Every session of the role read-only, as after a failover to a read-only standby:
        the live sessions are cut, and every new one has default_transaction_read_only on.
        Undone the same way: the setting reset, the read-only sessions cut."""
        self._set_on_role("default_transaction_read_only", "on")
        try:
            self.end_sessions()
            yield
        finally:
            self._set_on_role("default_transaction_read_only", None)
            self.end_sessions()

    @contextmanager
    def locked(self, seconds: float) -> Iterator[None]:
        """Another session holds ACCESS EXCLUSIVE on the jobs table for `seconds`."""
        import psycopg

        held, errors = threading.Event(), []

        def hold() -> None:
            try:
                with psycopg.connect(self.server) as conn:
                    conn.execute(
                        self._sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(
                            self._table("nbqueue_jobs")
                        )
                    )
                    held.set()
                    time.sleep(seconds)
                    conn.commit()
            except Exception as exc:
                errors.append(exc)
                held.set()

        holder = threading.Thread(target=hold, name="lock-holder", daemon=True)
        holder.start()
        assert held.wait(30) and not errors, errors
        try:
            yield
        finally:
            holder.join(seconds + 30)
        assert not holder.is_alive() and not errors, errors

    def schema_version(self) -> int:
        query = self._sql.SQL("SELECT version FROM {}").format(self._table("nbqueue_meta"))
        [(version,)] = self.admin.execute(query).fetchall()
        return int(version)

    def set_schema_version(self, version: int) -> None:
        query = self._sql.SQL("UPDATE {} SET version = %s").format(self._table("nbqueue_meta"))
        assert self.admin.execute(query, (version,)).rowcount == 1

    def snapshot(self) -> dict[str, Any]:
        """Every relation, function and trigger of the schema, and every row of every table."""
        catalog = {
            "relations": self.admin.execute(
                "SELECT relname, relkind FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE nspname = %s ORDER BY relname",
                (self.schema,),
            ).fetchall(),
            "functions": self.admin.execute(
                "SELECT proname, prosrc FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
                "WHERE nspname = %s ORDER BY proname",
                (self.schema,),
            ).fetchall(),
            "triggers": self.admin.execute(
                "SELECT tgname FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid "
                "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE nspname = %s ORDER BY tgname",
                (self.schema,),
            ).fetchall(),
        }
        tables = [name for name, kind in catalog["relations"] if kind == "r"]
        for name in tables:
            query = self._sql.SQL("SELECT * FROM {} ORDER BY 1").format(self._table(name))
            catalog[f"rows of {name}"] = self.admin.execute(query).fetchall()
        return catalog

    def cleanup(self) -> None:
        self.close_all()
        role = self._sql.Identifier(self.role)
        try:
            self.end_sessions()
            self.admin.execute(
                self._sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(self._sql.Identifier(self.schema))
            )
            self._on_the_database(self._sql.SQL("DROP OWNED BY {}").format(role))
            self.admin.execute(self._sql.SQL("DROP ROLE IF EXISTS {}").format(role))
        finally:
            self.admin.close()


@pytest.fixture
def place(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Place]:
    """Where this test's queue lives: a fresh SQLite file, or a fresh PostgreSQL schema and role."""
    where: Place
    if backend == "postgres":
        where = PostgresPlace(str(request.getfixturevalue("pg_server")))
    else:
        where = SQLitePlace(tmp_path / "jobs.db")
    try:
        yield where
    finally:
        where.cleanup()


def outcome_of(call: Callable[[], Any]) -> Any:
    """What `call` returns, or the exception it raises (to assert on after the fault is over)."""
    try:
        return call()
    except Exception as exc:
        return exc


# -- the database becomes read-only under a running worker ------------------------------------


@pytest.mark.slow
def test_read_only_file_under_a_running_worker_loses_nothing(place: Place) -> None:
    """SQLite: the file made immutable. PostgreSQL: every session of the queue's role made
    read-only (the live ones cut, as after a failover to a read-only standby)."""
    q = place.open()

    @q.task(name="faults.square", max_retries=50, backoff=Backoff(base=0.05, cap=0.2, jitter=0))
    def square(x: int) -> int:
        time.sleep(0.05)
        return x * x

    jobs = [square.enqueue(i) for i in range(30)]
    worker = q.worker(lease=1).start()
    try:
        wait_until(lambda: q.counts()["completed"] >= 3, timeout=20, what="the worker under way")
        with place.unwritable():
            # Reading through the queue must still work; checked once the fault is over, so
            # that a failure here does not hide what the worker does afterwards.
            counts_at_fault = outcome_of(q.counts)
            for attempt in (lambda: q.enqueue({"during": "read-only"}), q.claim):
                with pytest.raises(Exception) as caught:
                    attempt()
                assert_nbqueue_error(caught.value)
                assert isinstance(caught.value, nbqueue.StorageError), caught.value
            time.sleep(1.0)  # the worker meets the fault for a while
            assert worker.running
            counts_later = outcome_of(q.counts)
            assert sum(place.rows_by_status().values()) == 30  # nothing is lost
        # Writable again: the worker carries on by itself, and every job completes.
        wait_until(lambda: q.counts()["completed"] == 30, timeout=60, what="all 30 jobs completed")
        assert [q.get(j.id).value for j in jobs] == [i * i for i in range(30)]
        assert worker.running
        assert q.enqueue({"after": "writable"}).status == "pending"
        assert place.rows_by_status() == q.counts()
    finally:
        worker.stop(timeout=10)
        q.close()
    for seen in (counts_at_fault, counts_later):  # reading worked while the queue was read-only
        assert isinstance(seen, dict), f"q.counts() on the read-only queue raised {seen!r}"
    assert counts_at_fault["pending"] > 0, "the fault must hit a worker with work left"
    assert sum(counts_later.values()) == 30


@pytest.mark.slow
def test_worker_backs_off_while_the_database_cannot_be_written(place: Place, records: Records) -> None:
    """A worker whose claims keep failing must wait between tries, not spin logging tracebacks.

    (A bound on how often it retries, not a speed test: 30 log records in a second is
    already a flood; a worker that pauses even 0.1 s between tries logs about 10.)
    """
    q = place.open()
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
        with place.unwritable():
            start = len(records)
            gate.set()  # job 0 returns into a read-only database; jobs 1-9 are due
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


# -- another process or session holds the lock (the "statement timeout" fault) ------------------


@pytest.mark.slow
def test_a_lock_held_elsewhere_is_waited_out_and_nothing_is_written_twice(
    place: Place, records: Records
) -> None:
    """Another writer holds the lock for 2 s while a worker drains and we enqueue.

    SQLite: another process sits in BEGIN IMMEDIATE. PostgreSQL: another session holds
    ACCESS EXCLUSIVE on the jobs table while every statement of the queue's role has a
    statement_timeout of 300 ms. Either way the enqueue and the worker's claims and
    completions wait the lock out (a statement cancelled by the timeout rolled back, so it
    is safe to run again): no error reaches the caller or the worker's log, every job runs
    exactly once, and nothing is written twice.
    """
    place.statement_timeout(0.3)
    q = place.open()
    calls: Counter[int] = Counter()
    guard = threading.Lock()

    @q.task(name="faults.counted", max_retries=0)
    def counted(n: int) -> int:
        with guard:
            calls[n] += 1
        time.sleep(0.05)
        return n

    jobs = [counted.enqueue(i) for i in range(40)]
    worker = q.worker(concurrency=2, lease=30).start()
    try:
        wait_until(lambda: q.counts()["completed"] >= 3, timeout=20, what="the worker under way")
        assert q.counts()["pending"] > 0, "the fault must hit a worker with work left"
        start = len(records)
        with place.locked(2.0):
            began = time.monotonic()
            late = q.enqueue({"during": "the lock"})
            waited = time.monotonic() - began
        assert waited > 1.0, f"the enqueue took {waited:.2f} s: the lock was not in its way"
        wait_until(lambda: q.counts()["completed"] == 40, timeout=60, what="all 40 jobs completed")
        assert worker.running
        trouble = records.since(start)
    finally:
        worker.stop(timeout=10)
    assert not trouble, f"{len(trouble)} warnings/errors logged, e.g. {trouble[0].getMessage()!r}"
    assert [q.get(j.id).value for j in jobs] == list(range(40))
    assert calls == Counter(range(40)), "a job ran twice (or never)"
    assert q.get(late.id).payload == {"during": "the lock"}
    assert place.rows_by_status() == {**dict.fromkeys(STATES, 0), "completed": 40, "pending": 1}
    assert place.rows_by_status() == q.counts()


@contextmanager
def held_for_good(server: str, statement: str) -> Iterator[None]:
    """Another session runs `statement` (a lock it then holds) and keeps it until the block ends."""
    import psycopg

    with psycopg.connect(server) as conn:  # a transaction: the lock is held until it ends
        conn.execute(statement)
        try:
            yield
        finally:
            conn.rollback()


@pytest.mark.slow  # real seconds: it proves a real-time bound
def test_a_lock_held_for_good_fails_the_kernels_enqueue_board_and_cancel_with_a_storage_error(
    pg_url: str, pg_server: str
) -> None:
    """PostgreSQL: another session holds ACCESS EXCLUSIVE on the jobs table and never lets go.
    The kernel's thread (here pytest's main thread: where a notebook's cells, board and buttons
    run) waits `lock_wait` seconds at most per call, then gets a StorageError naming the lock
    wait; nothing is written. (A lock held for 2 s is still waited out: the test above.)"""
    q = Queue(f"{pg_url}&lock_wait=1")
    try:
        job = q.enqueue({"before": "the lock"})
        schema = pg_url.rsplit("schema=", 1)[1]
        with held_for_good(pg_server, f'LOCK TABLE "{schema}".nbqueue_jobs IN ACCESS EXCLUSIVE MODE'):
            for call in (lambda: q.enqueue({"during": "the lock"}), lambda: q.jobs(), lambda: q.cancel(job)):
                began = time.monotonic()
                with pytest.raises(
                    nbqueue.StorageError, match="waiting 1 s for a lock another session holds"
                ):
                    call()
                waited = time.monotonic() - began
                assert 0.9 < waited < 3.5, f"gave up after {waited:.2f} s, not after lock_wait (1 s)"
        assert [(j.id, j.status.value) for j in q.jobs()] == [(job.id, "pending")], "something was written"
    finally:
        q.close()


@pytest.mark.slow  # real seconds: it proves a real-time bound
def test_the_advisory_lock_held_for_good_fails_the_open_with_a_storage_error(
    pg_url: str, pg_server: str
) -> None:
    """PostgreSQL: any role that can connect can hold the advisory lock nbqueue takes to migrate
    the schema; opening the queue then gives up after lock_wait, naming that lock, on any thread."""
    Queue(pg_url).close()  # the schema exists: the open only checks its version, under the lock
    schema = pg_url.rsplit("schema=", 1)[1]
    failures: list[BaseException] = []

    def open_it() -> None:
        try:
            Queue(f"{pg_url}&lock_wait=1").close()
        except BaseException as exc:
            failures.append(exc)

    with held_for_good(pg_server, f"SELECT pg_advisory_lock(hashtext('nbqueue:{schema}'))"):
        for where in ("main", "thread"):
            began = time.monotonic()
            if where == "main":
                open_it()
            else:
                opener = threading.Thread(target=open_it)
                opener.start()
                opener.join(30)
            waited = time.monotonic() - began
            assert len(failures) == 1, f"the open ({where}) did not fail: {failures}"
            error = failures.pop()
            assert isinstance(error, nbqueue.StorageError), repr(error)
            assert f"advisory lock hashtext('nbqueue:{schema}')" in str(error)
            assert 0.9 < waited < 3.5, f"the open ({where}) gave up after {waited:.2f} s, not after 1 s"
    Queue(f"{pg_url}&lock_wait=1").close()  # let go: it opens


def test_lock_wait_must_be_a_positive_number_of_seconds(pg_url: str) -> None:
    for bad in ("0", "-1", "soon", "nan", "1e9"):
        with pytest.raises(nbqueue.InvalidArgument, match="lock_wait must be a number of seconds"):
            Queue(f"{pg_url}&lock_wait={bad}")


# -- the disk fills up ------------------------------------------------------------------------


def limit_pages(q: Queue, spare: int) -> None:
    """Let the queue's writing connection grow the file by only `spare` more pages (a full disk)."""
    conn, _ = q.manager.storage._write_conn()  # type: ignore[attr-defined]
    pages = conn.execute("PRAGMA page_count").fetchone()[0]
    assert conn.execute(f"PRAGMA max_page_count = {pages + spare}").fetchone()[0] == pages + spare


def test_disk_full_refuses_cleanly_and_keeps_every_earlier_job(tmp_path: Path) -> None:
    """SQLite only: the shared PostgreSQL server's disk cannot be filled in CI (and a
    PostgreSQL DiskFull is the server's to report; nbqueue maps it to DatabaseFull)."""
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
        q.manager.storage._write_conn()[0].execute("PRAGMA max_page_count = 1073741823")  # type: ignore[attr-defined]
        more = q.enqueue_many([{"batch": n} for n in range(50)])
        assert min(more) > max(written)
        assert q.counts()["pending"] == len(written) + 51


def test_disk_full_while_recording_an_outcome_keeps_the_claim(tmp_path: Path) -> None:
    """SQLite only: the shared PostgreSQL server's disk cannot be filled in CI (and a
    PostgreSQL DiskFull is the server's to report; nbqueue maps it to DatabaseFull)."""
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
    """SQLite only: a corrupt or truncated file is a SQLite notion; PostgreSQL's own storage
    is the server's business, and nbqueue never sees its files."""
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
    """SQLite only: a corrupt or truncated file is a SQLite notion; PostgreSQL's own storage
    is the server's business, and nbqueue never sees its files."""
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


@pytest.mark.parametrize(("backend", "damage"), DAMAGE_CASES)
def test_a_damaged_row_is_a_storage_error(place: Place, damage: str) -> None:
    """A row damaged by hand: a payload that is not JSON (in SQLite, which has no page
    checksums, a byte flipped in the file), JSON nested 100,000 deep, a backoff that is JSON
    but no backoff, text in the priority column (SQLite; a PostgreSQL BIGINT refuses it).

    Reading that job raises DamagedJob, a StorageError naming it (not json.JSONDecodeError
    or RecursionError); claiming neither crashes nor lets the damaged row block or hold the
    good job, and moves it to the dead letters saying why; listings and the table of jobs
    still show every row (a damaged one with its damage: one bad row never hides the others)."""
    with place.open() as q:
        bad = q.enqueue({"who": "CORRUPT-ME"})
        good = q.enqueue({"who": "fine"})
    place.damage(bad.id, damage, b'{"who":"CORRUPT-ME"}')
    with place.open() as q:
        assert q.get(good.id).payload == {"who": "fine"}
        with pytest.raises(nbqueue.DamagedJob, match=f"job {bad.id}"):
            q.get(bad.id)
        for listing in (q.jobs(), q.jobs(status="pending")):
            assert [j.id for j in listing] == [good.id, bad.id]
            damaged = listing[1]
            assert damaged.payload is None and "cannot be read" in (damaged.error or "")
        assert [j.id for j in q.jobs(brief=True)] == [good.id, bad.id]
        table = q.history()
        assert sorted(table["id"]) == sorted([bad.id, good.id])
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
        assert [j.id for j in q.jobs(status="running")] == [good.id]
        dead = q.dead_letters()
        assert list(dead["id"]) == [bad.id]
        why = str(dead.loc[bad.id, "error"])
        assert f"job {bad.id}" in why and "cannot be read" in why, why
        assert place.rows_by_status() == {**dict.fromkeys(STATES, 0), "running": 1, "dead": 1}


@pytest.mark.parametrize(("backend", "damage"), DAMAGE_CASES)
def test_a_worker_survives_a_row_it_cannot_read(place: Place, damage: str) -> None:
    """One unreadable row must not stop the worker: it goes to the dead letters with an
    error saying why, and the other jobs still run."""
    with place.open() as q:

        @q.task(name="faults.echo", max_retries=0)
        def echo(text: str) -> str:
            return text

        bad = echo.enqueue("CORRUPT-ME")  # the first in line
        good = [echo.enqueue(f"fine {i}") for i in range(4)]
    place.damage(bad.id, damage, b'"CORRUPT-ME"')
    with place.open() as q:
        worker = q.worker(lease=0.5).start()
        try:
            wait_until(
                lambda: q.counts()["completed"] == 4,
                timeout=10,
                what="the 4 readable jobs completed",
            )
            assert worker.running
            wait_until(lambda: q.counts()["dead"] == 1, timeout=10, what="the damaged job buried")
        finally:
            worker.stop(timeout=5)
        assert [q.get(j.id).value for j in good] == [f"fine {i}" for i in range(4)]
        with pytest.raises(nbqueue.StorageError):
            q.get(bad.id)
        dead = q.dead_letters()
        assert list(dead["id"]) == [bad.id]
        why = str(dead.loc[bad.id, "error"])
        assert f"job {bad.id}" in why and "cannot be read" in why, why
        assert sorted(j.id for j in q.jobs(status="completed")) == [j.id for j in good]
        assert sorted(q.history()["id"]) == sorted([bad.id, *(j.id for j in good)])
        assert place.rows_by_status() == {**dict.fromkeys(STATES, 0), "completed": 4, "dead": 1}


def test_schema_from_a_newer_nbqueue_is_refused_and_left_untouched(place: Place) -> None:
    """SQLite: the file's user_version; PostgreSQL: the version in the schema's nbqueue_meta."""
    with place.open() as q:
        job = q.enqueue({"keep": "me"})
    version = place.schema_version()
    place.set_schema_version(2147483647)
    before = place.snapshot()
    with pytest.raises(nbqueue.SchemaTooNew, match="upgrade"):
        Queue(place.target)
    done = run_cli("stats", place.target)
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    assert done.stderr.count("\n") == 1 and "upgrade" in done.stderr
    assert place.snapshot() == before  # no migration, no rewrite
    # Set back by hand, the queue opens again with its job.
    place.set_schema_version(version)
    with place.open() as q:
        assert q.get(job.id).payload == {"keep": "me"}


# -- the clock jumps backwards ------------------------------------------------------------------


def test_clock_jumping_back_an_hour_keeps_leases_and_claims_nothing_twice(place: Place) -> None:
    clock = ManualClock()
    with place.open(clock=clock, backoff=Backoff(base=2, cap=60, jitter=0)) as q:
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


def test_worker_survives_the_clock_jumping_back(place: Place) -> None:
    clock = ManualClock()
    with place.open(clock=clock) as q:
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


@pytest.mark.slow  # real seconds: a timeout fires
def test_a_handler_hanging_past_its_timeout_is_retried_and_its_late_return_refused(place: Place) -> None:
    """Not a storage fault, but the late return is refused by storage: run on both."""
    with place.open() as q:
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


@pytest.mark.slow  # real seconds: it proves a real-time bound
def test_without_a_timeout_a_hung_handler_keeps_its_lease(place: Place) -> None:
    """Documented behaviour: heartbeats come from the worker, not the handler, so a handler that
    hangs with no `timeout` holds its job for as long as the process lives; recover() never
    takes it back. Give a task that can hang a `timeout=`."""
    with place.open() as q:
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
