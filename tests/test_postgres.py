"""PostgreSQL only: many worker processes, a killed worker, a dropped connection, the extra."""

from __future__ import annotations

import gc
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import warnings
from collections import Counter
from pathlib import Path

import psycopg
import pytest

import nbqueue
from nbqueue.storage import NewJob
from tests.helpers import run_cli, wait_until

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}

WORKER = textwrap.dedent(
    """
    import os, sys, time
    import nbqueue

    q = nbqueue.Queue(sys.argv[1])
    log = open(sys.argv[2], "a", buffering=1)

    @q.task(name="record")
    def record(n, sleep=0.0):
        time.sleep(sleep)
        log.write(f"{n}\\n")
        return n

    w = q.worker(concurrency=2, lease=float(sys.argv[3]))
    w.start()
    while not os.path.exists(sys.argv[4]):
        time.sleep(0.05)
    w.stop()
    """
)


def start_workers(tmp_path: Path, url: str, n: int, lease: float = 5.0) -> list[subprocess.Popen[bytes]]:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    return [
        subprocess.Popen(
            [
                sys.executable,
                str(script),
                url,
                str(tmp_path / f"log{i}.txt"),
                str(lease),
                str(tmp_path / "stop"),
            ],
            env=ENV,
            stderr=subprocess.PIPE,
        )
        for i in range(n)
    ]


def stop_all(tmp_path: Path, procs: list[subprocess.Popen[bytes]]) -> list[str]:
    (tmp_path / "stop").touch()
    errors = []
    for p in procs:
        try:
            _, err = p.communicate(timeout=30)
            errors.append(err.decode())
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    return errors


@pytest.mark.slow
def test_four_worker_processes_complete_every_job_exactly_once(pg_url: str, tmp_path: Path) -> None:
    q = nbqueue.Queue(pg_url)
    record = q.task(name="record")(lambda n, sleep=0.0: n)
    ids = q.enqueue_many([{"args": [i], "kwargs": {}} for i in range(10_000)])  # raw: not runnable
    assert len(ids) == 10_000
    jobs = [record.enqueue(i) for i in range(200)]  # plus the real task jobs, one by one
    backoff = json.dumps(q.backoff.to_dict())
    q.manager.storage.insert(  # and 10,000 runnable ones in one transaction
        [
            NewJob("default", "record", f'{{"args":[{i}],"kwargs":{{}}}}', 0, None, 3, 0, None, backoff)
            for i in range(200, 10_200)
        ]
    )
    procs = start_workers(tmp_path, pg_url, 4)
    try:
        q.wait(jobs, timeout=120, progress=False)
        deadline = time.monotonic() + 120
        while q.counts()["completed"] < 10_200 and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        errors = stop_all(tmp_path, procs)
    assert q.counts() == {
        **dict.fromkeys(
            ["running", "failed", "dead", "cancelled", "blocked", "upstream_failed", "waiting"], 0
        ),
        "pending": 10_000,
        "completed": 10_200,
    }
    seen = Counter(int(line) for i in range(4) for line in (tmp_path / f"log{i}.txt").read_text().split())
    assert sorted(seen) == list(range(10_200))
    assert set(seen.values()) == {1}, "a job ran twice"
    assert sum(1 for i in range(4) if (tmp_path / f"log{i}.txt").read_text()) >= 2, "the work was not shared"
    assert not any("Traceback" in e for e in errors), errors


@pytest.mark.slow
def test_a_killed_worker_process_loses_no_job(pg_url: str, tmp_path: Path) -> None:
    q = nbqueue.Queue(pg_url)
    record = q.task(name="record")(lambda n, sleep=0.0: n)
    job = record.schedule(args=(1,), kwargs={"sleep": 30})
    [victim] = start_workers(tmp_path, pg_url, 1, lease=1.0)
    try:
        deadline = time.monotonic() + 30
        while q.get(job.id).status != "running" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert q.get(job.id).status == "running"
        victim.send_signal(signal.SIGKILL)
        victim.wait(10)
    finally:
        if victim.poll() is None:
            victim.kill()
    record.fn = lambda n, sleep=0.0: n  # the new worker has a fast handler
    with q.worker(lease=1.0):
        done = q.wait([job], timeout=30, progress=False)[0]
    assert done.status == "completed"
    assert done.attempts == 2
    # Recovered as a lost attempt (its process gone) or, had its lease run out first, an expired lease.
    assert done.error is not None and ("is gone" in done.error or "lease expired" in done.error)


@pytest.mark.slow
def test_a_dropped_connection_is_made_again_and_the_queue_finishes(pg_url: str, pg_server: str) -> None:
    q = nbqueue.Queue(pg_url)

    @q.task(name="slowish")
    def slowish(n: int) -> int:
        time.sleep(0.01)
        return n

    jobs = [slowish.enqueue(i) for i in range(300)]
    schema = pg_url.rsplit("schema=", 1)[1]
    with q.worker(concurrency=2), psycopg.connect(pg_server, autocommit=True) as admin:
        for _ in range(5):  # terminate this queue's connections, again and again
            time.sleep(0.15)
            killed = admin.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = %s",
                (f"nbqueue:{schema}",),
            ).fetchone()
            assert killed is not None and killed[0] >= 1
        done = q.wait(jobs, timeout=60, progress=False)
    assert {j.status for j in done} == {"completed"}
    assert [j.value for j in done] == list(range(300))


def test_time_comes_from_the_server(pg_url: str) -> None:
    q = nbqueue.Queue(pg_url)
    assert q.manager.storage.server_clock is True
    job = q.enqueue({"n": 1})
    with psycopg.connect(pg_url.split("?", maxsplit=1)[0]) as conn:
        (server_now,) = conn.execute("SELECT now()").fetchone()  # type: ignore[misc]
    assert abs((job.created_at - server_now).total_seconds()) < 5


def test_cli_works_on_a_postgres_url(pg_url: str) -> None:
    q = nbqueue.Queue(pg_url)
    q.enqueue({"n": 1})
    done = run_cli("stats", pg_url, "--json")
    assert done.returncode == 0, done.stderr
    assert '"pending": 1' in done.stdout


def test_the_board_reads_a_postgres_queue(pg_url: str) -> None:
    from nbqueue.jupyter.views import DeadLetterView, JobBoard

    q = nbqueue.Queue(pg_url)
    q.enqueue({"n": 1}, max_retries=0)
    job = q.claim()
    assert job is not None
    q.fail(job, "boom")
    board, view = JobBoard(q, interval=0), DeadLetterView(q, interval=0)
    try:
        assert board.counts["dead"] == 1 and [j.id for j in board.rows] == [job.id]
        view.requeue_all.click()
        assert q.get(job.id).status == "pending"
    finally:
        board.close()
        view.close()


def test_schemas_keep_queues_apart(pg_server: str, pg_url: str) -> None:
    other = pg_url + "x"
    try:
        a, b = nbqueue.Queue(pg_url), nbqueue.Queue(other)
        a.enqueue({"n": 1})
        assert a.counts()["pending"] == 1 and b.counts()["pending"] == 0
    finally:
        with psycopg.connect(pg_server, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{other.split("schema=")[1]}" CASCADE')


def test_import_without_psycopg_works_and_a_url_names_the_extra(pg_url: str, tmp_path: Path) -> None:
    (tmp_path / "psycopg.py").write_text("raise ImportError('psycopg is not installed')\n")
    code = (
        "import nbqueue\n"
        "try:\n"
        f"    nbqueue.Queue({pg_url!r})\n"
        "except nbqueue.MissingDependency as exc:\n"
        "    print(exc)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
        env={**ENV, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"},
    )
    assert "pip install 'nbqueue[postgres]'" in done.stdout


@pytest.mark.slow  # 150 threads, one after another
def test_short_lived_threads_share_the_queue_s_few_connections(pg_url: str) -> None:
    """150 short-lived threads each enqueue once: more than the server's 100 slots would allow if
    each thread kept a connection of its own; they take turns on the queue's idle one."""
    q = nbqueue.Queue(pg_url)
    for i in range(150):
        thread = threading.Thread(target=q.enqueue, args=({"i": i},))
        thread.start()
        thread.join()
    assert q.counts()["pending"] == 150
    assert len(q.manager.storage._all) <= 2  # type: ignore[attr-defined]
    q.close()


def test_worker_runs_reuse_the_queue_s_connections(pg_url: str) -> None:
    """Each run_until_idle starts fresh runner and keeper threads; they take the connections the
    last ones gave back instead of each opening its own (a new backend costs the server ~5 ms)."""
    q = nbqueue.Queue(pg_url)

    @q.task(name="reuse.echo")
    def echo(n: int) -> int:
        return n

    backends: set[int] = set()
    schema = pg_url.rsplit("schema=", 1)[1]
    with psycopg.connect(pg_url.split("?", maxsplit=1)[0], autocommit=True) as admin:
        for cycle in range(6):
            jobs = [echo.enqueue(cycle * 10 + i) for i in range(5)]
            with q.worker(concurrency=2) as worker:
                worker.run_until_idle()
                rows = admin.execute(
                    "SELECT pid FROM pg_stat_activity WHERE application_name = %s", (f"nbqueue:{schema}",)
                ).fetchall()
                backends |= {pid for (pid,) in rows}
            assert [q.get(j.id).value for j in jobs] == [cycle * 10 + i for i in range(5)]
    # The kernel thread's, two runners', the keeper's and the listener's at most, once each.
    assert len(backends) <= 5, f"{len(backends)} backends over 6 worker runs"
    q.close()


def test_schema_names_are_counted_in_utf8_bytes(pg_server: str) -> None:
    """PostgreSQL cuts identifiers at 63 bytes: two longer names that share those bytes would open
    one schema. 33 characters of two bytes each are 66 bytes: refused, however few characters."""
    stem = "é" * 31  # 62 bytes
    for name in (stem + "ab", stem + "ac", "ü" * 32):
        with pytest.raises(nbqueue.InvalidArgument, match="1 to 63 bytes"):
            nbqueue.Queue(f"{pg_server}?schema={name}")
    longest = stem + "a"  # 63 bytes: the longest name, kept whole
    try:
        with nbqueue.Queue(f"{pg_server}?schema={longest}") as q:
            q.enqueue({"n": 1})
        with psycopg.connect(pg_server) as conn:
            found = conn.execute(
                "SELECT count(*) FROM information_schema.schemata WHERE schema_name = %s", (longest,)
            ).fetchone()
        assert found == (1,)
    finally:
        with psycopg.connect(pg_server, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{longest}" CASCADE')


def test_a_queue_dropped_without_close_closes_its_connections(pg_url: str) -> None:
    """A notebook that opens its queue again (q = Queue(url) in a cell run twice) drops the old
    one: once collected, its connections are closed (no backend left, no psycopg warning)."""
    schema = pg_url.rsplit("schema=", 1)[1]
    q = nbqueue.Queue(pg_url)
    q.enqueue({"n": 1})
    with q.worker() as worker:
        worker.run_until_idle()
    with psycopg.connect(pg_url.split("?", maxsplit=1)[0], autocommit=True) as admin:

        def ours() -> int:
            row = admin.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", (f"nbqueue:{schema}",)
            ).fetchone()
            return int(row[0]) if row else 0

        assert ours() >= 1
        gc.collect()  # what earlier tests of this process dropped is not this test's to judge
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            del q, worker
            gc.collect()
        assert not [w for w in caught if issubclass(w.category, ResourceWarning)], [
            str(w.message) for w in caught
        ]
        wait_until(lambda: ours() == 0, 10, "the dropped queue's backends gone")
