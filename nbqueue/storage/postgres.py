"""PostgreSQL storage: workers on many machines, claims with FOR UPDATE SKIP LOCKED.

The queue verbs are `storage.sql`'s, over the statements in `postgres_queries`;
this module keeps what only PostgreSQL does: connections (one per thread,
`search_path` set to the queue's schema), reconnects and lost replies, claims
with SKIP LOCKED, migrations under an advisory lock, LISTEN/NOTIFY wake-ups, and
turning psycopg's errors into nbqueue's. The only module that imports psycopg.

Time comes from the server (`now()`) unless the Queue was given its own clock,
so clock skew between worker machines cannot break leases.
"""

from __future__ import annotations

import contextlib
import hashlib
import secrets
import threading
import time
import weakref
from collections.abc import Callable, Collection, Sequence
from typing import Any, NamedTuple, TypeVar
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from ..errors import (
    DatabaseFull,
    InvalidArgument,
    InvalidTransition,
    MissingDependency,
    NbqueueError,
    NotAQueueDatabase,
    ReadOnlyDatabase,
    SchemaTooNew,
    StorageError,
)
from ..jobs import JobRow, State
from ..records import Suspension
from . import ClaimRequest, Completion, Decide, Filter, Inserted, NewJob, Row, cascade, claim_order
from . import postgres_queries as sql
from .sql import SqlStorage
from .statements import Params, Tx

try:
    import psycopg
    from psycopg import errors as pg_errors
    from psycopg import sql as pg_sql
    from psycopg.pq import TransactionStatus
except ImportError:  # pragma: no cover - exercised only without the extra
    raise MissingDependency("PostgreSQL queues need psycopg 3: pip install 'nbqueue[postgres]'") from None

T = TypeVar("T")
Waits = Sequence[Suspension]  # runs that now wait, written with a worker's batch
TIDY_EVERY = 5.0  # seconds between folds of the count changes by a reader
# PostgreSQL cuts an identifier to 63 bytes (of UTF-8), silently: two longer schema names that
# share their first 63 bytes would open one schema, so names are counted in bytes and refused beyond.
SCHEMA_BYTES = 63
LOCKED_RETRY_SECONDS = 120.0  # a statement cancelled by a timeout (a lock held elsewhere) is retried
# ... by a worker's threads; the kernel's thread (the process's main thread: a notebook's cells,
# its board, its buttons) gives up after this many seconds (`?lock_wait=SECONDS` in the URL), and
# so does opening the queue: a session that holds a lock for good must not hang the notebook.
LOCK_WAIT_SECONDS = 5.0
# A connection left idle this long is closed; until then the next statement of any thread of the
# queue takes it (a new backend costs the server more than most statements: ~5 ms of its CPU).
IDLE_SECONDS = 60.0


def _split_url(url: str) -> tuple[str, str]:
    """The connection URL without nbqueue's own `schema=` parameter, and the schema."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    schema = next((v for k, v in query if k == "schema"), "public")
    rest = [(k, v) for k, v in query if k != "schema"]
    try:
        size = len(schema.encode("utf-8"))
    except UnicodeEncodeError:  # a lone surrogate: no name PostgreSQL could hold
        size = 0
    if not 0 < size <= SCHEMA_BYTES or "\x00" in schema:
        raise InvalidArgument(
            f"schema must be a name of 1 to {SCHEMA_BYTES} bytes in UTF-8 (PostgreSQL cuts longer "
            f"names short), not {schema!r}"
        )
    return urlunsplit(parts._replace(query=urlencode(rest))), schema


def _lock_wait(url: str) -> tuple[str, float]:
    """The URL without nbqueue's own `lock_wait=` parameter, and how long the kernel's thread
    waits for a lock held elsewhere (seconds)."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    given = next((v for k, v in query if k == "lock_wait"), None)
    try:
        seconds = LOCK_WAIT_SECONDS if given is None else float(given)
    except ValueError:
        seconds = -1.0
    if not 0 < seconds <= 3600:  # also NaN
        raise InvalidArgument(f"lock_wait must be a number of seconds above 0 and up to 3600, not {given!r}")
    rest = [(k, v) for k, v in query if k != "lock_wait"]
    return urlunsplit(parts._replace(query=urlencode(rest))), seconds


def _kernel_thread() -> bool:
    """Is this the process's main thread (a notebook kernel's, where cells, boards and buttons run)?"""
    return threading.current_thread() is threading.main_thread()


def _translate(exc: Exception, where: str) -> NbqueueError:
    if isinstance(exc, pg_errors.UniqueViolation) and "nbqueue_key" in str(exc):
        return InvalidTransition("another unfinished job already holds that key")
    if isinstance(exc, pg_errors.DiskFull | pg_errors.ProgramLimitExceeded):
        return DatabaseFull(f"{where}: the database is full; nothing was written ({exc})")
    if isinstance(exc, pg_errors.InsufficientPrivilege | pg_errors.ReadOnlySqlTransaction):
        return ReadOnlyDatabase(f"{where}: the queue cannot be written ({exc})")
    return StorageError(f"{where}: {exc}".strip())


def _insert_params(jobs: Sequence[NewJob]) -> Params:
    """New jobs as the column arrays sql.INSERT unnests."""
    return {name: [getattr(j, name) for j in jobs] for name in sql.NEW_FIELDS}


def _filter_params(where: Filter) -> Params:
    return {
        name: None if value is None else list(value)
        for name, value in (("queues", where.queues), ("tasks", where.tasks), ("signed", where.signed))
    }


def _each(done: Sequence[Completion], now: int | None) -> Params:
    """A batch of successes as the arrays the statements unnest."""
    return {
        "ids": [d.job_id for d in done],
        "attempts": [d.attempt for d in done],
        "results": [d.result for d in done],
        "outputs": [_clean(d.output) for d in done],
        "now": now,
    }


def _token() -> int:
    """A client's token for one write, read back if its reply is lost."""
    return secrets.randbits(62)


def _clean(text: str | None) -> str | None:
    """PostgreSQL text cannot hold NUL; error text and output may."""
    return None if text is None else text.replace("\x00", "\\0")


def _close_all(
    pool: list[psycopg.Connection[Any]], listeners: list[psycopg.Connection[Any]], lock: threading.Lock
) -> None:
    """Close a collected storage's connections (close() was never called)."""
    with lock:
        for conn in [*pool, *listeners]:
            with contextlib.suppress(psycopg.Error):
                conn.close()
        pool.clear()
        listeners.clear()


class _Idle(NamedTuple):
    """A connection no thread is using, kept for the next statement of any thread."""

    conn: psycopg.Connection[Any]
    kernel: bool  # set up for the kernel's thread (its lock_timeout)
    since: float  # time.monotonic() when it was given back


class PostgresStorage(SqlStorage):
    """Jobs in PostgreSQL tables (in `?schema=NAME`, default public), on a few connections its threads share.

    `?lock_wait=SECONDS` (default 5): how long a call from the process's main thread (a notebook's
    cells, board and buttons) and opening the queue wait for a lock another session holds, before
    a StorageError; a worker's threads wait a lock out (LOCKED_RETRY_SECONDS)."""

    checkpoint_sql = sql.CHECKPOINT_SQL
    sql = sql.SQL
    server_clock = True

    def __init__(self, url: str, *, synchronous: str = "normal") -> None:
        if synchronous not in ("normal", "full"):
            raise InvalidArgument(f"synchronous must be 'normal' or 'full', not {synchronous!r}")
        self.synchronous = synchronous
        url, self.lock_wait = _lock_wait(url)
        self.conninfo, self.schema = _split_url(url)
        self.identity_suffix = f"/{self.schema}"  # a row copied into another schema never verifies
        parts = urlsplit(url)  # for messages: never show a password
        self._where = f"{parts.scheme}://{parts.hostname or ''}{parts.path}"
        self._local = threading.local()  # the connection a thread's statement is using, and depth
        self._all: list[psycopg.Connection[Any]] = []  # every open connection but the listener's
        self._idle: list[_Idle] = []
        self._all_lock = threading.Lock()  # guards _all and _idle
        self._closed = False
        self._signal = threading.Condition()
        self._listener: psycopg.Connection[Any] | None = None
        self._listeners: list[psycopg.Connection[Any]] = []  # the listener, for the finalizer
        # A queue dropped without close() (a notebook cell run again) closes its connections
        # when it is collected, instead of leaving them to psycopg's warning.
        weakref.finalize(self, _close_all, self._all, self._listeners, self._all_lock)
        self._listen_lock = threading.Lock()
        self.channel = ""
        self._tidied = float("-inf")
        # Name the connections (unless the URL does), so a DBA can tell whose they are.
        given = psycopg.conninfo.conninfo_to_dict(self.conninfo)
        self._options = str(given.get("options") or "")
        self._name = (
            {} if "application_name" in given else {"application_name": f"nbqueue:{self.schema}"[:63]}
        )
        try:
            self._migrate()
        except BaseException:  # refused (a newer schema, a lock held for good): nothing left open
            self.close()
            raise

    # -- connections -----------------------------------------------------------

    def _connect(self, autocommit: bool = False, kernel: bool = False) -> psycopg.Connection[Any]:
        # "normal" keeps the server's own synchronous_commit (on, unless a DBA chose otherwise): an
        # acknowledged job survives a crash of the server too. "full" asks for it in any case.
        settings = dict(self._name)
        if self.synchronous == "full":  # added to the URL's own options, if it has some
            settings["options"] = f"{self._options} -c synchronous_commit=on".strip()
        conn: psycopg.Connection[Any] | None = None
        try:
            conn = psycopg.connect(
                self.conninfo,
                autocommit=True,
                connect_timeout=10,
                **settings,  # type: ignore[arg-type]  # psycopg passes other keywords to libpq
            )
            # Every statement names its tables without a schema: the schema is the path. No JIT:
            # the recursive claim statements are estimated dear, and compiling them took 47 ms
            # of each 48 ms limited claim, on a table of 60 jobs.
            conn.execute(
                pg_sql.SQL("SET search_path TO {}; SET jit = off").format(pg_sql.Identifier(self.schema))
            )
            if kernel:  # a new connection is as a worker's thread needs it otherwise
                self._set_up_for(conn, kernel)
            conn.autocommit = autocommit
            return conn
        except psycopg.Error as exc:
            if conn is not None:  # cut while it was being set up: closed, not left to the collector
                conn.close()
            raise StorageError(f"cannot connect to {self._where}: {exc}") from exc

    def _set_up_for(self, conn: psycopg.Connection[Any], kernel: bool) -> None:
        """On the kernel's thread a lock held elsewhere fails the statement after lock_wait;
        a worker's threads wait it out (_run retries)."""
        if kernel:
            conn.execute(pg_sql.SQL("SET lock_timeout = {}").format(f"{round(self.lock_wait * 1000)}ms"))
        else:
            conn.execute("RESET lock_timeout")

    def _conn(self) -> psycopg.Connection[Any]:
        """The connection this thread's statement uses: an idle one of the queue (preferably
        one set up for this kind of thread), else a new one."""
        conn: psycopg.Connection[Any] | None = getattr(self._local, "conn", None)
        if conn is not None and not (conn.closed or conn.broken):
            return conn
        if conn is not None:  # the server went away: the idle ones are likely cut too
            self._local.conn = None
            self._forget(conn, *self._take_idle())
        if self._closed:
            raise StorageError(f"{self._where}: the queue is closed")
        kernel = _kernel_thread()
        with self._all_lock:
            idle = next((i for i in reversed(self._idle) if i.kernel == kernel), None)
            idle = idle or (self._idle[-1] if self._idle else None)
            if idle is not None:
                self._idle.remove(idle)
        conn = None if idle is None else idle.conn
        if idle is not None and idle.kernel != kernel:
            try:
                self._set_up_for(idle.conn, kernel)
            except psycopg.Error:  # cut while idle: a new one instead
                self._forget(idle.conn, *self._take_idle())
                conn = None
        if conn is None:
            conn = self._connect(autocommit=True, kernel=kernel)  # each verb is one statement: one round trip
            with self._all_lock:
                closed = self._closed  # closed while it connected: close() has not seen it
                if not closed:
                    self._all.append(conn)
            if closed:
                conn.close()
                raise StorageError(f"{self._where}: the queue is closed")
        self._local.conn = conn
        return conn

    def _take_idle(self) -> list[psycopg.Connection[Any]]:
        with self._all_lock:
            taken = [i.conn for i in self._idle]
            self._idle.clear()
        return taken

    def _give_back(self) -> None:
        """The thread's statement is over: its connection waits for the next one (of any thread),
        unless it is unusable; connections idle for IDLE_SECONDS are closed."""
        conn: psycopg.Connection[Any] | None = getattr(self._local, "conn", None)
        self._local.conn = None
        if conn is None:
            return
        reusable = not (conn.closed or conn.broken) and conn.info.transaction_status == TransactionStatus.IDLE
        stale: list[psycopg.Connection[Any]] = []
        with self._all_lock:
            now = time.monotonic()  # under the lock: _idle stays in the order of `since`
            keep = reusable and not self._closed
            while self._idle and now - self._idle[0].since > IDLE_SECONDS:  # oldest first
                stale.append(self._idle.pop(0).conn)
            if keep:
                self._idle.append(_Idle(conn, _kernel_thread(), now))
        if stale or not keep:
            self._forget(*stale, *([] if keep else [conn]))

    def _forget(self, *conns: psycopg.Connection[Any]) -> None:
        """Close connections for good."""
        for conn in conns:
            with self._all_lock:
                if conn in self._all:
                    self._all.remove(conn)
            with contextlib.suppress(psycopg.Error):
                conn.close()

    def _run(
        self,
        work: Callable[[psycopg.Cursor[Any]], T],
        transaction: bool = False,
        committed: Callable[[], T | None] | None = None,
    ) -> T:
        """Run `work` (atomic: one statement, or a transaction); a dropped connection is re-made.
        A write may commit with only its reply lost: `committed` then reads back whether it did
        (its answer, or None), so it is never done twice; else `work` must be safe to repeat."""
        depth = getattr(self._local, "depth", 0)
        self._local.depth = depth + 1  # a `committed` read-back runs inside: one connection
        try:
            return self._attempt(work, transaction, committed)
        finally:
            self._local.depth = depth
            if depth == 0:
                self._give_back()

    def _attempt(
        self,
        work: Callable[[psycopg.Cursor[Any]], T],
        transaction: bool,
        committed: Callable[[], T | None] | None,
    ) -> T:
        patience = self.lock_wait if _kernel_thread() else LOCKED_RETRY_SECONDS
        deadline = time.monotonic() + patience
        attempt = 0
        while attempt < 4:
            conn = self._conn()
            try:
                if transaction:
                    with conn.transaction(), conn.cursor() as cur:
                        return work(cur)
                with conn.cursor() as cur:
                    return work(cur)
            except (pg_errors.QueryCanceled, pg_errors.LockNotAvailable) as exc:
                # A statement_timeout or lock_timeout (a lock held elsewhere): the statement was
                # rolled back, so it is waited out like SQLite's busy lock, never surfaced early.
                if time.monotonic() > deadline:
                    raise StorageError(
                        f"{self._where}: gave up after waiting {patience:g} s for a lock another session "
                        f"holds on the queue's tables (lock_wait; nothing was written): {exc}".strip()
                    ) from exc
                time.sleep(0.05)
                continue
            except (pg_errors.DeadlockDetected, pg_errors.SerializationFailure):
                time.sleep(0.01 * (attempt + 1))
            except psycopg.OperationalError as exc:
                if not (conn.closed or conn.broken) or attempt == 3:
                    raise _translate(exc, self._where) from exc
                time.sleep(0.05 * attempt)  # the server went away: connect again
                if committed is not None and (answer := committed()) is not None:
                    return answer
            except psycopg.Error as exc:
                raise _translate(exc, self._where) from exc
            attempt += 1
        raise StorageError(f"{self._where}: gave up after repeated conflicts")

    def _rows(
        self, statement: str, params: Params | None = None, lost: str | None = None
    ) -> list[tuple[Any, ...]]:
        """One statement's rows. `lost` reads back, with the same parameters, whether the write
        committed (its first value true) when the reply was lost; its rows are then the answer."""

        def work(cur: psycopg.Cursor[Any]) -> list[tuple[Any, ...]]:
            cur.execute(statement, params or {})  # type: ignore[arg-type]  # fixed text, never user input
            return cur.fetchall() if cur.description else []

        def committed() -> list[tuple[Any, ...]] | None:
            assert lost is not None
            rows = self._rows(lost, params)
            return rows if rows and rows[0][0] else None

        return self._run(work, committed=None if lost is None else committed)

    def _one(
        self, statement: str, params: Params | None = None, lost: str | None = None
    ) -> tuple[Any, ...] | None:
        rows = self._rows(statement, params, lost)
        return rows[0] if rows else None

    def _bind(self, params: Params) -> Params:
        """A statement's parameters, with the channel that a job it makes due wakes (on commit)."""
        return {"channel": self.channel, "wake": True, **params}

    def _read(self, statement: str, params: Params | None = None) -> list[Row]:
        return self._rows(statement, self._bind(params or {}))

    def _change(self, statement: str, params: Params, lost: str | None = None) -> list[Row]:
        return self._rows(statement, self._bind(params), lost)

    def _transaction(self, work: Callable[[Tx], T], committed: Callable[[], T | None] | None = None) -> T:
        return self._run(lambda cur: work(self._tx(cur)), transaction=True, committed=committed)

    def _tx(self, cur: psycopg.Cursor[Any]) -> Tx:
        def run(statement: str, params: Params) -> list[Row]:
            cur.execute(statement, self._bind(params))  # type: ignore[arg-type]  # fixed text
            return cur.fetchall() if cur.description else []

        return Tx(run, sql.SQL, cur)

    def _filter(self, where: Filter) -> Params:
        return _filter_params(where)

    def _token(self) -> int | None:
        return _token()

    def _text(self, text: str | None) -> str | None:
        return _clean(text)

    def _insert_in(self, tx: Tx, job: NewJob, now: int | None) -> None:
        tx(sql.INSERT, {**_insert_params([job]), "now": now, "token": _token()})

    # -- schema ----------------------------------------------------------------

    def _migrate(self) -> None:
        schema = pg_sql.Identifier(self.schema)

        def ddl(text: str) -> pg_sql.Composed:
            return pg_sql.SQL(text).format(s=schema)

        def work(cur: psycopg.Cursor[Any]) -> None:
            # One migrator at a time, across every machine; a session that holds the lock (or a
            # table) for good fails the open after lock_wait, on any thread.
            cur.execute(pg_sql.SQL("SET LOCAL lock_timeout = {}").format(f"{round(self.lock_wait * 1000)}ms"))
            try:
                cur.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (f"nbqueue:{self.schema}",))
            except pg_errors.LockNotAvailable as exc:
                raise StorageError(
                    f"{self._where}: another session has held the advisory lock "
                    f"hashtext('nbqueue:{self.schema}') for over {self.lock_wait:g} s (lock_wait); "
                    "nbqueue takes it to migrate the schema: end that session (pg_stat_activity, "
                    "pg_locks) and open the queue again"
                ) from exc
            cur.execute(ddl("CREATE SCHEMA IF NOT EXISTS {s}"))
            cur.execute(ddl("CREATE TABLE IF NOT EXISTS {s}.nbqueue_meta (version INTEGER NOT NULL)"))
            cur.execute(ddl("SELECT version FROM {s}.nbqueue_meta"))
            row = cur.fetchone()
            version = 0 if row is None else int(row[0])
            if version > sql.SCHEMA_VERSION:
                raise SchemaTooNew(
                    f"{self._where} schema {self.schema!r} has nbqueue schema version {version}, newer "
                    f"than this nbqueue understands ({sql.SCHEMA_VERSION}); upgrade nbqueue"
                )
            if version == 0:
                cur.execute("SELECT to_regclass(%s)", (f"{schema.as_string(cur)}.nbqueue_jobs",))
                found = cur.fetchone()
                if found is not None and found[0] is not None:
                    raise NotAQueueDatabase(f"{self.schema}.nbqueue_jobs exists but is not nbqueue's")
            for target in sorted(v for v in sql.MIGRATIONS if v > version):
                for statement in sql.MIGRATIONS[target]:
                    cur.execute(ddl(statement))
            if version == 0:
                cur.execute(ddl("INSERT INTO {s}.nbqueue_meta VALUES (%s)"), (sql.SCHEMA_VERSION,))
            elif version < sql.SCHEMA_VERSION:
                cur.execute(ddl("UPDATE {s}.nbqueue_meta SET version = %s"), (sql.SCHEMA_VERSION,))
            # The wake-up channel is named after the database and schema, never the URL's text,
            # so processes that spell the same queue differently still hear each other.
            cur.execute("SELECT current_database()")
            database = cur.fetchone()[0]  # type: ignore[index]
            digest = hashlib.sha1(f"{database}|{self.schema}".encode()).hexdigest()[:16]
            self.channel = f"nbqueue_{digest}"

        self._run(work, transaction=True)

    # -- writing ---------------------------------------------------------------

    def insert(self, jobs: Sequence[NewJob]) -> list[Inserted]:
        if len(jobs) > 1 and any(j.key is not None for j in jobs):
            return [pair for job in jobs for pair in self.insert([job])]  # each key answers for itself
        now = self.stamp()
        params = {**_insert_params(jobs), "now": now, "channel": self.channel}
        for _ in range(10):  # a held key's job may finish meanwhile: then insert again
            params["token"] = _token()
            created = self._rows(sql.INSERT, params, lost=sql.SQL.INSERTED)
            if len(created) == len(jobs):
                self.notify()
                return [(int(i), True, int(stamp)) for i, stamp in created]
            if all(j.key is None for j in jobs):
                raise StorageError(f"{self._where}: {len(jobs) - len(created)} jobs were not written")
            held = self._one(sql.SQL.HELD_KEY, {"key": jobs[0].key})
            if held is not None:
                return [(int(held[0]), False, None)]
        raise StorageError(f"{self._where}: the key kept changing hands")

    def _complete(self, done: Completion, now: int | None) -> bool:
        """One success: one statement, or a transaction if the job has children."""
        params: Params = {
            "id": done.job_id,
            "attempt": done.attempt,
            "result": done.result,
            "output": _clean(done.output),
            "now": now,
        }
        row = self._one(sql.COMPLETE, params, lost=sql.COMPLETED)
        if row and row[0]:
            return True
        return self._finish_linked(sql.COMPLETE_LINKED, params, State.COMPLETED, sql.COMPLETED)

    def finish_batch(
        self,
        done: Sequence[Completion],
        then_claim: ClaimRequest | None,
        claims: int,
        suspended: Waits = (),
        decide: Decide | None = None,
        peek: Collection[str] = (),
    ) -> tuple[list[bool], list[JobRow], int | None, list[Row] | None]:
        written = self.suspend(suspended)  # the runs that now wait: a transaction of their own
        flags, taken, now = self._finish_batch(done, None if decide else then_claim, claims)
        if decide is not None and then_claim is not None:  # under limits: a transaction of their own
            taken = self.claim_limited(then_claim, decide, claims)
        return flags + written, taken, now, None  # (peek: a read here would be a round trip too)

    def _finish_batch(
        self, done: Sequence[Completion], then_claim: ClaimRequest | None, claims: int
    ) -> tuple[list[bool], list[JobRow], int | None]:
        now = self.stamp()
        if then_claim is not None and then_claim.where.matches_nothing:
            then_claim = None
        if then_claim is None or not claims:
            if len(done) == 1:  # q.complete: one statement
                return [self._complete(done[0], now)], [], now
            return self._complete_many(done, _each(done, now)), [], now
        each = _each(done, now)
        # A batch in one statement: the successes of jobs without children and the next
        # claims, all under one token, so a lost reply reads back what it took and completed.
        params = {**each, **self._claim_params(then_claim), "claims": claims}
        statement = sql.COMPLETE_MANY_THEN_CLAIM_FROM_QUEUES
        if then_claim.where.queues is None:
            statement = sql.COMPLETE_MANY_THEN_CLAIM_FROM_ANY_QUEUE

        def work(cur: psycopg.Cursor[Any]) -> tuple[set[int], list[JobRow]]:
            cur.execute(statement, params)  # type: ignore[arg-type]
            rows = cur.fetchall()
            taken = [JobRow._make(row[1:]) for row in rows if row[1] is not None]
            return {int(i) for i in rows[0][0]}, sorted(taken, key=claim_order)

        def committed() -> tuple[set[int], list[JobRow]] | None:
            taken = sorted(map(JobRow._make, self._rows(sql.SQL.CLAIMED, params)), key=claim_order)
            finished = {int(r[0]) for r in self._rows(sql.COMPLETED_MANY, each)} if done else set()
            return (finished, taken) if taken or finished else None  # neither: it did not commit

        completed, taken = self._run(work, committed=committed)
        rest = [d for d in done if d.job_id not in completed]  # parents (or lost claims)
        flags = dict(zip([d.job_id for d in rest], self._complete_many(rest, _each(rest, now)), strict=True))
        return [d.job_id in completed or flags.get(d.job_id, False) for d in done], taken, now

    def _complete_many(self, done: Sequence[Completion], each: Params) -> list[bool]:
        """Successes in one transaction that also settles the children of those that have some."""
        if not done:
            return []

        def work(cur: psycopg.Cursor[Any]) -> list[bool]:
            cur.execute(sql.COMPLETE_MANY, each)
            rows = cur.fetchall()
            parents = [(int(r[0]), State.COMPLETED, None) for r in rows if r[1]]
            if parents:  # their children learn of it in the same transaction
                cascade.resolve(self._tx(cur), parents, each["now"])
            finished = {int(r[0]) for r in rows}
            return [d.job_id in finished for d in done]

        def committed() -> list[bool] | None:
            finished = {int(r[0]) for r in self._rows(sql.COMPLETED_MANY, each)}
            return [d.job_id in finished for d in done] if finished else None

        return self._run(work, transaction=True, committed=committed)

    def _finish_linked(self, statement: str, params: Params, state: State, lost: str) -> bool:
        """Finish a job in a transaction that also resolves its children (storage/cascade.py).
        The statement returns a row ending in has_children, or none if the lease was lost."""

        def work(cur: psycopg.Cursor[Any]) -> bool:
            cur.execute(statement, params)  # type: ignore[arg-type]
            row = cur.fetchone()
            if row is None:
                return False
            if row[-1] and state is not State.FAILED:
                cascade.resolve(self._tx(cur), [(int(params["id"]), state, None)], params.get("now"))
            return True

        def committed() -> bool | None:
            return True if self._one(lost, params) else None

        return self._run(work, transaction=True, committed=committed)

    def _deleted(self, statement: str, params: Params) -> int:
        return int(row[0]) if (row := self._one(statement, self._bind(params))) else 0

    def tidy(self) -> None:
        """Fold the appended count changes into the counts (workers call this now and then)."""
        self._one(sql.TIDY)

    # -- reading ---------------------------------------------------------------

    def counts(self, queue: str | None = None) -> dict[str, int]:
        self._tidy_now_and_then()
        return super().counts(queue)

    def _tidy_now_and_then(self) -> None:
        """Readers fold the count changes too (every few seconds), so that a queue with no
        worker keeps its counts cheap to read; a read-only session simply leaves it."""
        now = time.monotonic()
        if now - self._tidied < TIDY_EVERY:
            return
        self._tidied = now
        with contextlib.suppress(NbqueueError):
            self.tidy()

    def now(self) -> int | None:
        row = self._one(sql.SERVER_TIME)
        assert row is not None
        return int(row[0])

    # -- waiting ---------------------------------------------------------------

    def wait_for_change(self, timeout: float) -> None:
        # One thread listens for NOTIFY; the others wait to be woken by it.
        if self._listen_lock.acquire(blocking=False):
            try:
                listener = self._listening()
                for _ in listener.notifies(timeout=timeout, stop_after=1):
                    self.notify()
            except (psycopg.Error, NbqueueError):  # the server is away: wait a little, listen anew later
                self._drop_listener()
                time.sleep(min(timeout, 0.1))
            finally:
                self._listen_lock.release()
            return
        with self._signal:
            self._signal.wait(timeout)

    def _listening(self) -> psycopg.Connection[Any]:
        if self._listener is None or self._listener.closed or self._listener.broken:
            self._drop_listener()
            if self._closed:  # close() has dropped it: no new one it would never see
                raise StorageError(f"{self._where}: the queue is closed")
            conn = self._connect(autocommit=True)
            try:
                conn.execute(pg_sql.SQL("LISTEN {}").format(pg_sql.Identifier(self.channel)))
            except psycopg.Error:
                conn.close()
                raise
            self._listener = conn
            self._listeners[:] = [conn]
        return self._listener

    def _drop_listener(self) -> None:
        if self._listener is not None:
            with contextlib.suppress(psycopg.Error):
                self._listener.close()
        self._listener = None
        self._listeners.clear()

    def notify(self) -> None:
        with self._signal:
            self._signal.notify_all()

    def wake(self) -> None:
        self.notify()
        if self._listen_lock.locked():  # a thread waits on the server: a NOTIFY ends its wait
            with contextlib.suppress(NbqueueError):  # the server is gone: its wait ends anyway
                self._one(sql.SQL.WAKE, self._bind({}))

    def close(self) -> None:
        self._closed = True
        with self._all_lock:
            for conn in self._all:
                # psycopg holds conn.lock while a statement runs; closing under it waits for
                # the statement, rather than freeing the connection beneath another thread.
                with conn.lock, contextlib.suppress(psycopg.Error):
                    conn.close()
            self._all.clear()
            self._idle.clear()
        with self._listen_lock:
            self._drop_listener()
        self._local = threading.local()
