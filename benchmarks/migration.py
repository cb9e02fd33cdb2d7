"""What migration 12 (jobs that wait) costs on a queue of 1,000,000 jobs, SQLite and PostgreSQL.

    .venv/bin/python benchmarks/migration.py [--jobs N] [--keep DIR] [--no-postgres]

SQLite: a schema-11 file is built the way nbqueue's `_apply_migrations` builds one (the scripts
of versions 1 to 11 in one write transaction, then user_version and application_id), filled
with N jobs (70% completed, 25% pending, 5% dead, in three queues, some pending jobs holding a
key) in one `executemany`, and checkpointed. Then `nbqueue.Queue(path)` is timed: it migrates
to 12 (the CHECK on status widened in place, `_edit_check`, then the version-12 script, which
builds two partial indexes). For comparison, a copy of the same schema-11 file gets the full
table rebuild version 6 did (a new table with the widened CHECK, every row copied, the old one
dropped, the new one renamed, its indexes and triggers made again).

PostgreSQL: a fresh schema at version 11 with N rows (generate_series), then the same open.

The scripts of versions 1 and 6 interpolate the CHECK from the live `State` enum, which now
holds `waiting`: replayed as they are, they would build a file that allows `waiting` already.
A true schema-11 file (as nbqueue 11 wrote it) has the CHECK without it, so it is written so
here (`STATES_V11`).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sqlite3
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nbqueue
from nbqueue.jobs import State
from nbqueue.storage import postgres_queries as pg_queries
from nbqueue.storage import rules
from nbqueue.storage import sqlite as sqlite_storage
from nbqueue.storage import sqlite_queries as sql

PG_SERVER = os.environ.get("NBQUEUE_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")
STATES_V11 = rules.status_in([s for s in State if s is not State.WAITING])
CHECK_QUEUE = "migration-check"
BACKOFF = '{"base":2.0,"cap":3600.0,"jitter":0.1}'


def v11(script: str) -> str:
    """A migration script as nbqueue 11 ran it: the CHECK on status without `waiting`."""
    return script.replace(rules.ANY_STATE_SQL, STATES_V11)


def timed(work: Any) -> tuple[Any, float]:
    start = time.perf_counter()
    result = work()
    return result, time.perf_counter() - start


def mib(path: Path) -> float:
    return sum(p.stat().st_size for p in path.parent.glob(path.name + "*")) / 2**20


def waits(n: int = 0) -> Any:
    return nbqueue.wait_for("go")


def check_waiting_row(q: nbqueue.Queue) -> int:
    """A job suspends (a 'waiting' row written through nbqueue), and is woken and completes."""
    task = q.task(name="migration.waits", queue=CHECK_QUEUE)(waits)
    job = task.enqueue()
    with q.worker(queues=[CHECK_QUEUE], concurrency=1, lease=60) as worker:
        worker.run_until_idle()
        assert q.get(job.id).status is State.WAITING, q.get(job.id).status
        waiting = q.counts(queue=CHECK_QUEUE)["waiting"]
        q.send(job, "go", 1)
        worker.run_until_idle()
    assert q.get(job.id).status is State.COMPLETED
    return waiting


# -- SQLite -----------------------------------------------------------------------------


def sqlite_v11(path: Path) -> None:
    """An empty queue file at schema 11, made as `_apply_migrations` makes one."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute(f"PRAGMA page_size = {sqlite_storage.PAGE_SIZE}")
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("BEGIN IMMEDIATE")
    for version in range(1, 12):
        for statement in sqlite_storage._split_sql(v11(sql.MIGRATIONS[version])):
            conn.execute(statement)
        conn.execute(f"PRAGMA user_version = {version}")
    conn.execute(f"PRAGMA application_id = {sql.APPLICATION_ID}")
    conn.execute("COMMIT")
    table = conn.execute("SELECT sql FROM sqlite_master WHERE name = 'nbqueue_jobs'").fetchone()[0]
    assert sql.LAST_STATE_BEFORE_12 in table and "'waiting'" not in table, table
    conn.close()


def job_rows(n: int, now: int) -> Iterator[tuple[Any, ...]]:
    """n realistic jobs: 70% completed (a result, one attempt), 25% pending (one in five with
    a key), 5% dead (an error, three attempts); three queues, two tasks."""
    for i in range(1, n + 1):
        kind = i % 20
        queue = ("default", "mail", "reports")[i % 3]
        task = "app.send_mail" if queue == "mail" else "app.report"
        payload = f'{{"args":[{i}],"kwargs":{{"to":"user{i}@example.com"}}}}'
        created = now - (n - i) * 1000
        if kind < 14:
            yield ("completed", queue, task, payload, None, 1, None, created, created + 900, created + 100,
                   created + 900, '{"sent": true}')  # fmt: skip
        elif kind < 19:
            key = f"order-{i}" if kind == 14 else None
            yield ("pending", queue, task, payload, key, 0, None, created, created, None, None, None)
        else:
            error = "RuntimeError: smtp refused"
            yield ("dead", queue, task, payload, None, 3, error, created, created + 5000, created + 4000,
                   created + 5000, None)  # fmt: skip


def sqlite_fill(path: Path, n: int) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA synchronous = OFF")
    conn.execute("BEGIN IMMEDIATE")
    conn.executemany(
        "INSERT INTO nbqueue_jobs (status, queue, task, payload, key, attempts, error, run_at, updated_at, "
        "started_at, finished_at, result, created_at, max_retries, backoff) "
        f"VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?8, 3, '{BACKOFF}')",
        job_rows(n, int(time.time() * 1e6)),
    )
    conn.execute("COMMIT")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()


def sqlite_rebuild(path: Path) -> float:
    """Seconds for the rebuild version 6 did, with the CHECK widened, on a schema-11 file: a new
    table, every row copied, the old one dropped, the new renamed, indexes and triggers made
    again, the AUTOINCREMENT sequence kept; one transaction."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA synchronous = NORMAL")  # nbqueue's default
    objects = conn.execute(
        "SELECT type, sql FROM sqlite_master WHERE tbl_name = 'nbqueue_jobs' AND sql IS NOT NULL"
    ).fetchall()
    table = next(text for kind, text in objects if kind == "table")
    again = [text for kind, text in objects if kind in ("index", "trigger")]
    columns = ", ".join(r[1] for r in conn.execute("PRAGMA table_info(nbqueue_jobs)"))
    head, body = table.split("(", 1)  # CREATE TABLE "nbqueue_jobs" (...: the name as RENAME left it
    widened = "CREATE TABLE nbqueue_jobs_v12 (" + body.replace(sql.LAST_STATE_BEFORE_12, sql.WIDENED)
    assert "nbqueue_jobs" in head
    assert widened != table and "nbqueue_jobs_v12" in widened

    def rebuild() -> None:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute(
            "CREATE TEMP TABLE nbqueue_v12_sequence AS SELECT seq FROM sqlite_sequence "
            "WHERE name = 'nbqueue_jobs'"
        )
        conn.execute(widened)
        conn.execute(f"INSERT INTO nbqueue_jobs_v12 ({columns}) SELECT {columns} FROM nbqueue_jobs")
        conn.execute("DROP TABLE nbqueue_jobs")
        conn.execute("ALTER TABLE nbqueue_jobs_v12 RENAME TO nbqueue_jobs")
        conn.execute(
            "UPDATE sqlite_sequence SET seq = max(seq, coalesce((SELECT seq FROM nbqueue_v12_sequence), 0)) "
            "WHERE name = 'nbqueue_jobs'"
        )
        conn.execute("DROP TABLE nbqueue_v12_sequence")
        for statement in again:
            conn.execute(statement)
        conn.execute("COMMIT")

    _, seconds = timed(rebuild)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    conn.execute("BEGIN")
    conn.execute("UPDATE nbqueue_jobs SET status = 'waiting' WHERE id = (SELECT min(id) FROM nbqueue_jobs)")
    conn.execute("ROLLBACK")
    conn.close()
    return seconds


def sqlite_case(folder: Path, n: int) -> dict[str, Any]:
    path = folder / "queue-v11.db"
    _, built = timed(lambda: sqlite_v11(path))
    _, filled = timed(lambda: sqlite_fill(path, n))
    size_v11 = mib(path)
    copy = folder / "queue-v11-copy.db"
    shutil.copyfile(path, copy)
    print(f"  schema-11 file: {n:,} jobs, {size_v11:,.1f} MiB (built {built:.2f} s, filled {filled:.1f} s)")

    widen = [0.0]
    original = sqlite_storage._edit_check

    def timed_widen(conn: sqlite3.Connection, old: str, new: str) -> None:
        widen[0] += timed(lambda: original(conn, old, new))[1]

    sqlite_storage._edit_check = timed_widen
    try:
        q, opened = timed(lambda: nbqueue.Queue(path))
    finally:
        sqlite_storage._edit_check = original
    try:
        waiting = check_waiting_row(q)
    finally:
        q.close()
    _, reopened = timed(lambda: nbqueue.Queue(path).close())
    conn = sqlite3.connect(path)
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    integrity, checked = timed(lambda: conn.execute("PRAGMA integrity_check").fetchone()[0])
    table = conn.execute("SELECT sql FROM sqlite_master WHERE name = 'nbqueue_jobs'").fetchone()[0]
    conn.close()
    assert version == sql.SCHEMA_VERSION and integrity == "ok" and sql.COMPARED_STATES in table
    size_v12 = mib(path)
    print(
        f"  nbqueue.Queue(path), migrating 11 -> {version}: {opened:.2f} s (of it, editing the CHECK in "
        f"place (versions 12 and 15): {widen[0] * 1e3:.2f} ms; the rest is mostly the version-12 script: two "
        "partial indexes built by a scan of the table)"
    )
    print(f"  opening it again (already {version}, no migration): {reopened * 1e3:.1f} ms")
    print(
        f"  after: user_version {version}, PRAGMA integrity_check {integrity} ({checked:.1f} s), a job "
        f"suspended into 'waiting' (counted {waiting}) then sent to and completed; file {size_v12:,.1f} MiB"
    )
    rebuilt = sqlite_rebuild(copy)
    size_rebuilt = mib(copy)
    print(
        f"  full table rebuild instead (as version 6 did), same schema-11 file: {rebuilt:.2f} s; the file "
        f"grows to {size_rebuilt:,.1f} MiB (the old table's pages are left free until a VACUUM)"
    )
    print(
        f"  in-place widening: {widen[0] * 1e3:.2f} ms against {rebuilt:.2f} s for the rebuild; the whole "
        f"migration {opened:.2f} s = {opened / rebuilt:.2f}x the rebuild's time alone"
    )
    return {
        "jobs": n,
        "open_migrate_s": opened,
        "widen_s": widen[0],
        "reopen_s": reopened,
        "integrity_check": integrity,
        "integrity_check_s": checked,
        "mib_v11": size_v11,
        "mib_v12": size_v12,
        "rebuild_s": rebuilt,
        "mib_rebuilt": size_rebuilt,
    }


# -- PostgreSQL -------------------------------------------------------------------------

PG_FILL = """
INSERT INTO $S.nbqueue_jobs (status, queue, task, payload, key, attempts, error, run_at, created_at,
    updated_at, started_at, finished_at, result, max_retries, backoff)
SELECT CASE WHEN i % 20 < 14 THEN 'completed' WHEN i % 20 < 19 THEN 'pending' ELSE 'dead' END,
    (ARRAY['default', 'mail', 'reports'])[i % 3 + 1],
    CASE WHEN i % 3 = 1 THEN 'app.send_mail' ELSE 'app.report' END,
    '{"args":[' || i || '],"kwargs":{"to":"user' || i || '@example.com"}}',
    CASE WHEN i % 20 = 14 THEN 'order-' || i END,
    CASE WHEN i % 20 < 14 THEN 1 WHEN i % 20 < 19 THEN 0 ELSE 3 END,
    CASE WHEN i % 20 = 19 THEN 'RuntimeError: smtp refused' END,
    t0 - ($N - i) * 1000, t0 - ($N - i) * 1000,
    t0 - ($N - i) * 1000 + CASE WHEN i % 20 < 14 THEN 900 WHEN i % 20 < 19 THEN 0 ELSE 5000 END,
    CASE WHEN i % 20 < 14 OR i % 20 = 19 THEN t0 - ($N - i) * 1000 + 100 END,
    CASE WHEN i % 20 < 14 OR i % 20 = 19 THEN t0 - ($N - i) * 1000 + 900 END,
    CASE WHEN i % 20 < 14 THEN '{"sent": true}' END,
    3, '$BACKOFF'
FROM generate_series(1, $N) AS i, (SELECT (extract(epoch FROM now()) * 1e6)::bigint AS t0) AS c
"""


def postgres_case(server: str, n: int) -> dict[str, Any] | None:
    try:
        import psycopg
        from psycopg import sql as pg_sql
    except ImportError:
        print("  psycopg not installed")
        return None
    try:
        psycopg.connect(server, connect_timeout=3).close()
    except psycopg.Error as exc:
        print(f"  server not reachable: {exc}")
        return None
    schema = f"nbq_migration_{uuid.uuid4().hex[:10]}"
    s = pg_sql.Identifier(schema)
    try:
        with psycopg.connect(server, autocommit=True) as conn:

            def build() -> None:
                conn.execute(pg_sql.SQL("CREATE SCHEMA {}").format(s))
                with conn.transaction():  # as nbqueue runs them: one transaction
                    for version in range(1, 12):
                        for statement in pg_queries.MIGRATIONS[version]:
                            conn.execute(pg_sql.SQL(v11(statement)).format(s=s))  # type: ignore[arg-type]
                    conn.execute(
                        pg_sql.SQL("CREATE TABLE {}.nbqueue_meta (version INTEGER NOT NULL)").format(s)
                    )
                    conn.execute(pg_sql.SQL("INSERT INTO {}.nbqueue_meta VALUES (11)").format(s))

            _, built = timed(build)
            fill = PG_FILL.replace("$S", s.as_string(conn)).replace("$N", str(n)).replace("$BACKOFF", BACKOFF)
            _, filled = timed(lambda: conn.execute(fill))  # type: ignore[call-overload]
            _, vacuumed = timed(lambda: conn.execute(pg_sql.SQL("VACUUM ANALYZE {}.nbqueue_jobs").format(s)))
            size = conn.execute("SELECT pg_total_relation_size(%s)", (f"{schema}.nbqueue_jobs",)).fetchone()
            check = conn.execute(
                "SELECT pg_get_constraintdef(oid) FROM pg_constraint "
                "WHERE conname = 'nbqueue_jobs_status_check' AND conrelid = %s::regclass",
                (f"{schema}.nbqueue_jobs",),
            ).fetchone()
            assert check is not None and "waiting" not in check[0], check
            mb = (size[0] if size else 0) / 2**20
            print(
                f"  schema-11 schema: {n:,} jobs, table and indexes {mb:,.1f} MiB (built {built:.2f} s, "
                f"filled {filled:.1f} s, VACUUM ANALYZE {vacuumed:.1f} s)"
            )
            target = f"{server}?schema={schema}"
            q, opened = timed(lambda: nbqueue.Queue(target))
            try:
                waiting = check_waiting_row(q)
            finally:
                q.close()
            _, reopened = timed(lambda: nbqueue.Queue(target).close())
            version = conn.execute(pg_sql.SQL("SELECT version FROM {}.nbqueue_meta").format(s)).fetchone()
            valid = conn.execute(
                "SELECT convalidated, pg_get_constraintdef(oid) FROM pg_constraint "
                "WHERE conname = 'nbqueue_jobs_status_check' AND conrelid = %s::regclass",
                (f"{schema}.nbqueue_jobs",),
            ).fetchone()
            assert version is not None and version[0] == pg_queries.SCHEMA_VERSION
            assert valid is not None and "waiting" in valid[1]
            print(
                f"  nbqueue.Queue(url), migrating 11 -> 12: {opened:.2f} s (the CHECK re-added NOT VALID: "
                f"validated={valid[0]}; two partial indexes built)"
            )
            print(f"  opening it again (already 12): {reopened * 1e3:.1f} ms")
            print(
                f"  after: version {version[0]}, a job suspended into 'waiting' (counted {waiting}), "
                "then sent to and completed"
            )
            validate = pg_sql.SQL("ALTER TABLE {}.nbqueue_jobs VALIDATE CONSTRAINT nbqueue_jobs_status_check")
            _, validated = timed(lambda: conn.execute(validate.format(s)))
            print(
                f"  for comparison, VALIDATE CONSTRAINT on it (the scan NOT VALID skips, under a "
                f"SHARE UPDATE EXCLUSIVE lock): {validated:.2f} s"
            )
            return {
                "jobs": n,
                "open_migrate_s": opened,
                "reopen_s": reopened,
                "mib": mb,
                "validate_s": validated,
            }
    finally:
        with psycopg.connect(server, autocommit=True) as conn:
            conn.execute(pg_sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(s))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--keep", type=Path, help="build the SQLite files here and keep them")
    parser.add_argument("--no-postgres", action="store_true")
    args = parser.parse_args(argv)
    print(
        f"migration 12 on {args.jobs:,} jobs; SQLite {sqlite3.sqlite_version}, "
        f"Python {sys.version.split()[0]}"
    )
    print("SQLite:")
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
        sqlite_case(args.keep, args.jobs)
    else:
        with tempfile.TemporaryDirectory(prefix="nbqueue-migration-") as tmp:
            sqlite_case(Path(tmp), args.jobs)
    if not args.no_postgres:
        print(f"PostgreSQL on {PG_SERVER.rsplit('@', 1)[-1]}:")
        postgres_case(PG_SERVER, args.jobs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
