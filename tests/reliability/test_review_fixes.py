"""Findings of the independent review that are not about signing or passwords, one test each.

A foreign SQLite file is refused untouched; error text is capped and listings
read only what they show; a mixed-case PostgreSQL schema works; the draft file
of a new queue cannot be planted; a hand-written row never reaches the board's
HTML unescaped; the CLI range-checks --grace; processes that spell one
PostgreSQL queue differently hear each other's wake-ups; and the PostgreSQL
default keeps the server's own durability.
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql as pg_sql

import nbqueue
from nbqueue import Queue
from nbqueue.payload import MAX_TEXT
from tests.helpers import run_cli, wait_until


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("journal", ["delete", "wal"])
def test_a_foreign_sqlite_file_is_refused_byte_for_byte_untouched(tmp_path: Path, journal: str) -> None:
    path = tmp_path / "theirs.db"
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA journal_mode = {journal}")
    conn.execute("CREATE TABLE notes (body TEXT)")
    conn.execute("INSERT INTO notes VALUES ('mine')")
    conn.commit()
    conn.close()
    before = sorted(p.name for p in tmp_path.iterdir())
    snapshot = digest(path)
    with pytest.raises(nbqueue.NotAQueueDatabase):
        Queue(path)
    assert digest(path) == snapshot
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no -wal or -shm left beside it
    with sqlite3.connect(path) as check:
        assert check.execute("PRAGMA journal_mode").fetchone()[0] == journal


def test_a_text_file_is_refused_untouched(tmp_path: Path) -> None:
    path = tmp_path / "notes.db"
    path.write_text("not a database at all\n" * 100)
    snapshot = digest(path)
    with pytest.raises(nbqueue.NotAQueueDatabase):
        Queue(path)
    assert digest(path) == snapshot
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.db"]


def test_huge_error_text_is_capped_head_and_tail(queue: Queue) -> None:
    job = queue.enqueue({"n": 1}, max_retries=0)
    claim = queue.claim()
    assert claim is not None
    message = "HEAD-" + "x" * (10 * 1024 * 1024) + "-TAIL"  # 10 MB of exception text
    output = "start " + "y" * (5 * 1024 * 1024) + " end"
    assert queue.fail(claim, message, output=output) == "dead"
    stored = queue.get(job.id)
    assert stored.error is not None and len(stored.error) <= MAX_TEXT + 100
    assert stored.error.startswith("HEAD-") and stored.error.endswith("-TAIL")
    assert "characters cut" in stored.error
    assert stored.output is not None and len(stored.output) <= MAX_TEXT + 100
    assert stored.output.endswith(" end")


def test_listings_read_only_what_they_show(queue: Queue) -> None:
    big = "z" * (2 * 1024 * 1024)
    jobs = [queue.enqueue({"blob": big, "i": i}, max_retries=0) for i in range(3)]
    for _ in jobs:
        claim = queue.claim()
        assert claim is not None
        queue.fail(claim, "E" * 50_000 + "\nValueError: the last line")
    brief = queue.jobs(status="dead", brief=True)
    assert [j.id for j in brief] == [j.id for j in reversed(jobs)]
    for job in brief:
        assert job.payload is None and job.output is None and job.result_json is None
        assert job.error is not None and len(job.error) <= 2000
        assert job.error.endswith("ValueError: the last line")
    assert queue.get(jobs[0].id).payload["blob"] == big  # one job, whole, on demand


def test_a_mixed_case_schema_is_its_own(pg_server: str) -> None:
    schema = f"SecMixed_{uuid.uuid4().hex[:6]}"
    try:
        with Queue(f"{pg_server}?schema={schema}") as q:
            job = q.enqueue({"n": 1})
        with Queue(f"{pg_server}?schema={schema}") as again:  # the ownership check passes
            assert again.get(job.id).payload == {"n": 1}
        with psycopg.connect(pg_server) as conn:
            found = conn.execute("SELECT count(*) FROM pg_namespace WHERE nspname = %s", (schema,)).fetchone()
        assert found == (1,)  # exactly that name, case kept
    finally:
        with psycopg.connect(pg_server, autocommit=True) as conn:
            conn.execute(pg_sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(pg_sql.Identifier(schema)))


def test_a_planted_file_at_the_old_draft_name_changes_nothing(tmp_path: Path) -> None:
    """The draft of a new queue file had a predictable name; a file planted there raised FileExistsError."""
    path = tmp_path / "jobs.db"
    planted = [
        tmp_path / f"jobs.db.{os.getpid()}.{threading.get_ident()}.new",
        tmp_path / f"{path}.{os.getpid()}.{threading.get_ident()}.new",
    ]
    for p in planted:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text("planted")
    with Queue(path) as q:
        assert q.enqueue({"n": 1}).id == 1
    assert all(p.read_text() == "planted" for p in planted)
    assert not any(p.name.endswith(".new") and p not in planted for p in tmp_path.iterdir())


def test_a_hand_written_row_never_reaches_the_board_unescaped(tmp_path: Path) -> None:
    from nbqueue.jupyter.views import JobBoard

    path = tmp_path / "jobs.db"
    with Queue(path) as q:
        q.enqueue({"n": 1})
        with sqlite3.connect(path) as conn:  # SQLite columns take text where numbers belong
            conn.execute(
                "INSERT INTO nbqueue_jobs (status, queue, task, payload, priority, max_retries, attempts, "
                "run_at, created_at, updated_at) VALUES ('pending', '<b>q</b>', '<script>t()</script>', "
                "'{', '<img src=x onerror=alert(1)>', 3, '<i>2</i>', 0, 0, 0)"
            )
        board = JobBoard(q, interval=0)
        try:
            html = board.table.value
            assert "<script>" not in html and "<img" not in html and "<i>2</i>" not in html
            assert "&lt;script&gt;" in html and "&lt;b&gt;q&lt;/b&gt;" in html
            assert len(board.rows) == 2  # the damaged row is listed, not hidden, and not fatal
        finally:
            board.close()
        frame = q.history()
        assert len(frame) == 2


@pytest.mark.parametrize("grace", ["20000w", "200y", "1e400"])
def test_the_cli_refuses_a_grace_out_of_range(tmp_path: Path, grace: str) -> None:
    done = run_cli("worker", str(tmp_path / "jobs.db"), "--grace", grace)
    assert done.returncode == 2, done.stderr
    assert "--grace" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.fixture
def two_spellings(pg_server: str) -> Iterator[tuple[str, str]]:
    """One PostgreSQL queue named by two URLs that differ in text, not in meaning."""
    schema = f"nbq_spell_{uuid.uuid4().hex[:8]}"
    first = f"{pg_server}?schema={schema}"
    second = first.replace("127.0.0.1", "localhost").replace("postgres@", "postgres@") + "&connect_timeout=7"
    assert first != second
    yield first, second
    with psycopg.connect(pg_server, autocommit=True) as conn:
        conn.execute(pg_sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(pg_sql.Identifier(schema)))


@pytest.mark.slow
def test_processes_spelling_one_queue_differently_hear_each_others_wake_ups(
    two_spellings: tuple[str, str],
) -> None:
    first, second = two_spellings
    producer, consumer = Queue(first), Queue(second)
    started: list[float] = []

    @consumer.task(name="spell.note")
    def note() -> None:
        started.append(time.monotonic())

    try:
        with consumer.worker(lease=5):
            time.sleep(1.0)  # the worker is idle and listening
            delays = []
            for _ in range(5):
                started.clear()
                sent = time.monotonic()
                producer.manager.intake.enqueue_call(note, (), {}, {})
                wait_until(lambda: started, 5, "the job started")
                delays.append(started[0] - sent)
                time.sleep(0.6)
        # Without the shared channel an idle worker notices only at its 0.5 s recheck.
        assert sorted(delays)[2] < 0.2, delays
    finally:
        producer.close()
        consumer.close()


def test_postgres_keeps_the_servers_durability_by_default(pg_url: str) -> None:
    """synchronous="normal" used to set synchronous_commit=off: a server crash lost acknowledged jobs."""
    with psycopg.connect(pg_url.split("?", maxsplit=1)[0]) as conn:
        server_default = conn.execute("SHOW synchronous_commit").fetchone()
    for synchronous, expected in (("normal", server_default[0] if server_default else "on"), ("full", "on")):
        with Queue(pg_url, synchronous=synchronous) as q:  # type: ignore[arg-type]
            q.enqueue({"n": 1})
            with psycopg.connect(pg_url.split("?", maxsplit=1)[0], autocommit=True) as admin:
                rows = admin.execute(
                    "SELECT setting FROM pg_settings WHERE name = 'synchronous_commit'"
                ).fetchall()
            assert rows  # the admin's view; the queue's own connection is checked below
            own = q.manager.storage._conn().execute("SHOW synchronous_commit").fetchone()  # type: ignore[attr-defined]
            assert own is not None and own[0] == expected, (synchronous, own)
