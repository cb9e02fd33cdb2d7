"""SQLite storage: one file in WAL mode, one connection per thread, BEGIN IMMEDIATE writes."""

from __future__ import annotations

import os
import sqlite3
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager, suppress
from functools import lru_cache
from pathlib import Path
from typing import Any, TypeVar

from ..clock import to_us
from ..errors import (
    DatabaseFull,
    InvalidArgument,
    InvalidTransition,
    NbqueueError,
    NotAQueueDatabase,
    ReadOnlyDatabase,
    SchemaTooNew,
    StorageError,
)
from ..jobs import Job, State
from . import COLUMNS, ClaimRequest, Filter, NewJob, row_to_job

APPLICATION_ID = 0x6E627175  # "nbqu": marks a file as an nbqueue database
SCHEMA_VERSION = 3
NEXT_DUE_SCAN = 10_000
BUSY_TIMEOUT_MS = 10_000
LOCKED_RETRY_SECONDS = 120.0  # beyond busy_timeout: contention is waited out, never surfaced

_STATES = tuple(s.value for s in State)
_CLAIMABLE_SQL = "status IN ('pending', 'failed')"  # must match the partial indexes verbatim

MIGRATIONS: dict[int, str] = {
    1: f"""
    CREATE TABLE nbqueue_jobs (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        status TEXT NOT NULL CHECK (status IN {_STATES!r}),
        queue TEXT NOT NULL,
        task TEXT,
        payload TEXT NOT NULL,
        priority INTEGER NOT NULL DEFAULT 0,
        key TEXT,
        retries INTEGER NOT NULL DEFAULT 0,
        max_retries INTEGER NOT NULL,
        attempts INTEGER NOT NULL DEFAULT 0,
        error TEXT,
        run_at INTEGER NOT NULL,
        created_at INTEGER NOT NULL,
        updated_at INTEGER NOT NULL,
        started_at INTEGER,
        finished_at INTEGER,
        lease_until INTEGER,
        lease_us INTEGER,
        worker_id TEXT,
        timeout REAL,
        output TEXT,
        backoff TEXT,
        result TEXT
    );
    CREATE INDEX nbqueue_claim_queue ON nbqueue_jobs (queue, priority DESC, run_at, id)
        WHERE {_CLAIMABLE_SQL};
    CREATE INDEX nbqueue_claim_any ON nbqueue_jobs (priority DESC, run_at, id)
        WHERE {_CLAIMABLE_SQL};
    CREATE INDEX nbqueue_due ON nbqueue_jobs (run_at) WHERE {_CLAIMABLE_SQL};
    CREATE UNIQUE INDEX nbqueue_key ON nbqueue_jobs (key)
        WHERE key IS NOT NULL AND status IN ('pending', 'failed', 'running');
    CREATE INDEX nbqueue_lease ON nbqueue_jobs (lease_until) WHERE status = 'running';
    CREATE INDEX nbqueue_status ON nbqueue_jobs (status, id);
    -- Counts per (queue, status), kept by triggers so the board never scans the table.
    CREATE TABLE nbqueue_counts (
        queue TEXT NOT NULL, status TEXT NOT NULL, n INTEGER NOT NULL,
        PRIMARY KEY (queue, status)
    ) WITHOUT ROWID;
    CREATE TRIGGER nbqueue_count_insert AFTER INSERT ON nbqueue_jobs BEGIN
        INSERT INTO nbqueue_counts VALUES (new.queue, new.status, 1)
            ON CONFLICT (queue, status) DO UPDATE SET n = n + 1;
    END;
    CREATE TRIGGER nbqueue_count_delete AFTER DELETE ON nbqueue_jobs BEGIN
        UPDATE nbqueue_counts SET n = n - 1 WHERE queue = old.queue AND status = old.status;
    END;
    CREATE TRIGGER nbqueue_count_update AFTER UPDATE OF status ON nbqueue_jobs
        WHEN old.status != new.status BEGIN
        UPDATE nbqueue_counts SET n = n - 1 WHERE queue = old.queue AND status = old.status;
        INSERT INTO nbqueue_counts VALUES (new.queue, new.status, 1)
            ON CONFLICT (queue, status) DO UPDATE SET n = n + 1;
    END;
    """,
    # Fewer indexes, faster writes: every claim now seeks the per-queue index.
    2: """
    DROP INDEX nbqueue_claim_any;
    DROP INDEX nbqueue_due;
    """,
    # Progress reported from inside a job; periodic tasks' last enqueued slot.
    3: """
    ALTER TABLE nbqueue_jobs ADD COLUMN progress_done REAL;
    ALTER TABLE nbqueue_jobs ADD COLUMN progress_total REAL;
    ALTER TABLE nbqueue_jobs ADD COLUMN progress_message TEXT;
    CREATE TABLE nbqueue_periodic (name TEXT PRIMARY KEY, last_slot INTEGER NOT NULL) WITHOUT ROWID;
    """,
}

T = TypeVar("T")

# In-process wake-ups, shared by every SQLiteStorage on the same file.
_signals: dict[str, threading.Condition] = {}
_signals_lock = threading.Lock()
# Writers in one process take turns on a lock of ours: SQLite's own busy handler sleeps in
# steps of milliseconds, which would waste most of the time threads spend waiting on each other.
_write_locks: dict[str, threading.Lock] = {}
_open: weakref.WeakSet[SQLiteStorage] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    """A forked child inherits locks that may be held and connections it must never use."""
    _write_locks.clear()
    for storage in list(_open):
        storage._local = threading.local()
        storage._all = []
        storage._write_lock = _write_locks.setdefault(storage.path, threading.Lock())


os.register_at_fork(after_in_child=_after_fork_in_child)


def _translate(exc: sqlite3.Error, path: str) -> NbqueueError:
    """Turn a raw sqlite3 error into the nbqueue error that says what to do."""
    text = str(exc).lower()
    if "unique constraint failed: nbqueue_jobs.key" in text:
        return InvalidTransition("another unfinished job already holds that key")
    if "readonly" in text or "read-only" in text or "unable to open" in text:
        return ReadOnlyDatabase(f"{path}: the queue database cannot be written ({exc})")
    if "full" in text:
        return DatabaseFull(f"{path}: the database or disk is full; nothing was written ({exc})")
    if "not a database" in text or "malformed" in text or "corrupt" in text:
        return NotAQueueDatabase(f"{path}: not a readable nbqueue database ({exc})")
    return StorageError(f"{path}: {exc}")


def _is_locked(exc: sqlite3.Error) -> bool:
    return isinstance(exc, sqlite3.OperationalError) and ("locked" in str(exc) or "busy" in str(exc))


class SQLiteStorage:
    """Jobs in one SQLite file; safe from many threads and processes."""

    server_clock = False

    def __init__(self, path: str | os.PathLike[str], *, synchronous: str = "normal") -> None:
        path = os.fspath(path)
        if path == ":memory:" or path.startswith("file::memory:"):
            raise InvalidArgument(
                "an in-memory SQLite database cannot be shared by the worker threads; "
                "give a file path (a temporary one is fine)"
            )
        if synchronous not in ("normal", "full"):
            raise InvalidArgument(f"synchronous must be 'normal' or 'full', not {synchronous!r}")
        self.path = str(Path(path).expanduser().resolve())
        self.synchronous = synchronous
        self._local = threading.local()
        self._all: list[sqlite3.Connection] = []
        self._all_lock = threading.Lock()
        self._closed = False
        with _signals_lock:
            self._signal = _signals.setdefault(self.path, threading.Condition())
            self._write_lock = _write_locks.setdefault(self.path, threading.Lock())
            _open.add(self)
        self._create_file()
        self._migrate()

    # -- connections -----------------------------------------------------------

    def _create_file(self) -> None:
        if os.path.exists(self.path):
            return
        parent = os.path.dirname(self.path)
        if not os.path.isdir(parent):
            raise InvalidArgument(f"cannot create the queue {self.path}: no folder {parent}")
        # Build the new database privately, then link it into place: the link is atomic, so
        # processes opening a brand-new queue at once see no file or a finished one, never
        # a half-made file whose journal mode is changing under them.
        draft = f"{self.path}.{os.getpid()}.{threading.get_ident()}.new"
        try:  # owner-only: payloads may hold private data
            os.close(os.open(draft, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        except PermissionError as exc:
            raise ReadOnlyDatabase(f"cannot create the queue database {self.path}: {exc}") from exc
        try:
            conn = sqlite3.connect(draft, isolation_level=None)
            try:
                conn.execute("PRAGMA journal_mode = WAL")
                with self._immediate(conn):
                    self._apply_migrations(conn)
            finally:
                conn.close()
            try:
                os.link(draft, self.path)
            except FileExistsError:  # another process won the race: use its file
                pass
            except OSError:  # a file system without hard links: nearly as good
                if not os.path.exists(self.path):
                    os.replace(draft, self.path)
        except sqlite3.Error as exc:
            raise _translate(exc, self.path) from exc
        finally:
            for leftover in (draft, f"{draft}-wal", f"{draft}-shm"):
                with suppress(FileNotFoundError):
                    os.unlink(leftover)

    def _conn(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            if self._closed:
                raise StorageError(f"{self.path}: the queue is closed")
            try:
                conn = sqlite3.connect(
                    self.path, isolation_level=None, check_same_thread=False, timeout=BUSY_TIMEOUT_MS / 1000
                )
                conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
                conn.execute(f"PRAGMA synchronous = {self.synchronous.upper()}")
            except sqlite3.Error as exc:
                raise _translate(exc, self.path) from exc
            self._local.conn = conn
            with self._all_lock:
                self._all.append(conn)
        return conn

    def _retrying(self, work: Callable[[sqlite3.Connection], T]) -> T:
        """Run `work`, waiting out lock contention so 'database is locked' never escapes."""
        deadline = time.monotonic() + LOCKED_RETRY_SECONDS
        pause = 0.001
        while True:
            try:
                return work(self._conn())
            except sqlite3.Error as exc:
                if _is_locked(exc) and time.monotonic() < deadline:
                    time.sleep(pause)
                    pause = min(pause * 2, 0.05)
                    continue
                raise _translate(exc, self.path) from exc

    @contextmanager
    def _immediate(self, conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
        """A write transaction that takes the write lock up front, so it never deadlocks."""
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield conn
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:  # also after a failed COMMIT: never leave it open
                conn.execute("ROLLBACK")
            raise

    def _write(self, work: Callable[[sqlite3.Connection], T]) -> T:
        def run(conn: sqlite3.Connection) -> T:
            with self._write_lock, self._immediate(conn):
                return work(conn)

        return self._retrying(run)

    def _read(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        return self._retrying(lambda conn: conn.execute(sql, params).fetchall())

    # -- schema ----------------------------------------------------------------

    def _migrate(self) -> None:
        def check(conn: sqlite3.Connection) -> int:
            conn.execute("BEGIN")  # one snapshot: another opener may be migrating right now
            try:
                return self._version(conn)
            finally:
                conn.execute("COMMIT")

        # Many processes may open a brand-new file at once: every step waits out the others.
        self._retrying(lambda conn: conn.execute("PRAGMA journal_mode = WAL").fetchone())
        if self._retrying(check) < SCHEMA_VERSION:
            self._write(self._apply_migrations)

    def _version(self, conn: sqlite3.Connection) -> int:
        """The file's schema version (0: empty); raises if it is not ours or too new."""
        app_id, version, tables = conn.execute(
            "SELECT (SELECT application_id FROM pragma_application_id), "
            "(SELECT user_version FROM pragma_user_version), "
            "(SELECT count(*) FROM sqlite_master WHERE name NOT LIKE 'sqlite_%')"
        ).fetchone()
        if app_id == 0 and version == 0:
            if tables:
                raise NotAQueueDatabase(
                    f"{self.path} is a SQLite database of something else, not an nbqueue queue"
                )
            return 0
        if app_id != APPLICATION_ID:
            raise NotAQueueDatabase(f"{self.path} is not an nbqueue database")
        if version > SCHEMA_VERSION:
            raise SchemaTooNew(
                f"{self.path} has schema version {version}, newer than this nbqueue "
                f"understands ({SCHEMA_VERSION}); upgrade nbqueue (pip install -U nbqueue)"
            )
        return int(version)

    def _apply_migrations(self, conn: sqlite3.Connection) -> None:
        version = self._version(conn)  # re-read under the write lock
        for target in sorted(v for v in MIGRATIONS if v > version):
            for statement in _split_sql(MIGRATIONS[target]):
                conn.execute(statement)
            conn.execute(f"PRAGMA user_version = {target}")
        conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")

    # -- verbs -----------------------------------------------------------------

    def insert(self, jobs: Sequence[NewJob], now: int | None) -> list[tuple[int, bool]]:
        now = _stamp(now)
        rows = [_insert_row(j, now) for j in jobs]
        insert_sql = _INSERT_SQL

        def work(conn: sqlite3.Connection) -> list[tuple[int, bool]]:
            if len(rows) > 1 and all(j.key is None for j in jobs):
                conn.executemany(insert_sql, rows)
                last = conn.execute("SELECT last_insert_rowid()").fetchone()[0]
                return [(i, True) for i in range(last - len(rows) + 1, last + 1)]
            out = []
            for job, row in zip(jobs, rows, strict=True):
                if job.key is not None:
                    held = conn.execute(
                        "SELECT id FROM nbqueue_jobs WHERE key = ? AND status IN "
                        "('pending', 'failed', 'running')",
                        (job.key,),
                    ).fetchone()
                    if held:
                        out.append((held[0], False))
                        continue
                out.append((conn.execute(insert_sql, row).lastrowid or 0, True))
            return out

        ids = self._write(work)
        self.notify()
        return ids

    def claim(self, where: Filter, worker_id: str, lease_us: int, now: int | None) -> Job | None:
        now = _stamp(now)
        return self._write(lambda conn: _claim(conn, ClaimRequest(where, worker_id, lease_us), now))

    def heartbeat(self, job_id: int, attempt: int, lease_us: int | None, now: int | None) -> int | None:
        now = _stamp(now)
        row = self._write(
            lambda conn: conn.execute(
                "UPDATE nbqueue_jobs SET lease_until = ? + coalesce(?, lease_us), updated_at = ? "
                "WHERE id = ? AND status = 'running' AND attempts = ? AND lease_until > ? "
                "RETURNING lease_until",
                (now, lease_us, now, job_id, attempt, now),
            ).fetchone()
        )
        return None if row is None else int(row[0])

    def complete(
        self,
        job_id: int,
        attempt: int,
        result: str,
        output: str | None,
        now: int | None,
        then_claim: ClaimRequest | None = None,
    ) -> tuple[bool, Job | None]:
        now = _stamp(now)

        def work(conn: sqlite3.Connection) -> tuple[bool, Job | None]:
            done = (
                conn.execute(
                    "UPDATE nbqueue_jobs SET status = 'completed', result = ?, output = ?, "
                    "finished_at = ?, updated_at = ?, lease_until = NULL WHERE id = ? "
                    "AND status = 'running' AND attempts = ? AND lease_until > ?",
                    (result, output, now, now, job_id, attempt, now),
                ).rowcount
                == 1
            )
            if not done or then_claim is None:
                return done, None
            # The next claim rides in the same commit: half the fsyncs per job.
            return True, _claim(conn, then_claim, now)

        return self._write(work)

    def fail(
        self,
        job_id: int,
        attempt: int,
        error: str,
        output: str | None,
        status: State,
        delay_us: int,
        now: int | None,
        expired: bool = False,
    ) -> bool:
        now = _stamp(now)
        lease_test = "lease_until <= ?" if expired else "lease_until > ?"
        finished = now if status is State.DEAD else None
        changed = self._write(
            lambda conn: (
                conn.execute(
                    "UPDATE nbqueue_jobs SET status = ?, error = ?, output = ?, "
                    "retries = retries + (? = 'failed'), "  # a dead job used its retries; none is added
                    "run_at = CASE WHEN ? = 'failed' THEN ? ELSE run_at END, finished_at = ?, "
                    "updated_at = ?, lease_until = NULL WHERE id = ? AND status = 'running' "
                    f"AND attempts = ? AND {lease_test}",
                    (
                        status.value,
                        error,
                        output,
                        status.value,
                        status.value,
                        now + delay_us,
                        finished,
                        now,
                        job_id,
                        attempt,
                        now,
                    ),
                ).rowcount
                == 1
            )
        )
        if changed and status is State.FAILED:
            self.notify()
        return changed

    def release(self, job_id: int, attempt: int, now: int | None) -> bool:
        now = _stamp(now)
        changed = self._write(
            lambda conn: (
                conn.execute(
                    "UPDATE nbqueue_jobs SET status = 'pending', lease_until = NULL, worker_id = NULL, "
                    "updated_at = ? WHERE id = ? AND status = 'running' AND attempts = ?",
                    (now, job_id, attempt),
                ).rowcount
                == 1
            )
        )
        if changed:
            self.notify()
        return changed

    def transition(
        self, ids: Iterable[int] | None, sources: Sequence[State], target: State, now: int | None
    ) -> list[int]:
        now = _stamp(now)
        src_sql, src_params = _in("status", tuple(s.value for s in sources))
        if target is State.PENDING:  # requeue: a fresh start, the last error kept
            sets = "retries = 0, run_at = ?, lease_until = NULL, worker_id = NULL, finished_at = NULL"
            set_params: list[Any] = [now]
        else:
            sets = "lease_until = NULL, finished_at = ?"
            set_params = [now]
        sql = f"UPDATE nbqueue_jobs SET status = ?, updated_at = ?, {sets} WHERE 1{src_sql}"
        if target is State.PENDING:
            sql += _KEY_IS_FREE.format(t="nbqueue_jobs", src=src_sql.replace("status", "d.status"))
            src_params = src_params * 2
        if ids is None:
            changed = self._write(
                lambda conn: [
                    r[0]
                    for r in conn.execute(
                        sql + " RETURNING id", (target.value, now, *set_params, *src_params)
                    )
                ]
            )
        else:
            id_list = list(ids)

            def work(conn: sqlite3.Connection) -> list[int]:
                done = []
                for job_id in id_list:
                    row = conn.execute(
                        sql + " AND id = ? RETURNING id",
                        (target.value, now, *set_params, *src_params, job_id),
                    ).fetchone()
                    if row:
                        done.append(row[0])
                return done

            changed = self._write(work)
        if changed and target is State.PENDING:
            self.notify()
        return sorted(changed)

    def progress(
        self, job_id: int, attempt: int, done: float, total: float | None, message: str, now: int | None
    ) -> bool:
        now = _stamp(now)
        return self._write(
            lambda conn: (
                conn.execute(
                    "UPDATE nbqueue_jobs SET progress_done = ?, progress_total = ?, progress_message = ?, "
                    "updated_at = ? WHERE id = ? AND status = 'running' AND attempts = ?",
                    (done, total, message, now, job_id, attempt),
                ).rowcount
                == 1
            )
        )

    def periodic(self, name: str, slot_us: int, job: NewJob, now: int | None) -> bool:
        now = _stamp(now)

        def work(conn: sqlite3.Connection) -> bool:
            row = conn.execute("SELECT last_slot FROM nbqueue_periodic WHERE name = ?", (name,)).fetchone()
            if row is None:  # first sighting: record the slot; the first job is the next slot's
                conn.execute("INSERT INTO nbqueue_periodic VALUES (?, ?)", (name, slot_us))
                return False
            if row[0] >= slot_us:
                return False
            conn.execute("UPDATE nbqueue_periodic SET last_slot = ? WHERE name = ?", (slot_us, name))
            conn.execute(_INSERT_SQL, _insert_row(job, now))
            return True

        taken = self._write(work)
        if taken:
            self.notify()
        return taken

    def get(self, job_id: int) -> Job | None:
        rows = self._read(f"SELECT {COLUMNS} FROM nbqueue_jobs WHERE id = ?", (job_id,))
        return row_to_job(rows[0]) if rows else None

    def get_many(self, job_ids: Sequence[int]) -> list[Job]:
        out: list[Job] = []
        for start in range(0, len(job_ids), 500):
            chunk = job_ids[start : start + 500]
            sql = f"SELECT {COLUMNS} FROM nbqueue_jobs WHERE id IN ({', '.join('?' * len(chunk))})"
            out.extend(row_to_job(r) for r in self._read(sql, chunk))
        return out

    def expired(self, now: int | None, limit: int) -> list[Job]:
        now = _stamp(now)
        rows = self._read(
            f"SELECT {COLUMNS} FROM nbqueue_jobs WHERE status = 'running' AND lease_until <= ? "
            "ORDER BY lease_until LIMIT ?",
            (now, limit),
        )
        return [row_to_job(r) for r in rows]

    def delete(self, ids: Iterable[int], statuses: Sequence[State]) -> int:
        src_sql, src_params = _in("status", tuple(s.value for s in statuses))
        id_list = list(ids)
        return self._write(
            lambda conn: sum(
                conn.execute(f"DELETE FROM nbqueue_jobs WHERE id = ?{src_sql}", (i, *src_params)).rowcount
                for i in id_list
            )
        )

    def purge(
        self, statuses: Sequence[State], older_than_us: int, now: int | None, limit: int | None = None
    ) -> int:
        now = _stamp(now)
        before = now - older_than_us + (0 if older_than_us else 1)  # age 0: everything so far
        src_sql, src_params = _in("status", tuple(s.value for s in statuses))
        where = f"updated_at < ?{src_sql}"
        if limit is not None:  # small batches keep the write lock short
            where = f"id IN (SELECT id FROM nbqueue_jobs WHERE {where} ORDER BY id LIMIT {int(limit)})"
        return self._write(
            lambda conn: (
                conn.execute(f"DELETE FROM nbqueue_jobs WHERE {where}", (before, *src_params)).rowcount
            )
        )

    def counts(self, queue: str | None = None) -> dict[str, int]:
        if queue is None:
            rows = self._read("SELECT status, sum(n) FROM nbqueue_counts GROUP BY status")
        else:
            rows = self._read("SELECT status, n FROM nbqueue_counts WHERE queue = ?", (queue,))
        found = {status: int(n) for status, n in rows}
        return {s.value: found.get(s.value, 0) for s in State}

    def rows(
        self, status: Sequence[State] | None, queue: str | None, limit: int, offset: int = 0
    ) -> list[Job]:
        where, params = "", list[Any]()
        if status is not None:
            sql, params = _in("status", tuple(s.value for s in status))
            where += sql
        if queue is not None:
            where += " AND queue = ?"
            params.append(queue)
        rows = self._read(
            f"SELECT {COLUMNS} FROM nbqueue_jobs WHERE 1{where} ORDER BY id DESC LIMIT ? OFFSET ?",
            (*params, limit, offset),
        )
        return [row_to_job(r) for r in rows]

    def queues(self) -> list[str]:
        return [
            r[0] for r in self._read("SELECT DISTINCT queue FROM nbqueue_counts WHERE n > 0 ORDER BY queue")
        ]

    def next_due(self, where: Filter) -> int | None:
        if where.matches_nothing:
            return None
        task_sql, task_params = _in("task", where.tasks)
        # The earliest run_at among the first rows of each queue's claim index: exact unless a
        # queue holds over NEXT_DUE_SCAN waiting jobs, and the worker re-checks every moment anyway.
        sql = (
            f"SELECT min(run_at) FROM (SELECT run_at FROM nbqueue_jobs INDEXED BY nbqueue_claim_queue "
            f"WHERE {_CLAIMABLE_SQL} AND queue = ?{task_sql} LIMIT {NEXT_DUE_SCAN})"
        )

        def work(conn: sqlite3.Connection) -> int | None:
            queues = where.queues if where.queues is not None else _waiting_queues(conn)
            found = [conn.execute(sql, (q, *task_params)).fetchone()[0] for q in queues]
            due = [int(f) for f in found if f is not None]
            return min(due) if due else None

        return self._retrying(work)

    def task_names(self, statuses: Sequence[State]) -> list[str]:
        src_sql, params = _in("status", tuple(s.value for s in statuses))
        rows = self._read(f"SELECT DISTINCT task FROM nbqueue_jobs WHERE task IS NOT NULL{src_sql}", params)
        return sorted(r[0] for r in rows)

    def now(self) -> int | None:
        return None

    def data_version(self) -> int:
        """Changes whenever another connection commits to the file."""
        return int(self._read("PRAGMA data_version")[0][0])

    def wait_for_change(self, timeout: float) -> None:
        # PRAGMA data_version sees commits by other processes without taking a lock.
        before = self.data_version()
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            with self._signal:
                if self._signal.wait(min(left, 0.02)):
                    return
            if self.data_version() != before:
                return

    def notify(self) -> None:
        with self._signal:
            self._signal.notify_all()

    def close(self) -> None:
        self._closed = True
        with self._all_lock:
            for conn in self._all:
                with suppress(sqlite3.Error):
                    conn.close()
            self._all.clear()
        self._local = threading.local()


@lru_cache(maxsize=256)
def _claim_sql(n_queues: int, n_tasks: int | None) -> str:
    task_sql = "" if n_tasks is None else f" AND task IN ({', '.join('?' * n_tasks)})"
    # One index seek per queue, then the best of those few candidates.
    branch = (
        f"SELECT * FROM (SELECT id, priority, run_at FROM nbqueue_jobs "
        f"INDEXED BY nbqueue_claim_queue WHERE {_CLAIMABLE_SQL} AND queue = ? "
        f"AND run_at <= ?{task_sql} ORDER BY priority DESC, run_at, id LIMIT 1)"
    )
    pick = (
        "SELECT id FROM ("
        + " UNION ALL ".join([branch] * n_queues)
        + ") ORDER BY priority DESC, run_at, id LIMIT 1"
    )
    return (
        "UPDATE nbqueue_jobs SET status = 'running', attempts = attempts + 1, worker_id = ?, "
        "lease_until = ?, lease_us = ?, started_at = ?, updated_at = ?, progress_done = NULL, "
        f"progress_total = NULL, progress_message = NULL WHERE id = ({pick}) RETURNING {COLUMNS}"
    )


def _waiting_queues(conn: sqlite3.Connection) -> tuple[str, ...]:
    """The queues that hold claimable jobs, from the counts table (a handful of rows)."""
    rows = conn.execute(
        "SELECT queue FROM nbqueue_counts WHERE status IN ('pending', 'failed') AND n > 0"
    ).fetchall()
    return tuple(dict.fromkeys(r[0] for r in rows))


def _claim(conn: sqlite3.Connection, request: ClaimRequest, now: int) -> Job | None:
    """The single UPDATE ... WHERE id = (SELECT ... LIMIT 1) RETURNING that claims a job.

    Run inside the caller's BEGIN IMMEDIATE. "Every queue" means every queue that has
    claimable jobs now, so one index, (queue, priority, run_at, id), serves every claim.
    """
    where, worker_id, lease_us = request
    if where.matches_nothing:
        return None
    queues = where.queues if where.queues is not None else _waiting_queues(conn)
    if not queues:
        return None
    tasks = list(where.tasks) if where.tasks is not None else []
    sql = _claim_sql(len(queues), None if where.tasks is None else len(tasks))
    picks = [p for q in queues for p in (q, now, *tasks)]
    row = conn.execute(sql, [worker_id, now + lease_us, lease_us, now, now, *picks]).fetchone()
    if row is None:
        return None
    try:
        return row_to_job(row)
    except StorageError as exc:  # a damaged row must not block the queue: it goes to the dead letters
        conn.execute(
            "UPDATE nbqueue_jobs SET status = 'dead', error = ?, lease_until = NULL, finished_at = ?, "
            "updated_at = ? WHERE id = ?",
            (str(exc), now, now, row[0]),
        )
        return None


# A requeued job must not take a key an unfinished job holds, nor two requeued jobs one key:
# of several with the same key, only the oldest comes back.
_KEY_IS_FREE = (
    " AND (key IS NULL OR (NOT EXISTS (SELECT 1 FROM {t} u WHERE u.key = {t}.key AND "
    "u.status IN ('pending', 'failed', 'running')) AND id = (SELECT min(d.id) FROM {t} d "
    "WHERE d.key = {t}.key{src})))"
)

_INSERT_SQL = (
    "INSERT INTO nbqueue_jobs (status, queue, task, payload, priority, key, max_retries, "
    "run_at, created_at, updated_at, timeout, backoff) VALUES ('pending', ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)


def _insert_row(j: NewJob, now: int) -> tuple[Any, ...]:
    run_at = now + j.delay_us if j.run_at_us is None else j.run_at_us
    return (
        j.queue,
        j.task,
        j.payload,
        j.priority,
        j.key,
        j.max_retries,
        run_at,
        now,
        now,
        j.timeout,
        j.backoff,
    )


def _stamp(now: int | None) -> int:
    """SQLite has no server clock: None means this machine's clock."""
    return to_us(time.time()) if now is None else now


def _in(column: str, values: Sequence[str] | None) -> tuple[str, list[Any]]:
    """` AND column IN (?, ...)` for a filter; nothing for None."""
    if values is None:
        return "", []
    if not values:
        return " AND 0", []
    return f" AND {column} IN ({', '.join('?' * len(values))})", list(values)


def _split_sql(script: str) -> list[str]:
    """Statements of a migration script; trigger bodies keep their inner semicolons."""
    statements, current = [], ""
    for line in script.strip().splitlines():
        current += line + "\n"
        if sqlite3.complete_statement(current):
            statements.append(current.strip())
            current = ""
    return statements
