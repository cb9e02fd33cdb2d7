"""Migrated queues for the generic fixtures, made once per test process and handed out per test.

Building and migrating a queue costs ~20 ms on SQLite and 100-250 ms on PostgreSQL (the DDL of
every migration), hundreds of times a run. So:

- SQLite: one migrated, checkpointed template file per process, copied into each test's
  tmp_path (owner-only, as nbqueue makes its files), with a fresh database identity.
- PostgreSQL: `CREATE DATABASE ... TEMPLATE` costs more than a migration here (the DROP
  DATABASE after it forces a checkpoint), and a schema cannot be renamed (the trigger functions
  name their schema). So a test's schema is emptied after it and handed to the next test of the
  same process: rows deleted, sequences restarted, identity made anew. It is dropped instead
  whenever it might not be as fresh: a connection of nbqueue still on it, a lock held, or its
  definition changed by the test (compared with one freshly migrated schema).

Tests of creation and migration themselves use tmp_path or `pg_url`, which stay fresh.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import time
import uuid
from pathlib import Path
from typing import Any

import nbqueue

# The per-database identity rows (signed jobs cover it): a copy must not share its template's.
IDENTITY_TABLE = "nbqueue_info"


def make_sqlite_template(path: Path) -> None:
    """A migrated queue at `path`, checkpointed so that the file alone is the whole database."""
    nbqueue.Queue(str(path)).close()
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()
    for side in ("-wal", "-shm"):
        wal = Path(f"{path}{side}")
        assert not wal.exists() or wal.stat().st_size == 0, f"{wal} left beside the template"


def _has_identity(conn: sqlite3.Connection) -> bool:
    found = conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (IDENTITY_TABLE,))
    return found.fetchone() is not None


def copy_sqlite_template(template: Path, target: Path) -> None:
    """A copy of the template at `target` that nbqueue cannot tell from a queue it just made."""
    handle = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)  # as nbqueue's mkstemp
    with open(template, "rb") as source, os.fdopen(handle, "wb") as copy:
        shutil.copyfileobj(source, copy)
    conn = sqlite3.connect(target, isolation_level=None)
    try:
        if _has_identity(conn):
            conn.execute(
                f"UPDATE {IDENTITY_TABLE} SET value = lower(hex(randomblob(16))) WHERE name = 'identity'"
            )
    finally:
        conn.close()


# Everything a test could change in a schema's definition, for comparing it with a fresh one.
# Reached from the schema through indexes only (pg_depend, then by oid): the server's catalog
# tables can be large after many runs, and a scan of them costs tens of milliseconds.
# Every list is ordered by what it holds: the catalogs' own order changes as they are vacuumed.
_DEFINITION = """
WITH objects AS (
  SELECT classid, objid FROM pg_depend
  WHERE refclassid = 'pg_namespace'::regclass AND refobjid = %(ns)s),
rels AS (
  SELECT c.oid, c.relname, c.relkind, c.relowner, c.relacl, c.relrowsecurity FROM pg_class c
  WHERE c.oid IN (SELECT objid FROM objects WHERE classid = 'pg_class'::regclass))
SELECT concat_ws(E'\\n',
  (SELECT nspacl::text FROM pg_namespace WHERE oid = %(ns)s),
  (SELECT string_agg(concat_ws(' ', classid::regclass::text, objid), ','
      ORDER BY classid::regclass::text) FROM (
    SELECT classid, count(*) AS objid FROM objects GROUP BY classid) kinds),
  (SELECT string_agg(concat_ws(' ', r.relname, r.relkind, r.relowner, r.relacl::text, r.relrowsecurity,
      (SELECT string_agg(concat_ws(':', a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull,
          pg_get_expr(d.adbin, d.adrelid)), ',' ORDER BY a.attnum)
        FROM pg_attribute a LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
        WHERE a.attrelid = r.oid AND a.attnum > 0 AND NOT a.attisdropped),
      (SELECT string_agg(pg_get_indexdef(i.indexrelid), ',' ORDER BY pg_get_indexdef(i.indexrelid))
        FROM pg_index i WHERE i.indrelid = r.oid),
      (SELECT string_agg(concat_ws(' ', conname, pg_get_constraintdef(k.oid)), ',' ORDER BY conname)
        FROM pg_constraint k WHERE k.conrelid = r.oid),
      (SELECT string_agg(concat_ws(' ', t.tgenabled, pg_get_triggerdef(t.oid)), ',' ORDER BY t.tgname)
        FROM pg_trigger t WHERE t.tgrelid = r.oid),
      (SELECT string_agg(concat_ws(' ', polname, pg_get_expr(polqual, polrelid)), ',' ORDER BY polname)
        FROM pg_policy p WHERE p.polrelid = r.oid)), E'\\n' ORDER BY r.relname) FROM rels r),
  (SELECT string_agg(concat_ws(' ', proname, proowner, prosecdef, proconfig::text, proacl::text,
      prosrc), E'\\n' ORDER BY proname) FROM pg_proc
    WHERE oid IN (SELECT objid FROM objects WHERE classid = 'pg_proc'::regclass)))
"""


def _first_difference(found: str, expected: str) -> str:
    """Where two definitions part, with a little of each (to say why a schema was dropped)."""
    pairs = enumerate(zip(found, expected, strict=False))
    at = next((i for i, (a, b) in pairs if a != b), min(len(found), len(expected)))
    start = max(0, at - 40)
    return f"{found[start : at + 40]!r} where the reference has {expected[start : at + 40]!r}"


class SchemaPool:
    """Migrated PostgreSQL schemas of one test process, each used by one test at a time."""

    def __init__(self, server: str) -> None:
        self.server = server
        self.prefix = f"nbq_test_{uuid.uuid4().hex[:8]}_"  # per process: xdist workers never meet
        self.free: list[str] = []
        self.made: set[str] = set()
        self._conn: Any = None
        self.in_use_wait = 2.0  # seconds a connection of the test may take to leave the server
        self.drops: list[str] = []  # why each schema given back was dropped, not reused
        first = self._new_name()
        nbqueue.Queue(self.url(first)).close()  # the reference: what a fresh migration makes
        conn = self._admin()
        self.definition = self._definition(conn, first)
        self.meta = conn.execute(f'SELECT version FROM "{first}".nbqueue_meta').fetchall()
        # The same in every schema whose definition matches the reference's.
        self.tables = [
            name
            for (name,) in conn.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = %s ORDER BY 1", (first,)
            ).fetchall()
        ]
        self.sequences = conn.execute(
            "SELECT sequencename, start_value FROM pg_sequences WHERE schemaname = %s", (first,)
        ).fetchall()
        conn.commit()
        self.free.append(first)

    def _admin(self) -> Any:
        """The pool's own connection (one per process, kept: connecting costs more than the rest)."""
        import psycopg

        if self._conn is None or self._conn.closed or self._conn.broken:
            self._conn = psycopg.connect(self.server, application_name="nbqueue-tests-pool")
        return self._conn

    def _new_name(self) -> str:
        name = f"{self.prefix}{uuid.uuid4().hex[:12]}"
        self.made.add(name)
        return name

    def url(self, schema: str) -> str:
        return f"{self.server}?schema={schema}"

    @staticmethod
    def _definition(conn: Any, schema: str) -> str | None:
        row = conn.execute("SELECT oid FROM pg_namespace WHERE nspname = %s", (schema,)).fetchone()
        if row is None:
            return None
        # Defaults, indexes, triggers and functions name their schema: compare without it.
        return str(conn.execute(_DEFINITION, {"ns": row[0]}).fetchone()[0]).replace(schema, "{s}")

    def take(self) -> str:
        """A migrated, empty schema (or, if none is free, a new name the queue migrates on open)."""
        return self.free.pop() if self.free else self._new_name()

    def give_back(self, schema: str) -> None:
        """Empty the schema for the next test, or drop it if it might not be as fresh."""
        import psycopg

        try:
            unfit = self._recycle(self._admin(), schema)
        except psycopg.Error as e:
            unfit = f"{type(e).__name__}: {e}"
            self._admin().rollback()
        if unfit is None:
            self.free.append(schema)
            return
        self.drops.append(f"{schema}: {unfit}")
        conn = self._admin()
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        conn.commit()
        self.made.discard(schema)

    def _in_use(self, conn: Any, schema: str) -> bool:
        """Whether a connection of nbqueue is on the schema a moment after the test closed its own
        (a backend leaves pg_stat_activity shortly after its client has gone: in_use_wait s at
        most, then the schema is dropped, never reused)."""
        app = f"nbqueue:{schema}"[:63]
        deadline = time.monotonic() + self.in_use_wait
        while True:
            users = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", (app,))
            if not users.fetchone()[0]:
                return False
            conn.rollback()  # a new snapshot of pg_stat_activity
            if time.monotonic() > deadline:
                return True
            time.sleep(0.01)

    def _recycle(self, conn: Any, schema: str) -> str | None:
        """Delete every row the test left (in one transaction); why not, if the schema is not fit."""
        if self._in_use(conn, schema):
            conn.rollback()
            return "still in use (a leaked worker)"
        definition = self._definition(conn, schema)
        if definition != self.definition:
            conn.rollback()
            return (
                "never made"
                if definition is None
                else f"changed by the test: {_first_difference(definition, self.definition)}"
            )
        conn.execute("SET LOCAL lock_timeout = '1s'")
        conn.execute("SET LOCAL session_replication_role = replica")  # no triggers: rows only
        for table in self.tables:
            if table == IDENTITY_TABLE:
                conn.execute(
                    f'UPDATE "{schema}"."{table}" SET value = md5(random()::text || '
                    "clock_timestamp()::text) WHERE name = 'identity'"
                )
            elif table != "nbqueue_meta":
                conn.execute(f'DELETE FROM "{schema}"."{table}"')
        for sequence, start in self.sequences:
            conn.execute("SELECT setval(%s::regclass, %s, false)", (f'"{schema}"."{sequence}"', start))
        if conn.execute(f'SELECT version FROM "{schema}".nbqueue_meta').fetchall() != self.meta:
            conn.rollback()
            return "another storage version"
        conn.commit()
        return None

    def close(self) -> None:
        """Drop every schema this process made."""
        conn = self._admin()
        conn.rollback()
        for schema in sorted(self.made):
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        conn.commit()
        conn.close()
        self.made.clear()
        self.free.clear()
