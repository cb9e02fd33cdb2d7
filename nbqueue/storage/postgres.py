"""PostgreSQL storage: workers on many machines, claims with FOR UPDATE SKIP LOCKED.

Time comes from the server (`now()`) unless the Queue was given its own clock,
so clock skew between worker machines cannot break leases. Idle workers wake on
LISTEN/NOTIFY, with the caller's short poll as the safety net. The only module
that imports psycopg.
"""

from __future__ import annotations

import contextlib
import hashlib
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar
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
from ..jobs import Job, State
from . import COLUMNS, ClaimRequest, Filter, NewJob, row_to_job

try:
    import psycopg
    from psycopg import errors as pg_errors
    from psycopg import sql
except ImportError:  # pragma: no cover - exercised only without the extra
    raise MissingDependency("PostgreSQL queues need psycopg 3: pip install 'nbqueue[postgres]'") from None

SCHEMA_VERSION = 1
T = TypeVar("T")
_STATES = ", ".join(f"'{s.value}'" for s in State)
_CLAIMABLE = "status IN ('pending', 'failed')"
_UNFINISHED = "status IN ('pending', 'failed', 'running')"
_NOW_US = "(extract(epoch from now()) * 1000000)::bigint"

MIGRATIONS: dict[int, list[str]] = {
    1: [
        f"""CREATE TABLE {{s}}.nbqueue_jobs (
            id BIGSERIAL PRIMARY KEY,
            status TEXT NOT NULL CHECK (status IN ({_STATES})),
            queue TEXT NOT NULL,
            task TEXT,
            payload TEXT NOT NULL,
            priority BIGINT NOT NULL DEFAULT 0,
            key TEXT,
            retries INTEGER NOT NULL DEFAULT 0,
            max_retries INTEGER NOT NULL,
            attempts INTEGER NOT NULL DEFAULT 0,
            error TEXT,
            run_at BIGINT NOT NULL,
            created_at BIGINT NOT NULL,
            updated_at BIGINT NOT NULL,
            started_at BIGINT,
            finished_at BIGINT,
            lease_until BIGINT,
            lease_us BIGINT,
            worker_id TEXT,
            timeout DOUBLE PRECISION,
            output TEXT,
            backoff TEXT,
            result TEXT
        )""",
        f"CREATE INDEX nbqueue_claim_queue ON {{s}}.nbqueue_jobs (queue, priority DESC, run_at, id) "
        f"WHERE {_CLAIMABLE}",
        f"CREATE INDEX nbqueue_claim_any ON {{s}}.nbqueue_jobs (priority DESC, run_at, id) "
        f"WHERE {_CLAIMABLE}",
        f"CREATE INDEX nbqueue_due ON {{s}}.nbqueue_jobs (run_at) WHERE {_CLAIMABLE}",
        f"CREATE UNIQUE INDEX nbqueue_key ON {{s}}.nbqueue_jobs (key) "
        f"WHERE key IS NOT NULL AND {_UNFINISHED}",
        "CREATE INDEX nbqueue_lease ON {s}.nbqueue_jobs (lease_until) WHERE status = 'running'",
        "CREATE INDEX nbqueue_status ON {s}.nbqueue_jobs (status, queue, id)",
    ],
}


def _split_url(url: str) -> tuple[str, str]:
    """The connection URL without nbqueue's own `schema=` parameter, and the schema."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    schema = next((v for k, v in query if k == "schema"), "public")
    rest = [(k, v) for k, v in query if k != "schema"]
    if not schema or len(schema) > 60:
        raise InvalidArgument(f"schema must be a name of 1 to 60 characters, not {schema!r}")
    return urlunsplit(parts._replace(query=urlencode(rest))), schema


def _translate(exc: Exception, where: str) -> NbqueueError:
    if isinstance(exc, pg_errors.UniqueViolation) and "nbqueue_key" in str(exc):
        return InvalidTransition("another unfinished job already holds that key")
    if isinstance(exc, pg_errors.DiskFull | pg_errors.ProgramLimitExceeded):
        return DatabaseFull(f"{where}: the database is full; nothing was written ({exc})")
    if isinstance(exc, pg_errors.InsufficientPrivilege | pg_errors.ReadOnlySqlTransaction):
        return ReadOnlyDatabase(f"{where}: the queue cannot be written ({exc})")
    return StorageError(f"{where}: {exc}".strip())


def _clean(text: str | None) -> str | None:
    """PostgreSQL text cannot hold NUL; error text and output may."""
    return None if text is None else text.replace("\x00", "\\0")


class PostgresStorage:
    """Jobs in PostgreSQL tables (in `?schema=NAME`, default public); one connection per thread."""

    server_clock = True

    def __init__(self, url: str, *, synchronous: str = "normal") -> None:
        if synchronous not in ("normal", "full"):
            raise InvalidArgument(f"synchronous must be 'normal' or 'full', not {synchronous!r}")
        self.url = url
        self.conninfo, self.schema = _split_url(url)
        parts = urlsplit(url)  # for messages: never show a password
        self._where = f"{parts.scheme}://{parts.hostname or ''}{parts.path}"
        self._local = threading.local()
        self._all: list[psycopg.Connection[Any]] = []
        self._all_lock = threading.Lock()
        self._closed = False
        self._signal = threading.Condition()
        self._listener: psycopg.Connection[Any] | None = None
        self._listen_lock = threading.Lock()
        digest = hashlib.sha1(f"{self.conninfo}|{self.schema}".encode()).hexdigest()[:16]
        self.channel = f"nbqueue_{digest}"
        self.table = sql.SQL("{}.nbqueue_jobs").format(sql.Identifier(self.schema))
        self._migrate()

    # -- connections -----------------------------------------------------------

    def _connect(self, autocommit: bool = False) -> psycopg.Connection[Any]:
        try:
            return psycopg.connect(self.conninfo, autocommit=autocommit, connect_timeout=10)
        except psycopg.Error as exc:
            raise StorageError(f"cannot connect to {self._where}: {exc}") from exc

    def _conn(self) -> psycopg.Connection[Any]:
        conn: psycopg.Connection[Any] | None = getattr(self._local, "conn", None)
        if conn is None or conn.closed or conn.broken:
            if self._closed:
                raise StorageError(f"{self._where}: the queue is closed")
            conn = self._connect()
            self._local.conn = conn
            with self._all_lock:
                self._all.append(conn)
        return conn

    def _run(self, work: Callable[[psycopg.Cursor[Any]], T]) -> T:
        """Run `work` in one transaction; a dropped connection is re-made and tried again."""
        for attempt in range(4):
            conn = self._conn()
            try:
                with conn.transaction(), conn.cursor() as cur:
                    return work(cur)
            except (pg_errors.DeadlockDetected, pg_errors.SerializationFailure):
                time.sleep(0.01 * (attempt + 1))
            except psycopg.OperationalError as exc:
                if not (conn.closed or conn.broken) or attempt == 3:
                    raise _translate(exc, self._where) from exc
                time.sleep(0.05 * attempt)  # the server went away: connect again
            except psycopg.Error as exc:
                raise _translate(exc, self._where) from exc
        raise StorageError(f"{self._where}: gave up after repeated conflicts")

    def _q(self, text: str) -> sql.Composed:
        return sql.SQL(text).format(t=self.table, s=sql.Identifier(self.schema))

    # -- schema ----------------------------------------------------------------

    def _migrate(self) -> None:
        def work(cur: psycopg.Cursor[Any]) -> None:
            # One migrator at a time, across every machine.
            cur.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (f"nbqueue:{self.schema}",))
            cur.execute(self._q("CREATE SCHEMA IF NOT EXISTS {s}"))
            cur.execute(self._q("CREATE TABLE IF NOT EXISTS {s}.nbqueue_meta (version INTEGER NOT NULL)"))
            cur.execute(self._q("SELECT version FROM {s}.nbqueue_meta"))
            row = cur.fetchone()
            version = 0 if row is None else int(row[0])
            if version > SCHEMA_VERSION:
                raise SchemaTooNew(
                    f"{self._where} schema {self.schema!r} has nbqueue schema version {version}, newer "
                    f"than this nbqueue understands ({SCHEMA_VERSION}); upgrade nbqueue"
                )
            if version == 0:
                cur.execute(self._q("SELECT to_regclass(%s)"), (f"{self.schema}.nbqueue_jobs",))
                found = cur.fetchone()
                if found is not None and found[0] is not None:
                    raise NotAQueueDatabase(f"{self.schema}.nbqueue_jobs exists but is not nbqueue's")
            for target in sorted(v for v in MIGRATIONS if v > version):
                for statement in MIGRATIONS[target]:
                    cur.execute(self._q(statement))
            if version == 0:
                cur.execute(self._q("INSERT INTO {s}.nbqueue_meta VALUES (%s)"), (SCHEMA_VERSION,))
            elif version < SCHEMA_VERSION:
                cur.execute(self._q("UPDATE {s}.nbqueue_meta SET version = %s"), (SCHEMA_VERSION,))

        self._run(work)

    def _now(self, cur: psycopg.Cursor[Any], now: int | None) -> int:
        if now is not None:
            return now
        cur.execute(f"SELECT {_NOW_US}")
        row = cur.fetchone()
        assert row is not None
        return int(row[0])

    def _notify(self, cur: psycopg.Cursor[Any]) -> None:
        cur.execute("SELECT pg_notify(%s, '')", (self.channel,))

    # -- verbs -----------------------------------------------------------------

    def insert(self, jobs: Sequence[NewJob], now: int | None) -> list[tuple[int, bool]]:
        insert = self._q(
            "INSERT INTO {t} (status, queue, task, payload, priority, key, max_retries, run_at, "
            "created_at, updated_at, timeout, backoff) VALUES ('pending', %s, %s, %s, %s, %s, %s, %s, "
            f"%s, %s, %s, %s) ON CONFLICT (key) WHERE key IS NOT NULL AND {_UNFINISHED} DO NOTHING "
            "RETURNING id"
        )

        def row(j: NewJob, stamp: int) -> tuple[Any, ...]:
            run_at = stamp + j.delay_us if j.run_at_us is None else j.run_at_us
            return (
                j.queue,
                j.task,
                j.payload,
                j.priority,
                j.key,
                j.max_retries,
                run_at,
                stamp,
                stamp,
                j.timeout,
                j.backoff,
            )

        def work(cur: psycopg.Cursor[Any]) -> list[tuple[int, bool]]:
            stamp = self._now(cur, now)
            if len(jobs) > 1 and all(j.key is None for j in jobs):
                cur.executemany(insert, [row(j, stamp) for j in jobs], returning=True)
                ids = []
                while True:
                    got = cur.fetchone()
                    assert got is not None
                    ids.append((int(got[0]), True))
                    if not cur.nextset():
                        break
                self._notify(cur)
                return ids
            out = []
            for job in jobs:
                while True:
                    cur.execute(insert, row(job, stamp))
                    got = cur.fetchone()
                    if got is not None:
                        out.append((int(got[0]), True))
                        break
                    cur.execute(self._q(f"SELECT id FROM {{t}} WHERE key = %s AND {_UNFINISHED}"), (job.key,))
                    held = cur.fetchone()
                    if held is not None:  # else the holder finished meanwhile: insert again
                        out.append((int(held[0]), False))
                        break
            self._notify(cur)
            return out

        ids = self._run(work)
        self.notify()
        return ids

    def _claim_statement(self, request: ClaimRequest, now: int) -> tuple[sql.Composed, list[Any]]:
        where, worker_id, lease_us = request
        task_sql = "" if where.tasks is None else " AND task = ANY(%s)"
        task_params: list[Any] = [] if where.tasks is None else [list(where.tasks)]
        order = "ORDER BY priority DESC, run_at, id LIMIT 1"
        if where.queues is None or len(where.queues) == 1:
            queue_sql = "" if where.queues is None else " AND queue = %s"
            queue_params = [] if where.queues is None else [where.queues[0]]
            pick = (
                f"SELECT id FROM {{t}} WHERE {_CLAIMABLE}{queue_sql} AND run_at <= %s{task_sql} "
                f"{order} FOR UPDATE SKIP LOCKED"
            )
            params = [*queue_params, now, *task_params]
        else:  # one index seek per queue, then the best of those few candidates
            pick = (
                f"SELECT c.id FROM unnest(%s::text[]) AS q(name) CROSS JOIN LATERAL (SELECT id, "
                f"priority, run_at FROM {{t}} WHERE {_CLAIMABLE} AND queue = q.name AND run_at <= %s"
                f"{task_sql} {order} FOR UPDATE SKIP LOCKED) c ORDER BY c.priority DESC, c.run_at, "
                "c.id LIMIT 1"
            )
            params = [list(where.queues), now, *task_params]
        statement = self._q(
            "UPDATE {t} SET status = 'running', attempts = attempts + 1, worker_id = %s, "
            "lease_until = %s, lease_us = %s, started_at = %s, updated_at = %s "
            f"WHERE id = ({pick}) RETURNING {COLUMNS}"
        )
        return statement, [worker_id, now + lease_us, lease_us, now, now, *params]

    def claim(self, where: Filter, worker_id: str, lease_us: int, now: int | None) -> Job | None:
        if where.tasks == () or where.queues == ():
            return None

        def work(cur: psycopg.Cursor[Any]) -> Job | None:
            cur.execute(*self._claim_statement(ClaimRequest(where, worker_id, lease_us), self._now(cur, now)))
            row = cur.fetchone()
            return None if row is None else row_to_job(row)

        return self._run(work)

    def heartbeat(self, job_id: int, attempt: int, lease_us: int | None, now: int | None) -> int | None:
        def work(cur: psycopg.Cursor[Any]) -> int | None:
            stamp = self._now(cur, now)
            cur.execute(
                self._q(
                    "UPDATE {t} SET lease_until = %s + coalesce(%s, lease_us), updated_at = %s "
                    "WHERE id = %s AND status = 'running' AND attempts = %s AND lease_until > %s "
                    "RETURNING lease_until"
                ),
                (stamp, lease_us, stamp, job_id, attempt, stamp),
            )
            row = cur.fetchone()
            return None if row is None else int(row[0])

        return self._run(work)

    def complete(
        self,
        job_id: int,
        attempt: int,
        result: str,
        output: str | None,
        now: int | None,
        then_claim: ClaimRequest | None = None,
    ) -> tuple[bool, Job | None]:
        def work(cur: psycopg.Cursor[Any]) -> tuple[bool, Job | None]:
            stamp = self._now(cur, now)
            cur.execute(
                self._q(
                    "UPDATE {t} SET status = 'completed', result = %s, output = %s, finished_at = %s, "
                    "updated_at = %s, lease_until = NULL WHERE id = %s AND status = 'running' "
                    "AND attempts = %s AND lease_until > %s"
                ),
                (result, _clean(output), stamp, stamp, job_id, attempt, stamp),
            )
            if cur.rowcount != 1:
                return False, None
            if then_claim is None or then_claim.where.tasks == () or then_claim.where.queues == ():
                return True, None
            cur.execute(*self._claim_statement(then_claim, stamp))
            row = cur.fetchone()
            return True, None if row is None else row_to_job(row)

        return self._run(work)

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
        lease_test = "lease_until <= %s" if expired else "lease_until > %s"

        def work(cur: psycopg.Cursor[Any]) -> bool:
            stamp = self._now(cur, now)
            failed = status is State.FAILED
            cur.execute(
                self._q(
                    "UPDATE {t} SET status = %s, error = %s, output = %s, retries = retries + %s, "
                    "run_at = CASE WHEN %s THEN %s ELSE run_at END, finished_at = %s, updated_at = %s, "
                    f"lease_until = NULL WHERE id = %s AND status = 'running' AND attempts = %s "
                    f"AND {lease_test}"
                ),
                (
                    status.value,
                    _clean(error),
                    _clean(output),
                    int(failed),
                    failed,
                    stamp + delay_us,
                    None if failed else stamp,
                    stamp,
                    job_id,
                    attempt,
                    stamp,
                ),
            )
            if cur.rowcount == 1 and failed:
                self._notify(cur)
            return bool(cur.rowcount == 1)

        return self._run(work)

    def release(self, job_id: int, attempt: int, now: int | None) -> bool:
        def work(cur: psycopg.Cursor[Any]) -> bool:
            stamp = self._now(cur, now)
            cur.execute(
                self._q(
                    "UPDATE {t} SET status = 'pending', lease_until = NULL, worker_id = NULL, "
                    "updated_at = %s WHERE id = %s AND status = 'running' AND attempts = %s"
                ),
                (stamp, job_id, attempt),
            )
            if cur.rowcount == 1:
                self._notify(cur)
            return bool(cur.rowcount == 1)

        changed = self._run(work)
        if changed:
            self.notify()
        return changed

    def transition(
        self, ids: Iterable[int] | None, sources: Sequence[State], target: State, now: int | None
    ) -> list[int]:
        if target is State.PENDING:  # requeue: a fresh start, the last error kept
            sets = "retries = 0, run_at = %s, lease_until = NULL, worker_id = NULL, finished_at = NULL"
        else:
            sets = "lease_until = NULL, finished_at = %s"
        id_list = None if ids is None else list(ids)

        def work(cur: psycopg.Cursor[Any]) -> list[int]:
            stamp = self._now(cur, now)
            id_sql = "" if id_list is None else " AND id = ANY(%s)"
            cur.execute(
                self._q(
                    f"UPDATE {{t}} SET status = %s, updated_at = %s, {sets} WHERE status = ANY(%s)"
                    f"{id_sql} RETURNING id"
                ),
                [
                    target.value,
                    stamp,
                    stamp,
                    [s.value for s in sources],
                    *([] if id_list is None else [id_list]),
                ],
            )
            changed = sorted(int(r[0]) for r in cur.fetchall())
            if changed and target is State.PENDING:
                self._notify(cur)
            return changed

        changed = self._run(work)
        if changed and target is State.PENDING:
            self.notify()
        return changed

    def _select(self, tail: str, params: Sequence[Any]) -> list[Job]:
        def work(cur: psycopg.Cursor[Any]) -> list[Job]:
            cur.execute(self._q(f"SELECT {COLUMNS} FROM {{t}} {tail}"), params)
            return [row_to_job(r) for r in cur.fetchall()]

        return self._run(work)

    def get(self, job_id: int) -> Job | None:
        found = self._select("WHERE id = %s", (job_id,))
        return found[0] if found else None

    def get_many(self, job_ids: Sequence[int]) -> list[Job]:
        return self._select("WHERE id = ANY(%s)", (list(job_ids),)) if job_ids else []

    def expired(self, now: int | None, limit: int) -> list[Job]:
        stamp = f"{_NOW_US}" if now is None else "%s"
        params: list[Any] = [] if now is None else [now]
        return self._select(
            f"WHERE status = 'running' AND lease_until <= {stamp} ORDER BY lease_until LIMIT %s",
            [*params, limit],
        )

    def delete(self, ids: Iterable[int], statuses: Sequence[State]) -> int:
        id_list = list(ids)

        def work(cur: psycopg.Cursor[Any]) -> int:
            cur.execute(
                self._q("DELETE FROM {t} WHERE id = ANY(%s) AND status = ANY(%s)"),
                (id_list, [s.value for s in statuses]),
            )
            return int(cur.rowcount)

        return self._run(work)

    def purge(self, statuses: Sequence[State], older_than_us: int, now: int | None) -> int:
        def work(cur: psycopg.Cursor[Any]) -> int:
            before = self._now(cur, now) - older_than_us + (0 if older_than_us else 1)
            cur.execute(
                self._q("DELETE FROM {t} WHERE updated_at < %s AND status = ANY(%s)"),
                (before, [s.value for s in statuses]),
            )
            return int(cur.rowcount)

        return self._run(work)

    def counts(self, queue: str | None = None) -> dict[str, int]:
        def work(cur: psycopg.Cursor[Any]) -> dict[str, int]:
            if queue is None:
                cur.execute(self._q("SELECT status, count(*) FROM {t} GROUP BY status"))
            else:
                cur.execute(
                    self._q("SELECT status, count(*) FROM {t} WHERE queue = %s GROUP BY status"), (queue,)
                )
            return {str(s): int(n) for s, n in cur.fetchall()}

        found = self._run(work)
        return {s.value: found.get(s.value, 0) for s in State}

    def rows(
        self, status: Sequence[State] | None, queue: str | None, limit: int, offset: int = 0
    ) -> list[Job]:
        where, params = "WHERE TRUE", list[Any]()
        if status is not None:
            where += " AND status = ANY(%s)"
            params.append([s.value for s in status])
        if queue is not None:
            where += " AND queue = %s"
            params.append(queue)
        return self._select(f"{where} ORDER BY id DESC LIMIT %s OFFSET %s", [*params, limit, offset])

    def _column(self, text: str, params: Sequence[Any] = ()) -> list[Any]:
        def work(cur: psycopg.Cursor[Any]) -> list[Any]:
            cur.execute(self._q(text), params)
            return [r[0] for r in cur.fetchall()]

        return self._run(work)

    def queues(self) -> list[str]:
        return [str(q) for q in self._column("SELECT DISTINCT queue FROM {t} ORDER BY queue")]

    def next_due(self, where: Filter) -> int | None:
        if where.tasks == () or where.queues == ():
            return None
        text, params = f"SELECT run_at FROM {{t}} WHERE {_CLAIMABLE}", list[Any]()
        if where.tasks is not None:
            text += " AND task = ANY(%s)"
            params.append(list(where.tasks))
        if where.queues is not None:
            text += " AND queue = ANY(%s)"
            params.append(list(where.queues))
        found = self._column(text + " ORDER BY run_at LIMIT 1", params)
        return int(found[0]) if found else None

    def task_names(self, statuses: Sequence[State]) -> list[str]:
        return [
            str(t)
            for t in self._column(
                "SELECT DISTINCT task FROM {t} WHERE task IS NOT NULL AND status = ANY(%s) ORDER BY task",
                ([s.value for s in statuses],),
            )
        ]

    def now(self) -> int | None:
        return int(self._column(f"SELECT {_NOW_US}")[0])

    def wait_for_change(self, timeout: float) -> None:
        # One thread listens for NOTIFY; the others wait to be woken by it.
        if self._listen_lock.acquire(blocking=False):
            try:
                listener = self._listening()
                for _ in listener.notifies(timeout=timeout, stop_after=1):
                    self.notify()
            except psycopg.Error:
                self._drop_listener()
                time.sleep(min(timeout, 0.1))
            finally:
                self._listen_lock.release()
            return
        with self._signal:
            self._signal.wait(timeout)

    def _listening(self) -> psycopg.Connection[Any]:
        if self._listener is None or self._listener.closed or self._listener.broken:
            conn = self._connect(autocommit=True)
            conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self.channel)))
            self._listener = conn
        return self._listener

    def _drop_listener(self) -> None:
        if self._listener is not None:
            with contextlib.suppress(psycopg.Error):
                self._listener.close()
        self._listener = None

    def notify(self) -> None:
        with self._signal:
            self._signal.notify_all()

    def close(self) -> None:
        self._closed = True
        with self._all_lock:
            for conn in self._all:
                with contextlib.suppress(psycopg.Error):
                    conn.close()
            self._all.clear()
        with self._listen_lock:
            self._drop_listener()
        self._local = threading.local()
