"""The generic fixtures hand each test a queue as fresh as a new one (tests/templates.py)."""

from __future__ import annotations

import os
import sqlite3
import stat
from pathlib import Path

import psycopg

import nbqueue
from tests import templates


def test_a_copied_sqlite_template_is_a_fresh_private_queue(sqlite_template: Path, tmp_path: Path) -> None:
    first, second = tmp_path / "a.db", tmp_path / "b.db"
    templates.copy_sqlite_template(sqlite_template, first)
    templates.copy_sqlite_template(sqlite_template, second)
    assert stat.S_IMODE(os.stat(first).st_mode) == 0o600
    assert not Path(f"{first}-wal").exists()
    with nbqueue.Queue(first) as q:
        assert q.enqueue("one").id == 1
    with nbqueue.Queue(second) as q:
        assert sum(q.counts().values()) == 0
        assert q.enqueue("one").id == 1
    identities = [identity_rows(path) for path in (sqlite_template, first, second)]
    assert len({str(rows) for rows in identities}) == len(identities) or identities[0] == []


def identity_rows(path: Path) -> list[tuple[str]]:
    """The database's identity (nbqueue_info, from storage version 9 on), if it has one."""
    conn = sqlite3.connect(path)
    try:
        table = templates.IDENTITY_TABLE
        if conn.execute("SELECT 1 FROM sqlite_master WHERE name = ?", (table,)).fetchone() is None:
            return []
        return conn.execute(f"SELECT value FROM {table} WHERE name = 'identity'").fetchall()
    finally:
        conn.close()


def test_a_reused_postgres_schema_is_empty_and_counts_from_one(pg_schemas: templates.SchemaPool) -> None:
    """A schema handed back is emptied and handed out again. The pool drops one instead whenever
    it cannot be sure (a connection still leaving the server, a lock it waited for in vain), which
    a loaded machine makes happen now and then: so up to five rounds, of which one must reuse."""
    # Reuse needs the queue's backend gone from the server: give it all the time it takes.
    usual, pg_schemas.in_use_wait = pg_schemas.in_use_wait, 30
    try:
        for _ in range(5):
            schema = pg_schemas.take()
            with nbqueue.Queue(pg_schemas.url(schema)) as q:
                q.enqueue_many(["a", "b"])
                q.claim()
            pg_schemas.give_back(schema)
            again = pg_schemas.take()
            try:
                if again == schema:  # the same schema, reused
                    with nbqueue.Queue(pg_schemas.url(schema)) as q:
                        assert sum(q.counts().values()) == 0
                        assert q.jobs() == []
                        assert q.enqueue("c").id == 1
                    return
            finally:
                pg_schemas.give_back(again)
        raise AssertionError(
            f"five schemas given back in a row were dropped, none reused: {pg_schemas.drops[-5:]}"
        )
    finally:
        pg_schemas.in_use_wait = usual


def test_a_postgres_schema_a_test_changed_or_still_uses_is_dropped(pg_schemas: templates.SchemaPool) -> None:
    changed = pg_schemas.take()
    nbqueue.Queue(pg_schemas.url(changed)).close()
    with psycopg.connect(pg_schemas.server, autocommit=True) as conn:
        conn.execute(f'ALTER TABLE "{changed}".nbqueue_jobs DISABLE TRIGGER nbqueue_count_insert')
    pg_schemas.give_back(changed)
    used = pg_schemas.take()
    leaked = nbqueue.Queue(pg_schemas.url(used))  # a queue the test never closed
    # It never leaves: no need to wait the usual 2 s for it.
    usual, pg_schemas.in_use_wait = pg_schemas.in_use_wait, 0.1
    try:
        pg_schemas.give_back(used)
    finally:
        pg_schemas.in_use_wait = usual
        leaked.close()
    with psycopg.connect(pg_schemas.server) as conn:
        left = conn.execute(
            "SELECT nspname FROM pg_namespace WHERE nspname = ANY(%s)", ([changed, used],)
        ).fetchall()
    assert left == []
    assert changed not in pg_schemas.free and used not in pg_schemas.free
