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

SCHEMA_VERSION = 2
T = TypeVar("T")
_STATES = ", ".join(f"'{s.value}'" for s in State)
_CLAIMABLE = "status IN ('pending', 'failed')"
_UNFINISHED = "status IN ('pending', 'failed', 'running')"
_NOW_US = "(extract(epoch from now()) * 1000000)::bigint"
NOW = f"coalesce(%s::bigint, {_NOW_US})"  # the caller's clock if given, else the server's
COLUMNS_OF_T = ", ".join(f"{{t}}.{c.strip()}" for c in COLUMNS.split(","))

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
    # Progress reported from inside a job; periodic tasks' last enqueued slot.
    2: [
        "ALTER TABLE {s}.nbqueue_jobs ADD COLUMN progress_done DOUBLE PRECISION, "
        "ADD COLUMN progress_total DOUBLE PRECISION, ADD COLUMN progress_message TEXT",
        "CREATE TABLE {s}.nbqueue_periodic (name TEXT PRIMARY KEY, last_slot BIGINT NOT NULL)",
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
        self.synchronous = synchronous
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
        # "normal" is SQLite's WAL + synchronous=NORMAL: a client crash loses nothing (the
        # server has every commit); only a crash of the server itself may lose the last
        # moments. "full" waits for the server's fsync on every commit.
        commit = "on" if self.synchronous == "full" else "off"
        try:
            return psycopg.connect(
                self.conninfo,
                autocommit=autocommit,
                connect_timeout=10,
                options=f"-c synchronous_commit={commit}",
            )
        except psycopg.Error as exc:
            raise StorageError(f"cannot connect to {self._where}: {exc}") from exc

    def _conn(self) -> psycopg.Connection[Any]:
        conn: psycopg.Connection[Any] | None = getattr(self._local, "conn", None)
        if conn is None or conn.closed or conn.broken:
            if self._closed:
                raise StorageError(f"{self._where}: the queue is closed")
            conn = self._connect(autocommit=True)  # each verb is one statement: one round trip
            self._local.conn = conn
            with self._all_lock:
                self._all.append(conn)
        return conn

    def _run(self, work: Callable[[psycopg.Cursor[Any]], T], transaction: bool = False) -> T:
        """Run `work` (atomic: one statement, or a transaction); a dropped connection is re-made."""
        for attempt in range(4):
            conn = self._conn()
            try:
                if transaction:
                    with conn.transaction(), conn.cursor() as cur:
                        return work(cur)
                with conn.cursor() as cur:
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

    def _one(self, statement: str, params: Sequence[Any]) -> tuple[Any, ...] | None:
        """One statement, its first row (or None)."""

        def work(cur: psycopg.Cursor[Any]) -> tuple[Any, ...] | None:
            cur.execute(self._q(statement), params)
            return cur.fetchone() if cur.description else None

        return self._run(work)

    def _all_rows(self, statement: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        def work(cur: psycopg.Cursor[Any]) -> list[tuple[Any, ...]]:
            cur.execute(self._q(statement), params)
            return cur.fetchall()

        return self._run(work)

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

        self._run(work, transaction=True)

    # -- verbs: each one statement, with the time from the server unless `now` is given --

    def insert(self, jobs: Sequence[NewJob], now: int | None) -> list[tuple[int, bool]]:
        columns = "queue, task, payload, priority, key, max_retries, delay_us, run_at_us, timeout, backoff"
        values = [
            [j.queue for j in jobs],
            [j.task for j in jobs],
            [j.payload for j in jobs],
            [j.priority for j in jobs],
            [j.key for j in jobs],
            [j.max_retries for j in jobs],
            [j.delay_us for j in jobs],
            [j.run_at_us for j in jobs],
            [j.timeout for j in jobs],
            [j.backoff for j in jobs],
        ]
        # All rows in one INSERT ... SELECT FROM unnest: atomic, one round trip. A row whose key
        # an unfinished job holds is skipped, and that job's id is returned instead.
        statement = (
            f"WITH t AS (SELECT {NOW} AS now), "
            f"rows AS (SELECT * FROM unnest(%s::text[], %s::text[], %s::text[], %s::bigint[], %s::text[], "
            f"%s::int[], %s::bigint[], %s::bigint[], %s::float8[], %s::text[]) WITH ORDINALITY "
            f"AS r({columns}, n)), "
            "ins AS (INSERT INTO {t} (status, queue, task, payload, priority, key, max_retries, run_at, "
            "created_at, updated_at, timeout, backoff) SELECT 'pending', queue, task, payload, priority, "
            "key, max_retries, coalesce(run_at_us, t.now + delay_us), t.now, t.now, timeout, backoff "
            f"FROM rows, t ORDER BY n ON CONFLICT (key) WHERE key IS NOT NULL AND {_UNFINISHED} "
            "DO NOTHING RETURNING id, key), "
            "woke AS (SELECT pg_notify(%s, '') WHERE EXISTS (SELECT 1 FROM ins)) "
            "SELECT id, key FROM ins, (SELECT count(*) FROM woke) w ORDER BY id"
        )
        if len(jobs) > 1 and any(j.key is not None for j in jobs):
            return self._insert_each(jobs, now)
        for _ in range(10):  # a held key's job may finish meanwhile: then insert again
            rows = self._all_rows(statement, [now, *values, self.channel])
            created = [int(r[0]) for r in rows]
            if len(created) == len(jobs):
                self.notify()
                return [(i, True) for i in created]
            if all(j.key is None for j in jobs):
                raise StorageError(f"{self._where}: {len(jobs) - len(created)} jobs were not written")
            held = self._one(f"SELECT id FROM {{t}} WHERE key = %s AND {_UNFINISHED}", (jobs[0].key,))
            if held is not None:
                return [(int(held[0]), False)]
        raise StorageError(f"{self._where}: the key kept changing hands")

    def _insert_each(self, jobs: Sequence[NewJob], now: int | None) -> list[tuple[int, bool]]:
        """Several jobs with keys: one by one, so each held key answers for itself."""
        return [pair for job in jobs for pair in self.insert([job], now)]

    def _claim_statement(self, request: ClaimRequest) -> tuple[str, list[Any]]:
        """The claim as a sub-statement whose own `now` parameter comes first."""
        where, worker_id, lease_us = request
        task_sql = "" if where.tasks is None else " AND task = ANY(%s)"
        task_params: list[Any] = [] if where.tasks is None else [list(where.tasks)]
        order = "ORDER BY priority DESC, run_at, id LIMIT 1"
        if where.queues is None or len(where.queues) == 1:
            queue_sql = "" if where.queues is None else " AND queue = %s"
            pick = (
                f"SELECT id FROM {{t}} WHERE {_CLAIMABLE}{queue_sql} AND run_at <= c.now{task_sql} "
                f"{order} FOR UPDATE SKIP LOCKED"
            )
            pick_params = [*([] if where.queues is None else [where.queues[0]]), *task_params]
        else:  # one index seek per queue, then the best of those few candidates
            pick = (
                f"SELECT k.id FROM unnest(%s::text[]) AS q(name) CROSS JOIN LATERAL (SELECT id, "
                f"priority, run_at FROM {{t}} WHERE {_CLAIMABLE} AND queue = q.name AND run_at <= c.now"
                f"{task_sql} {order} FOR UPDATE SKIP LOCKED) k ORDER BY k.priority DESC, k.run_at, "
                "k.id LIMIT 1"
            )
            pick_params = [list(where.queues), *task_params]
        statement = (
            "UPDATE {t} SET status = 'running', attempts = attempts + 1, worker_id = %s, "
            "lease_until = c.now + %s, lease_us = %s, started_at = c.now, updated_at = c.now, "
            "progress_done = NULL, progress_total = NULL, progress_message = NULL "
            f"FROM c WHERE id = ({pick}) RETURNING {COLUMNS_OF_T}"
        )
        return statement, [worker_id, lease_us, lease_us, *pick_params]

    def claim(self, where: Filter, worker_id: str, lease_us: int, now: int | None) -> Job | None:
        if where.matches_nothing:
            return None
        claim, params = self._claim_statement(ClaimRequest(where, worker_id, lease_us))
        row = self._one(f"WITH c AS (SELECT {NOW} AS now) {claim}", [now, *params])
        return None if row is None else self._job_or_bury(row)

    def _job_or_bury(self, row: Sequence[Any]) -> Job | None:
        """The claimed row as a Job; a damaged row goes to the dead letters instead of blocking."""
        try:
            return row_to_job(row)
        except StorageError as exc:
            self._one(
                f"UPDATE {{t}} SET status = 'dead', error = %s, lease_until = NULL, finished_at = {_NOW_US}, "
                f"updated_at = {_NOW_US} WHERE id = %s",
                [str(exc), row[0]],
            )
            return None

    def heartbeat(self, job_id: int, attempt: int, lease_us: int | None, now: int | None) -> int | None:
        row = self._one(
            f"WITH c AS (SELECT {NOW} AS now) UPDATE {{t}} SET lease_until = c.now + coalesce(%s, lease_us), "
            "updated_at = c.now FROM c WHERE id = %s AND status = 'running' AND attempts = %s "
            "AND lease_until > c.now RETURNING lease_until",
            [now, lease_us, job_id, attempt],
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
        done = (
            "UPDATE {t} SET status = 'completed', result = %s, output = %s, finished_at = c.now, "
            "updated_at = c.now, lease_until = NULL FROM c WHERE id = %s AND status = 'running' "
            "AND attempts = %s AND lease_until > c.now RETURNING {t}.id"
        )
        params: list[Any] = [now, result, _clean(output), job_id, attempt]
        if then_claim is None or then_claim.where.matches_nothing:
            row = self._one(
                f"WITH c AS (SELECT {NOW} AS now), done AS ({done}) SELECT count(*) FROM done", params
            )
            return bool(row and row[0]), None
        # The completion and the next claim in one statement: one commit per job.
        claim, claim_params = self._claim_statement(then_claim)
        claim = claim.replace("FROM c WHERE", "FROM c WHERE EXISTS (SELECT 1 FROM done) AND", 1)
        row = self._one(
            f"WITH c AS (SELECT {NOW} AS now), done AS ({done}), next AS ({claim}) "
            "SELECT (SELECT count(*) FROM done), next.* FROM (SELECT 1) one LEFT JOIN next ON TRUE",
            [*params, *claim_params],
        )
        if row is None or not row[0]:
            return False, None
        return True, None if row[1] is None else self._job_or_bury(row[1:])

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
        failed = status is State.FAILED
        row = self._one(
            f"WITH c AS (SELECT {NOW} AS now) UPDATE {{t}} SET status = %s, error = %s, output = %s, "
            "retries = retries + %s, run_at = CASE WHEN %s THEN c.now + %s ELSE run_at END, "
            "finished_at = CASE WHEN %s THEN NULL ELSE c.now END, updated_at = c.now, lease_until = NULL "
            "FROM c WHERE id = %s AND status = 'running' AND attempts = %s "
            f"AND lease_until {'<=' if expired else '>'} c.now "
            "RETURNING (SELECT count(*) FROM (SELECT pg_notify(%s, '') WHERE %s) n)",
            [
                now,
                status.value,
                _clean(error),
                _clean(output),
                int(failed),
                failed,
                delay_us,
                failed,
                job_id,
                attempt,
                self.channel,
                failed,
            ],
        )
        return row is not None

    def release(self, job_id: int, attempt: int, now: int | None) -> bool:
        row = self._one(
            f"WITH c AS (SELECT {NOW} AS now) UPDATE {{t}} SET status = 'pending', lease_until = NULL, "
            "worker_id = NULL, updated_at = c.now FROM c WHERE id = %s AND status = 'running' "
            "AND attempts = %s RETURNING (SELECT count(*) FROM (SELECT pg_notify(%s, '')) n)",
            [now, job_id, attempt, self.channel],
        )
        if row is not None:
            self.notify()
        return row is not None

    def transition(
        self, ids: Iterable[int] | None, sources: Sequence[State], target: State, now: int | None
    ) -> list[int]:
        if target is State.PENDING:  # requeue: a fresh start, the last error kept
            sets = "retries = 0, run_at = c.now, lease_until = NULL, worker_id = NULL, finished_at = NULL"
        else:
            sets = "lease_until = NULL, finished_at = c.now"
        id_sql = "" if ids is None else " AND id = ANY(%s)"
        rows = self._all_rows(
            f"WITH c AS (SELECT {NOW} AS now), moved AS (UPDATE {{t}} SET status = %s, updated_at = c.now, "
            f"{sets} FROM c WHERE status = ANY(%s){id_sql} RETURNING {{t}}.id) "
            "SELECT id, (SELECT count(*) FROM (SELECT pg_notify(%s, '') WHERE %s) n) FROM moved",
            [
                now,
                target.value,
                [s.value for s in sources],
                *([] if ids is None else [list(ids)]),
                self.channel,
                target is State.PENDING,
            ],
        )
        changed = sorted(int(r[0]) for r in rows)
        if changed and target is State.PENDING:
            self.notify()
        return changed

    def progress(
        self, job_id: int, attempt: int, done: float, total: float | None, message: str, now: int | None
    ) -> bool:
        row = self._one(
            f"WITH c AS (SELECT {NOW} AS now) UPDATE {{t}} SET progress_done = %s, progress_total = %s, "
            "progress_message = %s, updated_at = c.now FROM c WHERE id = %s AND status = 'running' "
            "AND attempts = %s RETURNING {t}.id",
            [now, done, total, _clean(message), job_id, attempt],
        )
        return row is not None

    def periodic(self, name: str, slot_us: int, job: NewJob, now: int | None) -> bool:
        def work(cur: psycopg.Cursor[Any]) -> bool:
            cur.execute(
                self._q(
                    "INSERT INTO {s}.nbqueue_periodic VALUES (%s, %s) ON CONFLICT DO NOTHING RETURNING 1"
                ),
                (name, slot_us),
            )
            if cur.fetchone() is not None:  # first sighting: the first job is the next slot's
                return False
            cur.execute(
                self._q(
                    "UPDATE {s}.nbqueue_periodic SET last_slot = %s WHERE name = %s AND last_slot < %s "
                    "RETURNING 1"
                ),
                (slot_us, name, slot_us),
            )
            if cur.fetchone() is None:  # another worker took this slot
                return False
            cur.execute(
                self._q(
                    f"WITH c AS (SELECT {NOW} AS now) INSERT INTO {{t}} (status, queue, task, payload, "
                    "priority, key, max_retries, run_at, created_at, updated_at, timeout, backoff) "
                    "SELECT 'pending', %s, %s, %s, %s, %s, %s, coalesce(%s, c.now + %s), c.now, c.now, "
                    "%s, %s FROM c"
                ),
                [
                    now,
                    job.queue,
                    job.task,
                    job.payload,
                    job.priority,
                    job.key,
                    job.max_retries,
                    job.run_at_us,
                    job.delay_us,
                    job.timeout,
                    job.backoff,
                ],
            )
            cur.execute("SELECT pg_notify(%s, '')", (self.channel,))
            return True

        taken = self._run(work, transaction=True)
        if taken:
            self.notify()
        return taken

    def _select(self, tail: str, params: Sequence[Any]) -> list[Job]:
        return [row_to_job(r) for r in self._all_rows(f"SELECT {COLUMNS} FROM {{t}} {tail}", params)]

    def get(self, job_id: int) -> Job | None:
        found = self._select("WHERE id = %s", (job_id,))
        return found[0] if found else None

    def get_many(self, job_ids: Sequence[int]) -> list[Job]:
        return self._select("WHERE id = ANY(%s)", (list(job_ids),)) if job_ids else []

    def expired(self, now: int | None, limit: int) -> list[Job]:
        return self._select(
            f"WHERE status = 'running' AND lease_until <= {NOW} ORDER BY lease_until LIMIT %s", [now, limit]
        )

    def delete(self, ids: Iterable[int], statuses: Sequence[State]) -> int:
        rows = self._all_rows(
            "DELETE FROM {t} WHERE id = ANY(%s) AND status = ANY(%s) RETURNING id",
            [list(ids), [s.value for s in statuses]],
        )
        return len(rows)

    def purge(
        self, statuses: Sequence[State], older_than_us: int, now: int | None, limit: int | None = None
    ) -> int:
        chosen = f"SELECT id FROM {{t}} WHERE updated_at < {NOW} - %s AND status = ANY(%s)"
        if limit is not None:  # small batches keep locks short
            chosen += f" ORDER BY id LIMIT {int(limit)}"
        row = self._one(
            f"WITH gone AS (DELETE FROM {{t}} WHERE id IN ({chosen}) RETURNING 1) SELECT count(*) FROM gone",
            [now, older_than_us - (0 if older_than_us else 1), [s.value for s in statuses]],
        )
        return int(row[0]) if row else 0

    def counts(self, queue: str | None = None) -> dict[str, int]:
        if queue is None:
            rows = self._all_rows("SELECT status, count(*) FROM {t} GROUP BY status")
        else:
            rows = self._all_rows(
                "SELECT status, count(*) FROM {t} WHERE queue = %s GROUP BY status", [queue]
            )
        found = {str(s): int(n) for s, n in rows}
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

    def queues(self) -> list[str]:
        return [str(r[0]) for r in self._all_rows("SELECT DISTINCT queue FROM {t} ORDER BY queue")]

    def next_due(self, where: Filter) -> int | None:
        if where.matches_nothing:
            return None
        text, params = f"SELECT run_at FROM {{t}} WHERE {_CLAIMABLE}", list[Any]()
        if where.tasks is not None:
            text += " AND task = ANY(%s)"
            params.append(list(where.tasks))
        if where.queues is not None:
            text += " AND queue = ANY(%s)"
            params.append(list(where.queues))
        row = self._one(text + " ORDER BY run_at LIMIT 1", params)
        return None if row is None else int(row[0])

    def task_names(self, statuses: Sequence[State]) -> list[str]:
        rows = self._all_rows(
            "SELECT DISTINCT task FROM {t} WHERE task IS NOT NULL AND status = ANY(%s) ORDER BY task",
            [[s.value for s in statuses]],
        )
        return [str(r[0]) for r in rows]

    def now(self) -> int | None:
        row = self._one(f"SELECT {_NOW_US}", [])
        assert row is not None
        return int(row[0])

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
