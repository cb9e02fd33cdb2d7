"""Jobs that wait, across processes and schema versions, on both backends: two worker processes
resume a job once, a worker killed while its job waits loses nothing, process mode waits, and a
queue written before waits existed (schema 11) opens and waits.

Real worker processes, SIGKILL, real SQLite files and the real PostgreSQL server. The
in-process contract is in tests/test_waits.py.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql as pg_sql

import nbqueue
from nbqueue import Queue
from nbqueue.storage import postgres_queries, sqlite_queries
from tests.helpers import MakeQueue, wait_until
from tests.test_migrations import postgres_at, sqlite_at

ROOT = Path(__file__).resolve().parents[1]
OLD = 11  # the schema version written by the code before jobs could wait


def child_env() -> dict[str, str]:
    """A child Python that imports this checkout of nbqueue."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


def marks(path: Path) -> Counter[str]:
    """The lines the handlers wrote (one per call), counted."""
    return Counter(path.read_text().splitlines()) if path.exists() else Counter()


# A worker process whose handler records a step, waits for "go", and marks each run that got
# past the wait; it works until its stdin closes.
WAITER = textwrap.dedent(
    """
    import os, sys
    import nbqueue

    q = nbqueue.Queue(sys.argv[1])
    path = sys.argv[2]

    def mark(text):
        with open(path, "a") as file:
            file.write(text + "\\n")
        return text

    @q.task(name="wp.waiter", max_retries=3)
    def waiter(n):
        nbqueue.step("before", mark, f"before {n}")
        value = nbqueue.wait_for("go")
        mark(f"after {n}")
        return [n, value, os.getpid()]

    with q.worker(concurrency=2, lease=10, idle_interval=0.05):
        print("ready", flush=True)
        sys.stdin.read()
    q.close()
    """
)


def start_waiter(target: str, path: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", WAITER, target, str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=child_env(),
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if line != "ready\n":
        proc.kill()
        raise AssertionError(f"the worker process did not start: {proc.communicate(timeout=30)[1]}")
    return proc


def stop(proc: subprocess.Popen[str]) -> str:
    """End a worker process (its stdin closed: it stops its worker), and return its stderr."""
    if proc.poll() is None:
        try:
            _, err = proc.communicate(timeout=30)
            return err
        except subprocess.TimeoutExpired:
            proc.kill()
    _, err = proc.communicate()
    return err


@pytest.mark.slow  # two Python processes start
def test_two_worker_processes_and_one_send_resume_each_job_once(
    queue_target: str, make_queue: MakeQueue, tmp_path: Path
) -> None:
    q = make_queue()
    waiter = q.task(name="wp.waiter")(lambda n: n)  # run by the children only
    jobs = [waiter.enqueue(n) for n in range(8)]
    path = tmp_path / "marks"
    procs = [start_waiter(queue_target, path) for _ in range(2)]
    try:
        wait_until(lambda: q.counts()["waiting"] == 8, 30, "all eight waiting")
        assert q.send_many(jobs, "go", "now") == 8  # one send each
        done = q.wait(jobs, timeout=30, progress=False)
    finally:
        errors = [stop(p) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], errors
    assert [j.status for j in done] == ["completed"] * 8
    assert [j.value[:2] for j in done] == [[n, "now"] for n in range(8)]
    seen = marks(path)
    assert seen == Counter({**{f"before {n}": 1 for n in range(8)}, **{f"after {n}": 1 for n in range(8)}})
    for job in jobs:
        assert list(q.attempts(job)["outcome"]) == ["suspended", "completed"]
        assert q.get(job.id).retries == 0
    assert {j.value[2] for j in done} <= {p.pid for p in procs}


@pytest.mark.slow  # a Python process starts and is killed
@pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL is POSIX")
def test_a_worker_killed_while_its_job_waits_loses_nothing(
    queue_target: str, make_queue: MakeQueue, tmp_path: Path
) -> None:
    q = make_queue()
    path = tmp_path / "marks"

    def mark(text: str) -> str:
        with open(path, "a") as file:
            file.write(text + "\n")
        return text

    @q.task(name="wp.waiter", max_retries=3)
    def waiter(n: int) -> list[Any]:  # the children's handler, run here after the kill
        nbqueue.step("before", mark, f"before {n}")
        value = nbqueue.wait_for("go")
        mark(f"after {n}")
        return [n, value, os.getpid()]

    job = waiter.enqueue(1)
    proc = start_waiter(queue_target, path)
    try:
        wait_until(lambda: q.get(job.id).status == "waiting", 30, "the job waiting")
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    finally:
        stop(proc)
    assert proc.returncode == -signal.SIGKILL
    assert q.recover() == 0  # nothing was running: nothing to recover
    waiting = q.get(job.id)
    assert waiting.status == "waiting" and waiting.lease_until is None
    with q.worker(lease=5, idle_interval=0.05) as worker:
        worker.run_until_idle(timeout=10)  # a new worker: the job still waits, untouched
        assert q.get(job.id).status == "waiting"
        assert q.send(job, "go", "later") is True
        assert job.result(timeout=10) == [1, "later", os.getpid()]
    assert marks(path) == Counter({"before 1": 1, "after 1": 1})  # the step ran once, in the child
    assert list(q.attempts(job)["outcome"]) == ["suspended", "completed"]
    assert q.get(job.id).retries == 0


@pytest.mark.slow  # child processes start per run
def test_process_mode_waits_and_resumes(queue: Queue, tmp_path: Path) -> None:
    path = tmp_path / "marks"

    def mark(text: str) -> str:
        with open(path, "a") as file:
            file.write(text + "\n")
        return text

    @queue.task(name="wp.process_mode", max_retries=3)
    def agent(n: int) -> list[Any]:
        nbqueue.step("before", mark, f"before {n}")
        answer = nbqueue.wait_for("review", prompt="ok?", choices=["yes", "no"])
        nbqueue.sleep("nap", 0)
        mark(f"after {n}")
        return [n, answer, os.getpid()]

    job = agent.enqueue(5)
    with queue.worker(lease=10, mode="process", idle_interval=0.05):
        wait_until(lambda: queue.get(job.id).status == "waiting", 30, "the job waiting")
        assert queue.get(job.id).waits_for == 'review: a person is asked \'ok?\' ("yes" or "no")'
        with pytest.raises(nbqueue.InvalidArgument):
            queue.send(job, "review", "maybe")
        assert queue.send(job, "review", "no") is True
        n, answer, pid = job.result(timeout=30)
    assert (n, answer) == (5, "no") and pid != os.getpid()
    assert marks(path) == Counter({"before 5": 1, "after 5": 1})
    assert list(queue.attempts(job)["outcome"]) == ["suspended", "completed"]


# -- a queue written before jobs could wait (schema 11) ---------------------------------------

# Migrations 1 to 11 are history (rules.ANY_STATE_V11_SQL): replayed, they write the schema the
# code before waits left, whose CHECK on status knows no 'waiting' (tests/test_migrations.py).


def check_old_queue_waits(q: Queue) -> None:
    """The old jobs run on the upgraded schema, and new jobs wait, keyed ones too."""
    assert q.get(1).payload == {"kept": True} and q.get(2).status == "dead"
    old = q.claim(lease=30)
    assert old is not None and old.id == 1
    q.complete(old, "ran")
    assert q.get(1).status == "completed"

    @q.task(name="wp.upgraded")
    def ask() -> Any:
        return nbqueue.wait_for("answer")

    job = ask.schedule(key="once")
    with q.worker(idle_interval=0.05) as worker:
        worker.run_until_idle(timeout=10)
        assert q.get(job.id).status == "waiting"  # the widened CHECK allows it
        assert q.counts()["waiting"] == 1
        assert ask.schedule(key="once").id == job.id  # the key's index counts waiting as unfinished
        assert q.send(job, "answer", "yes") is True
        assert job.result(timeout=10) == "yes"
    assert list(q.attempts(job)["outcome"]) == ["suspended", "completed"]
    assert q.requeue(2) == 1  # the old dead job comes back and runs
    again = q.claim(lease=30)
    assert again is not None and again.id == 2


def test_a_sqlite_file_of_schema_11_opens_and_its_jobs_can_wait(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    sqlite_at(path, OLD)
    conn = sqlite3.connect(path, isolation_level=None)
    with pytest.raises(sqlite3.IntegrityError):  # the old CHECK knows no 'waiting'
        conn.execute("UPDATE nbqueue_jobs SET status = 'waiting' WHERE id = 1")
    conn.close()
    with nbqueue.Queue(path) as q:
        check_old_queue_waits(q)
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == sqlite_queries.SCHEMA_VERSION >= 12
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        (table,) = conn.execute("SELECT sql FROM sqlite_master WHERE name = 'nbqueue_jobs'").fetchone()
        assert "status = 'waiting')" in table  # widened at 12, compared since 15
    finally:
        conn.close()
    fresh = tmp_path / "fresh.db"
    nbqueue.Queue(fresh).close()
    assert schema_of(path) == schema_of(fresh)  # upgraded = made new, to the letter


def schema_of(path: Path) -> list[tuple[str, str, str]]:
    conn = sqlite3.connect(path)
    try:
        rows = conn.execute("SELECT type, name, sql FROM sqlite_master WHERE sql IS NOT NULL ORDER BY name")
        return [(kind, name, " ".join(sql.split())) for kind, name, sql in rows]
    finally:
        conn.close()


STATUS_CHECKS = (
    "SELECT c.conname, pg_get_constraintdef(c.oid), c.convalidated FROM pg_constraint c "
    "JOIN pg_class t ON t.oid = c.conrelid JOIN pg_namespace n ON n.oid = t.relnamespace "
    "WHERE n.nspname = %s AND t.relname = 'nbqueue_jobs' AND c.contype = 'c'"
)


def test_a_postgres_schema_of_version_11_opens_and_its_jobs_can_wait(pg_server: str, pg_schema: str) -> None:
    postgres_at(pg_server, pg_schema, OLD)
    table = pg_sql.SQL("{}.nbqueue_jobs").format(pg_sql.Identifier(pg_schema))
    with psycopg.connect(pg_server, autocommit=True) as conn:
        with pytest.raises(psycopg.errors.CheckViolation):  # the old CHECK knows no 'waiting'
            conn.execute(pg_sql.SQL("UPDATE {} SET status = 'waiting' WHERE id = 1").format(table))
    with nbqueue.Queue(f"{pg_server}?schema={pg_schema}") as q:
        check_old_queue_waits(q)
    with psycopg.connect(pg_server, autocommit=True) as conn:
        (version,) = conn.execute(  # type: ignore[misc]
            pg_sql.SQL("SELECT version FROM {}.nbqueue_meta").format(pg_sql.Identifier(pg_schema))
        ).fetchone()
        assert version == postgres_queries.SCHEMA_VERSION >= 12
        checks = conn.execute(STATUS_CHECKS, (pg_schema,)).fetchall()
        assert [text for _, text, _ in checks if "status" in text and "'waiting'" in text], checks
        for name, _, _ in checks:  # every old row meets the widened CHECK
            conn.execute(
                pg_sql.SQL("ALTER TABLE {} VALIDATE CONSTRAINT {}").format(table, pg_sql.Identifier(name))
            )
