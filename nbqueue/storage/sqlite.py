"""SQLite storage: one file in WAL mode; a connection per thread for reading and one for all
writes, in BEGIN IMMEDIATE transactions.

The queue verbs are `storage.sql`'s, over the statements in `sqlite_queries`; this
module keeps what only SQLite does: connections, transactions, waiting out lock
contention, claims in BEGIN IMMEDIATE, polling for other processes' commits,
migrations, and turning sqlite3's errors into nbqueue's.
"""

from __future__ import annotations

import functools
import json
import logging
import operator
import os
import sqlite3
import stat
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Collection, Sequence
from contextlib import suppress
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
from ..jobs import JobRow, State
from ..records import Suspension
from . import (
    ClaimRequest,
    Completion,
    Decide,
    Filter,
    Inserted,
    NewJob,
    Row,
    cascade,
    claim_order,
    limited,
    waits,
)
from . import sqlite_queries as sql
from .sql import SqlStorage
from .statements import NEW_COLUMNS, Params, Tx

_new_values = operator.attrgetter(*NEW_COLUMNS)

# A new file's page size. Every commit writes each page it touched to the WAL, and a job's
# write touches five or so (its row, the claim and state indexes, the counts, the id sequence):
# 2 KiB pages made enqueue and drain about a quarter faster than SQLite's 4 KiB, with the same
# claims at a million jobs. (A file keeps the page size it was made with.)
PAGE_SIZE = 2048
BUSY_TIMEOUT_MS = 10_000
LOCKED_RETRY_SECONDS = 120.0  # beyond busy_timeout: contention is waited out, never surfaced
# An idle worker looks for other processes' commits (PRAGMA data_version) soon after it
# starts waiting, then less often: a job queued elsewhere starts within tens of
# milliseconds, and a worker idle for long costs well under 1% of a core.
POLL_FIRST = 0.005
POLL_MOST = 0.05

T = TypeVar("T")
log = logging.getLogger("nbqueue.storage")


# In-process wake-ups, shared by every SQLiteStorage on the same file.
class _Signal(threading.Condition):
    """The wake-ups of one file's waiting workers, counted: a waiter busy reading when one came
    (between two of its polls) still sees it, instead of sleeping out its whole timeout."""

    def __init__(self) -> None:
        super().__init__()
        self.sent = 0


_signals: dict[str, _Signal] = {}
_signals_lock = threading.Lock()
# Writers in one process take turns on a lock of ours: SQLite's own busy handler sleeps in
# steps of milliseconds, which would waste most of the time threads spend waiting on each other.
_write_locks: dict[str, threading.Lock] = {}


def _translate(exc: sqlite3.Error | UnicodeDecodeError, path: str) -> NbqueueError:
    """Turn a raw sqlite3 error into the nbqueue error that says what to do."""
    if isinstance(exc, UnicodeDecodeError):  # sqlite3 could not even decode SQLite's message
        return NotAQueueDatabase(
            f"{path}: not a readable nbqueue database (damaged schema: {exc.object[:60]!r})"
        )
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


def _ids(values: Sequence[int] | Sequence[str] | None) -> str | None:
    """A list as the JSON array the statements read with json_each."""
    return None if values is None else json.dumps(list(values))


def _bind(params: Params) -> Params:
    """Parameters as sqlite3 takes them: each list as a JSON array."""
    return {k: json.dumps(v) if isinstance(v, list) else v for k, v in params.items()}


def _owner_only(path: str) -> None:
    """A queue file (or its -wal/-shm) that anyone may write, found already there, is made 0600
    with a warning: nbqueue makes its files 0600, so such a file was planted or loosened by hand.
    One owned by another user is refused: its owner can loosen it again whenever they like.
    A group-writable file is left as it is: sharing a queue with one's group is a choice."""
    if os.name != "posix":  # Windows has no such modes (every writable file reads as 0o666)
        return
    for name in (path, f"{path}-wal", f"{path}-shm"):
        try:
            found = os.stat(name)
        except FileNotFoundError:
            continue
        if not found.st_mode & stat.S_IWOTH:
            continue
        if found.st_uid != os.geteuid():
            raise StorageError(
                f"{name} is writable by anyone and owned by another user (uid {found.st_uid}): "
                "not opened as a queue; its owner can make it 0600, or use another path"
            )
        os.chmod(name, 0o600)
        loose = found.st_mode & 0o777
        log.warning("%s was writable by anyone (mode %o): made owner-only (0600)", name, loose)


class SQLiteStorage(SqlStorage):
    """Jobs in one SQLite file; safe from many threads and processes."""

    checkpoint_sql = sql.CHECKPOINT_SQL
    sql = sql.SQL
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
        self.path = self._where = str(Path(path).expanduser().resolve())
        self.synchronous = synchronous
        self._local = threading.local()  # each thread's connection for reading
        self._writer: tuple[sqlite3.Connection, threading.RLock] | None = None  # see _write_conn
        # Every connection with the lock held while it is in use: close() takes each lock
        # first, since closing a connection mid-statement in another thread crashes.
        self._all: list[tuple[sqlite3.Connection, threading.RLock]] = []
        self._all_lock = threading.Lock()
        self._closed = False
        # A queue dropped without close() (q = Queue(path) in a cell run twice) closes its
        # connections when collected, instead of leaving them to warn 'unclosed database'.
        weakref.finalize(self, _close_all, self._all, self._all_lock)
        with _signals_lock:
            self._signal = _signals.setdefault(self.path, _Signal())
            self._write_lock = _write_locks.setdefault(self.path, threading.Lock())
        self._create_file()
        _owner_only(self.path)
        try:
            self._migrate()
        except NbqueueError:  # refused: close, so that SQLite removes the -wal/-shm files it made
            self.close()
            raise

    # -- connections -----------------------------------------------------------

    def _create_file(self) -> None:
        if os.path.exists(self.path):
            return
        parent = os.path.dirname(self.path)
        if not os.path.isdir(parent):
            raise InvalidArgument(f"cannot create the queue {self.path}: no folder {parent}")
        # Build the new database privately, then link it into place: the link is atomic, so
        # processes opening a brand-new queue at once see no file or a finished one, never
        # a half-made file whose journal mode is changing under them. The draft's name is
        # unpredictable (and created owner-only), so nobody can plant a file there first.
        try:
            handle, draft = tempfile.mkstemp(
                prefix=f".{os.path.basename(self.path)}.", suffix=".new", dir=parent
            )
        except PermissionError as exc:
            raise ReadOnlyDatabase(f"cannot create the queue database {self.path}: {exc}") from exc
        except OSError as exc:
            raise StorageError(f"cannot create the queue database {self.path}: {exc}") from exc
        os.close(handle)
        try:
            conn = sqlite3.connect(draft, isolation_level=None)
            try:
                conn.execute(f"PRAGMA page_size = {PAGE_SIZE}")  # before anything is written
                conn.execute("PRAGMA journal_mode = WAL")
                _immediate(conn, self._apply_migrations)
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

    def _conn(self) -> tuple[sqlite3.Connection, threading.RLock]:
        """This thread's connection for reading, and the lock held while it is in use."""
        held: _Held | None = getattr(self._local, "held", None)
        if held is None:
            held = self._local.held = _Held(self._connect())
            # It closes when the thread ends (its locals are dropped), as on PostgreSQL: the
            # threads of a stopped worker leave no open files behind.
            weakref.finalize(held, _release, held.made, self._all, self._all_lock)
        return held.made

    def _write_conn(self) -> tuple[sqlite3.Connection, threading.RLock]:
        """The one connection all of this storage's writes use, whatever the thread. Writes go
        one at a time anyway (the write lock); on one connection they keep one warm page cache,
        where a connection per thread re-reads its pages after every other thread's commit."""
        writer = self._writer
        if writer is None:
            made = self._connect()
            with self._all_lock:  # two threads may race to make it: one is kept (both are closed)
                if self._writer is None:
                    self._writer = made
                writer = self._writer
        return writer

    def _connect(self) -> tuple[sqlite3.Connection, threading.RLock]:
        """A new connection and its in-use lock, registered for close()."""
        if self._closed:
            raise StorageError(f"{self.path}: the queue is closed")
        conn: sqlite3.Connection | None = None
        try:
            conn = sqlite3.connect(
                self.path, isolation_level=None, check_same_thread=False, timeout=BUSY_TIMEOUT_MS / 1000
            )
            conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            conn.execute(f"PRAGMA synchronous = {self.synchronous.upper()}")
        except (sqlite3.Error, UnicodeDecodeError) as exc:  # (a damaged schema's message)
            if conn is not None:
                conn.close()
            raise _translate(exc, self.path) from exc
        made = (conn, threading.RLock())
        with self._all_lock:
            self._all.append(made)
        return made

    def _retrying(self, work: Callable[[sqlite3.Connection], T], writing: bool = False) -> T:
        """Run `work` (on the write connection if `writing`), waiting out lock contention so
        'database is locked' never escapes."""
        deadline = time.monotonic() + LOCKED_RETRY_SECONDS
        pause = 0.001
        while True:
            try:
                conn, busy = self._write_conn() if writing else self._conn()
                with busy:
                    return work(conn)
            except UnicodeDecodeError as exc:  # SQLite's message about a damaged file, undecodable
                raise _translate(exc, self.path) from exc
            except sqlite3.Error as exc:
                if _is_locked(exc) and time.monotonic() < deadline:
                    time.sleep(pause)
                    pause = min(pause * 2, 0.05)
                    continue
                raise _translate(exc, self.path) from exc

    def _write(self, work: Callable[[sqlite3.Connection], T]) -> T:
        def run(conn: sqlite3.Connection) -> T:
            with self._write_lock:
                return _immediate(conn, work)

        return self._retrying(run, writing=True)

    def _change(self, statement: str, params: Params, lost: str | None = None) -> list[Row]:
        return self._write(lambda conn: conn.execute(statement, _bind(params)).fetchall())

    def _read(self, statement: str, params: Params | None = None) -> list[Row]:
        return self._retrying(lambda conn: conn.execute(statement, _bind(params or {})).fetchall())

    def _transaction(self, work: Callable[[Tx], T], committed: Callable[[], T | None] | None = None) -> T:
        return self._write(lambda conn: work(_tx(conn)))

    def _filter(self, where: Filter) -> Params:
        return _filter_params(where)

    def _wake_here(self) -> None:
        self.notify()

    def _insert_in(self, tx: Tx, job: NewJob, now: int | None) -> None:
        tx.raw.execute(sql.INSERT, _insert_row(job, self.stamp() if now is None else now))

    # -- schema ----------------------------------------------------------------

    def _migrate(self) -> None:
        def check(conn: sqlite3.Connection) -> int:
            conn.execute("BEGIN")  # one snapshot: another opener may be migrating right now
            try:
                return self._version(conn)
            finally:
                conn.execute("COMMIT")

        # Identity first, and only then anything that writes: a file that is not ours is
        # refused exactly as it was (no WAL switch, no -wal or -shm files left beside it).
        version = self._retrying(check)
        self._retrying(lambda conn: conn.execute("PRAGMA journal_mode = WAL").fetchone())
        if version < sql.SCHEMA_VERSION:
            self._write(self._apply_migrations)

    def _version(self, conn: sqlite3.Connection) -> int:
        """The file's schema version (0: empty); raises if it is not ours or too new."""
        app_id, version, tables = conn.execute(sql.IDENTITY).fetchone()
        if app_id == 0 and version == 0:
            if tables:
                raise NotAQueueDatabase(
                    f"{self.path} is a SQLite database of something else, not an nbqueue queue"
                )
            return 0
        if app_id != sql.APPLICATION_ID:
            raise NotAQueueDatabase(f"{self.path} is not an nbqueue database")
        if version > sql.SCHEMA_VERSION:
            raise SchemaTooNew(
                f"{self.path} has schema version {version}, newer than this nbqueue "
                f"understands ({sql.SCHEMA_VERSION}); upgrade nbqueue (pip install -U nbqueue)"
            )
        return int(version)

    def _apply_migrations(self, conn: sqlite3.Connection) -> None:
        version = self._version(conn)  # re-read under the write lock
        for target in sorted(v for v in sql.MIGRATIONS if v > version):
            if target in sql.CHECK_EDITS:
                _edit_check(conn, *sql.CHECK_EDITS[target])
            for statement in _split_sql(sql.MIGRATIONS[target]):
                conn.execute(statement)
            conn.execute(f"PRAGMA user_version = {int(target)}")
        conn.execute(f"PRAGMA application_id = {sql.APPLICATION_ID}")

    # -- writing ---------------------------------------------------------------

    def insert(self, jobs: Sequence[NewJob]) -> list[Inserted]:
        now = self.stamp()
        rows = [_insert_row(j, now) for j in jobs]

        def work(conn: sqlite3.Connection) -> list[Inserted]:
            if len(rows) > 1 and all(j.key is None for j in jobs):
                conn.executemany(sql.INSERT, rows)
                last = conn.execute("SELECT last_insert_rowid()").fetchone()[0]
                return [(i, True, now) for i in range(last - len(rows) + 1, last + 1)]
            out: list[Inserted] = []
            for job, row in zip(jobs, rows, strict=True):
                held = (
                    None if job.key is None else conn.execute(sql.SQL.HELD_KEY, {"key": job.key}).fetchone()
                )
                if held:
                    out.append((held[0], False, None))
                else:
                    out.append((conn.execute(sql.INSERT, row).lastrowid or 0, True, now))
            return out

        ids = self._write(work)
        self.notify()
        return ids

    def finish_batch(
        self,
        done: Sequence[Completion],
        then_claim: ClaimRequest | None,
        claims: int,
        suspended: Sequence[Suspension] = (),
        decide: Decide | None = None,
        peek: Collection[str] = (),
    ) -> tuple[list[bool], list[JobRow], int | None, list[Row] | None]:
        now = self.stamp()
        linked: list[int] = []

        def work(conn: sqlite3.Connection) -> tuple[list[bool], list[JobRow], list[Row] | None]:
            flags = _complete_all(conn, done, now, linked)
            if suspended:  # the batch's runs that now wait, in the same commit
                flags += waits.suspend_all(_tx(conn), suspended, now)
            # The next claims ride in the same commit.
            if then_claim is None or not claims or then_claim.where.matches_nothing:
                return flags, [], None
            where, params = then_claim.where, {**self._claim_params(then_claim), "now": now}
            if decide is not None:  # under limits: each job weighed as its own claim would be
                heads = sql.SQL.HEADS_IN_ANY_QUEUE if where.queues is None else sql.SQL.HEADS_IN_QUEUES
                taken = limited.take(_tx(conn), heads, params, decide, claims)
            else:
                first = _claim(conn, where, params)
                more = [] if first is None else _claim_more(conn, where, params, first, claims - 1)
                taken = [] if first is None else [first, *more]
            return flags, taken, _peeked(conn, taken, peek)

        flags, taken, peeked = self._write(work)
        if linked or suspended:  # children they let go may be due now (or a job sent a value)
            self.notify()
        return flags, taken, now, peeked

    def _deleted(self, statement: str, params: Params) -> int:
        return self._write(lambda conn: conn.execute(statement, _bind(params)).rowcount)

    def tidy(self) -> None:
        """Nothing to do: the counts table is kept exact by triggers."""

    def now(self) -> int | None:
        return None

    def stamp(self) -> int:
        """SQLite has no clock of its own: the queue's clock stamps every write."""
        return to_us(self.clock())

    # -- waiting ---------------------------------------------------------------

    def data_version(self) -> int:
        """Changes whenever another connection commits to the file."""
        return int(self._read("PRAGMA data_version")[0][0])

    def wait_for_change(self, timeout: float) -> None:
        # PRAGMA data_version sees commits by other processes without taking a lock.
        with self._signal:
            sent = self._signal.sent
        before = self.data_version()
        deadline = time.monotonic() + timeout
        poll = POLL_FIRST
        while (left := deadline - time.monotonic()) > 0:
            with self._signal:
                if self._signal.sent != sent or self._signal.wait(min(left, poll)):
                    return
            if self.data_version() != before:
                return
            poll = min(poll * 2, POLL_MOST)

    def notify(self) -> None:
        with self._signal:
            self._signal.sent += 1
            self._signal.notify_all()

    def wake(self) -> None:
        self.notify()

    def close(self) -> None:
        self._closed = True
        _close_all(self._all, self._all_lock)
        self._writer = None
        self._local = threading.local()


class _Held:
    """One thread's read connection, held in its thread-local storage."""

    def __init__(self, made: tuple[sqlite3.Connection, threading.RLock]) -> None:
        self.made = made


def _close_all(every: list[tuple[sqlite3.Connection, threading.RLock]], lock: threading.Lock) -> None:
    """Close every connection of a storage, each once no statement of its thread is running
    (closing a connection mid-statement in another thread crashes)."""
    with lock:
        for conn, busy in every:
            with busy, suppress(sqlite3.Error):
                conn.close()
        every.clear()


def _release(
    made: tuple[sqlite3.Connection, threading.RLock],
    every: list[tuple[sqlite3.Connection, threading.RLock]],
    lock: threading.Lock,
) -> None:
    """Close the read connection of a thread that has ended."""
    with lock:
        if made in every:
            every.remove(made)
    conn, busy = made
    with busy, suppress(sqlite3.Error):
        conn.close()


def _immediate(conn: sqlite3.Connection, work: Callable[[sqlite3.Connection], T]) -> T:
    """`work` in a write transaction that takes the write lock up front, so it never deadlocks.
    (A plain function, not a context manager: this is every write's path.)"""
    conn.execute("BEGIN IMMEDIATE")
    try:
        result = work(conn)
        conn.execute("COMMIT")
        return result
    except BaseException:
        if conn.in_transaction:  # also after a failed COMMIT: never leave it open
            conn.execute("ROLLBACK")
        raise


def _complete_all(
    conn: sqlite3.Connection, done: Sequence[Completion], now: int, linked: list[int]
) -> list[bool]:
    """Complete each job under its claim (False: its lease was lost); children of those that
    have some are settled in the same transaction, and their ids put in `linked`."""
    linked.clear()  # a retry after lock contention starts afresh
    if not done:
        return []
    rows = conn.execute(
        sql.COMPLETE_MANY, {"done": json.dumps([list(d) for d in done]), "now": now}
    ).fetchall()
    finished = {row[0] for row in rows}
    linked.extend(sorted(row[0] for row in rows if row[1]))
    if linked:
        cascade.resolve(_tx(conn), [(j, State.COMPLETED, None) for j in linked], now)
    return [d.job_id in finished for d in done]


def _peeked(conn: sqlite3.Connection, taken: list[JobRow], peek: Collection[str]) -> list[Row] | None:
    """The waits of the jobs just claimed, if several were and one's task reaches waits (None:
    not read): in the claim's transaction, a read costs a third of what a read of its own does
    after the commit (85 against 200 us a batch of 64, measured)."""
    if len(taken) > 1 and any(row.task in peek for row in taken):
        return conn.execute(sql.SQL.PEEK_WAITS, _bind({"ids": [row.id for row in taken]})).fetchall()
    return None


def _claim(conn: sqlite3.Connection, where: Filter, params: Params) -> JobRow | None:
    """Claim inside the caller's BEGIN IMMEDIATE: one UPDATE ... WHERE id = (best) RETURNING."""
    statement = sql.CLAIM_FROM_ANY_QUEUE if where.queues is None else sql.CLAIM_FROM_QUEUES
    row = conn.execute(statement, params).fetchone()
    return None if row is None else JobRow._make(row)


def _claim_more(
    conn: sqlite3.Connection, where: Filter, params: Params, first: JobRow, more: int
) -> list[JobRow]:
    """Up to `more` further claims after `first`, in claim order: in one statement when no other
    queue the request may take from holds claimable jobs (the usual case, one queue), so that
    order within `first`'s queue is the order overall; otherwise one claim at a time."""
    if more <= 0:
        return []
    queue = first.queue
    alone = (
        list(where.queues) == [queue]
        if where.queues is not None
        else not conn.execute(sql.OTHER_QUEUE_WAITING, {"queue": queue}).fetchone()[0]
    )
    if alone:
        rows = conn.execute(sql.CLAIM_MORE_IN_QUEUE, {**params, "queue": queue, "claims": more}).fetchall()
        return sorted(map(JobRow._make, rows), key=claim_order)  # RETURNING comes in no order
    taken: list[JobRow] = []
    while len(taken) < more and (row := _claim(conn, where, params)) is not None:
        taken.append(row)
    return taken


def _tx(conn: sqlite3.Connection) -> Tx:
    """The transaction open on this connection, as the shared verbs and cascade use it."""
    return Tx(lambda statement, params: conn.execute(statement, _bind(params)).fetchall(), sql.SQL, conn)


@functools.lru_cache(maxsize=64)
def _filter_params(where: Filter) -> dict[str, Any]:
    """A filter as the statements' JSON parameters (the same filter comes with every claim)."""
    return {"queues": _ids(where.queues), "tasks": _ids(where.tasks), "signed": _ids(where.signed)}


def _insert_row(j: NewJob, now: int) -> tuple[Any, ...]:
    """The values of sql.INSERT, in its order (statements.NEW_COLUMNS, then the times)."""
    run_at = now + j.delay_us if j.run_at_us is None else j.run_at_us
    return (*_new_values(j), run_at, now, now)


def _edit_check(conn: sqlite3.Connection, old: str, new: str) -> None:
    """Edit the CHECK on status (`old` text to `new`: version 12 allows the state `waiting`,
    version 15 compares instead of listing) without rebuilding the table: SQLite's documented
    way to change a constraint that every row meets (https://sqlite.org/lang_altertable.html,
    "otheralter") edits the table's stored definition and bumps the schema cookie, so every
    connection, this one too, reads it again. No row changes, so a queue of millions migrates
    at once; the transaction around it keeps a crash from leaving half of it."""
    cookie = int(conn.execute("PRAGMA schema_version").fetchone()[0])
    conn.execute("PRAGMA writable_schema = ON")
    try:
        conn.execute(
            "UPDATE sqlite_master SET sql = replace(sql, :old, :new) "
            "WHERE type = 'table' AND name = 'nbqueue_jobs' AND instr(sql, :new) = 0",
            {"old": old, "new": new},
        )
        conn.execute(f"PRAGMA schema_version = {int(cookie + 1)}")
    finally:
        conn.execute("PRAGMA writable_schema = OFF")


def _split_sql(script: str) -> list[str]:
    """Statements of a migration script; trigger bodies keep their inner semicolons."""
    statements, current = [], ""
    for line in script.strip().splitlines():
        current += line + "\n"
        if sqlite3.complete_statement(current):
            statements.append(current.strip())
            current = ""
    return statements
