"""Schema history: a queue written by any older nbqueue opens, upgraded in place, with its jobs.

Each backend keeps its own version history; from version 3 on the two mean the
same schema (the same tables, indexes and counts), which the last test checks.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import psycopg
import pytest
from psycopg import sql as pg_sql

import nbqueue
from nbqueue.clock import ManualClock
from nbqueue.jobs import State
from nbqueue.storage import postgres_queries, sqlite_queries
from nbqueue.storage.sqlite import _edit_check

OLD_ROW = (
    "INSERT INTO {t} (status, queue, payload, max_retries, run_at, created_at, updated_at) "
    "VALUES ('pending', 'default', '{{\"kept\": true}}', 3, 0, 0, 0), "
    "('dead', 'default', '{{\"dead\": true}}', 3, 0, 0, 0)"
)


def sqlite_at(path: Path, version: int) -> None:
    """A SQLite queue file as nbqueue left it at schema `version`, holding two jobs."""
    conn = sqlite3.connect(path, isolation_level=None)
    for v in range(1, version + 1):
        if v in sqlite_queries.CHECK_EDITS:  # as nbqueue edits the CHECK on status before the script
            _edit_check(conn, *sqlite_queries.CHECK_EDITS[v])
        conn.executescript(sqlite_queries.MIGRATIONS[v])
    conn.execute(f"PRAGMA user_version = {version}")
    conn.execute(f"PRAGMA application_id = {sqlite_queries.APPLICATION_ID}")
    conn.execute(OLD_ROW.format(t="nbqueue_jobs"))
    conn.close()


def postgres_at(server: str, schema: str, version: int) -> None:
    """A PostgreSQL queue schema as nbqueue left it at schema `version`, holding two jobs."""
    s = pg_sql.Identifier(schema)
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(pg_sql.SQL("CREATE SCHEMA {}").format(s))
        for v in range(1, version + 1):
            with conn.transaction():  # as nbqueue runs them: one transaction under its lock
                for statement in postgres_queries.MIGRATIONS[v]:
                    conn.execute(pg_sql.SQL(statement).format(s=s))  # type: ignore[arg-type]
        conn.execute(pg_sql.SQL("CREATE TABLE {}.nbqueue_meta (version INTEGER NOT NULL)").format(s))
        conn.execute(pg_sql.SQL("INSERT INTO {}.nbqueue_meta VALUES (%s)").format(s), (version,))
        table = pg_sql.SQL("{}.nbqueue_jobs").format(s)
        conn.execute(pg_sql.SQL(OLD_ROW).format(t=table))  # type: ignore[arg-type]


def check_upgraded(q: nbqueue.Queue) -> None:
    """The old jobs are there, counted, claimable and requeueable on the upgraded schema; a job
    keeps files (version 7) and attempts (version 8), and they go when it is deleted."""
    assert q.get(1).payload == {"kept": True}
    assert q.counts()["pending"] == 1 and q.counts()["dead"] == 1
    job = q.claim()
    assert job is not None and job.id == 1
    assert q.manager.journal.save_file(job, "out.ipynb", "{}")
    q.complete(job, "ok")
    assert list(q.attempts(1)["outcome"]) == ["completed"]  # version 8: every attempt recorded
    assert q.requeue(None) == 1
    assert q.counts() == {**dict.fromkeys(q.counts(), 0), "completed": 1, "pending": 1}
    assert q.manager.journal.file_names([1, 2]) == {1: ["out.ipynb"]}
    assert q.delete(1) == 1
    assert q.manager.journal.load_file(1, "out.ipynb") is None
    assert q.manager.storage.attempts(1) == []
    assert q.counts() == {**dict.fromkeys(q.counts(), 0), "pending": 1}


@pytest.mark.parametrize("version", range(1, sqlite_queries.SCHEMA_VERSION))
def test_sqlite_files_of_every_older_version_are_upgraded(tmp_path: Path, version: int) -> None:
    path = tmp_path / "old.db"
    sqlite_at(path, version)
    with nbqueue.Queue(path) as q:
        check_upgraded(q)
    check = sqlite3.connect(path)
    assert check.execute("PRAGMA user_version").fetchone()[0] == sqlite_queries.SCHEMA_VERSION
    fresh_path = tmp_path / "fresh.db"
    nbqueue.Queue(fresh_path).close()
    fresh = sqlite3.connect(fresh_path)
    assert sqlite_objects(check) == sqlite_objects(fresh)  # upgraded = made new
    check.close()
    fresh.close()


@pytest.mark.parametrize("version", range(1, postgres_queries.SCHEMA_VERSION))
def test_postgres_schemas_of_every_older_version_are_upgraded(
    pg_server: str, pg_schema: str, version: int
) -> None:
    postgres_at(pg_server, pg_schema, version)
    with nbqueue.Queue(f"{pg_server}?schema={pg_schema}") as q:
        check_upgraded(q)
    with psycopg.connect(pg_server) as conn:
        (found,) = conn.execute(
            pg_sql.SQL("SELECT version FROM {}.nbqueue_meta").format(pg_sql.Identifier(pg_schema))
        ).fetchone()  # type: ignore[misc]
    assert found == postgres_queries.SCHEMA_VERSION


CLAIMED_AT_V7 = (
    "UPDATE {t} SET status = 'running', attempts = 1, started_at = 1, lease_until = 9000000000000000, "
    "lease_us = 60000000, worker_id = 'old' WHERE id = 1"
)


def check_v7_claim_finishes(q: nbqueue.Queue) -> None:
    """A job claimed before version 8 (no attempt row, no host) finishes; later claims are recorded."""
    assert q.recover() == 0  # its claimer is unknown: never taken for a gone process
    job = q.get(1)
    assert job.status == "running" and q.attempts(1).empty
    q.fail(job, "after the upgrade", retry=False)
    assert q.attempts(1).empty  # that attempt began before attempts were recorded
    assert q.requeue([1]) == 1
    again = q.claim()
    assert again is not None and again.id == 1
    q.complete(again, "ok")
    assert list(q.attempts(1)["outcome"]) == ["completed"] and list(q.attempts(1)["attempt"]) == [2]


def test_a_sqlite_file_claimed_at_version_7_upgrades(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    sqlite_at(path, 7)
    with sqlite3.connect(path) as conn:
        conn.execute(CLAIMED_AT_V7.format(t="nbqueue_jobs"))
    conn.close()
    with nbqueue.Queue(path) as q:
        check_v7_claim_finishes(q)


def test_a_postgres_schema_claimed_at_version_7_upgrades(pg_server: str, pg_schema: str) -> None:
    postgres_at(pg_server, pg_schema, 7)
    with psycopg.connect(pg_server, autocommit=True) as conn:
        table = pg_sql.SQL("{}.nbqueue_jobs").format(pg_sql.Identifier(pg_schema))
        conn.execute(pg_sql.SQL(CLAIMED_AT_V7).format(t=table))  # type: ignore[arg-type]
    with nbqueue.Queue(f"{pg_server}?schema={pg_schema}") as q:
        check_v7_claim_finishes(q)


# A job whose attempt timed out at version 10 (its outcome read from the error text then), due again.
FAILED_AT_V10 = (
    "UPDATE {t} SET status = 'running', attempts = 1, started_at = 1, lease_until = 9000000000000000, "
    "lease_us = 60000000, worker_id = 'old' WHERE id = 1",
    "UPDATE {t} SET status = 'failed', retries = 1, error = 'timed out after 1 s', lease_until = NULL, "
    "updated_at = 2 WHERE id = 1",
)


def check_outcomes_are_stored_values(q: nbqueue.Queue, clock: ManualClock) -> None:
    """Version 11: an attempt's outcome is the value its write stores, not read from the error text:
    the old attempt keeps its outcome, a handler's own text that reads like a lost claim is a
    failure, and an expired lease is lost."""
    assert list(q.attempts(1)["outcome"]) == ["timeout"]
    job = q.claim(lease=10)
    assert job is not None and job.id == 1
    q.fail(job, "lost: words a handler chose")
    clock.advance(3600)
    again = q.claim(lease=10)
    assert again is not None and again.id == 1
    clock.advance(11)
    assert q.recover() == 1
    assert list(q.attempts(1)["outcome"]) == ["timeout", "failed", "lost"]
    assert q.attempts(1)["error"].iloc[1] == "lost: words a handler chose"


def test_a_sqlite_attempt_recorded_at_version_10_keeps_its_outcome(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    sqlite_at(path, 10)
    with sqlite3.connect(path) as conn:
        for statement in FAILED_AT_V10:
            conn.execute(statement.format(t="nbqueue_jobs"))
    conn.close()
    clock = ManualClock()
    with nbqueue.Queue(path, clock=clock) as q:
        check_outcomes_are_stored_values(q, clock)


def test_a_postgres_attempt_recorded_at_version_10_keeps_its_outcome(pg_server: str, pg_schema: str) -> None:
    postgres_at(pg_server, pg_schema, 10)
    with psycopg.connect(pg_server, autocommit=True) as conn:
        table = pg_sql.SQL("{}.nbqueue_jobs").format(pg_sql.Identifier(pg_schema))
        for statement in FAILED_AT_V10:
            conn.execute(pg_sql.SQL(statement).format(t=table))  # type: ignore[arg-type]
    clock = ManualClock()
    with nbqueue.Queue(f"{pg_server}?schema={pg_schema}", clock=clock) as q:
        check_outcomes_are_stored_values(q, clock)


def test_a_fresh_queue_is_at_the_latest_version_on_both_backends(
    pg_server: str, pg_schema: str, tmp_path: Path
) -> None:
    """Both backends end at the same version with the same tables and indexes: one meaning."""
    assert sqlite_queries.SCHEMA_VERSION == postgres_queries.SCHEMA_VERSION
    nbqueue.Queue(tmp_path / "fresh.db").close()
    nbqueue.Queue(f"{pg_server}?schema={pg_schema}").close()
    with sqlite3.connect(tmp_path / "fresh.db") as conn:
        lite = sqlite_objects(conn)
    with psycopg.connect(pg_server) as conn:
        rows = conn.execute(
            "SELECT 'table', tablename FROM pg_tables WHERE schemaname = %s "
            "UNION ALL SELECT 'index', indexname FROM pg_indexes WHERE schemaname = %s "
            "AND indexname NOT LIKE '%%_pkey'",
            (pg_schema, pg_schema),
        ).fetchall()
    pg = {(kind, name) for kind, name in rows}
    # PostgreSQL keeps its counts without a hot row (changes appended, then folded) and
    # its version in a table; SQLite keeps the version in the file header.
    assert pg - {("table", "nbqueue_count_changes"), ("table", "nbqueue_meta")} == {
        (kind, name) for kind, name in lite if kind in ("table", "index")
    }


def sqlite_objects(conn: sqlite3.Connection) -> set[tuple[str, str]]:
    rows = conn.execute("SELECT type, name FROM sqlite_master WHERE name NOT LIKE 'sqlite_%'").fetchall()
    return {(kind, name) for kind, name in rows}


def test_the_check_on_status_takes_exactly_the_states_after_its_edit(tmp_path: Path) -> None:
    """Version 15 writes the CHECK on status as comparisons, not a list (a list of constants
    built a small table in every statement that wrote a state), in place: an upgraded file and
    a new one take every state and refuse any other text."""
    upgraded, fresh = tmp_path / "old.db", tmp_path / "fresh.db"
    sqlite_at(upgraded, 14)
    for path in (upgraded, fresh):
        with nbqueue.Queue(path) as q:
            job = q.enqueue({"n": 1})
        conn = sqlite3.connect(path, isolation_level=None)
        try:
            (table,) = conn.execute("SELECT sql FROM sqlite_master WHERE name = 'nbqueue_jobs'").fetchone()
            assert sqlite_queries.COMPARED_STATES in table and sqlite_queries.LISTED_STATES not in table
            for state in State:
                taken = (state.value, job.id)
                conn.execute("UPDATE nbqueue_jobs SET status = ?, started_at = 0 WHERE id = ?", taken)
            for wrong in ("finished", "Pending", "pending "):
                with pytest.raises(sqlite3.IntegrityError, match="CHECK"):
                    conn.execute("UPDATE nbqueue_jobs SET status = ? WHERE id = ?", (wrong, job.id))
            assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        finally:
            conn.close()
