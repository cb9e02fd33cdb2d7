"""The peers `make bench` measures nbqueue against: huey and litequeue (SQLite), procrastinate and
pgqueuer (PostgreSQL), each doing the same work as the nbqueue case it sits next to (same N, a
{"n": i} payload, a no-op task).

Every function returns ops/s, or None when the peer is not installed (the plain .venv has none of
them; `make bench` installs them into .venv-bench). Each asserts that all N jobs were written or
done, so a broken measurement fails loudly instead of reporting a rate for work that did not happen.
"""

from __future__ import annotations

import asyncio
import gc
import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

PEERS = ("huey", "litequeue", "procrastinate", "pgqueuer")
PGQ_ENTRYPOINT = "bench_noop"


def installed(peer: str) -> bool:
    return importlib.util.find_spec(peer) is not None


def versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for peer in PEERS:
        try:
            out[peer] = importlib.metadata.version(peer)
        except importlib.metadata.PackageNotFoundError:
            out[peer] = None
    return out


def rate(n: int, work: Callable[[], object]) -> float:
    """n / the seconds `work` takes, from a clean heap: the garbage left by the work before (the
    setup's objects, the last measurement's) is collected first, so a full collection it would
    have set off (20-40 ms, a tenth of a 3,000-job drain) does not land in this one's time."""
    gc.collect()
    start = time.perf_counter()
    work()
    return n / (time.perf_counter() - start)


# -- litequeue ------------------------------------------------------------------------------


def litequeue_enqueue(folder: Path, n: int) -> float | None:
    """`put` one message per call on a fresh file. litequeue's only durability: its connection is in
    autocommit (isolation_level=None, so each put is one single-row commit) and it sets
    journal_mode=WAL and synchronous=NORMAL itself (litequeue.py, LiteQueue.__init__); there is no
    option for FULL, so it sits next to nbqueue's synchronous="normal" case."""
    if not installed("litequeue"):
        return None
    from litequeue import LiteQueue

    q = LiteQueue(str(folder / f"litequeue-{time.monotonic_ns()}.db"))
    try:
        per_s = rate(n, lambda: [q.put(json.dumps({"n": i})) for i in range(n)])
        assert q.qsize() == n, (q.qsize(), n)
        return per_s
    finally:
        q.conn.close()


# -- huey (SqliteHuey) ------------------------------------------------------------------------


def huey_default_synchronous() -> int:
    """What SqliteHuey runs with when not told (fsync=None): it sets WAL and leaves synchronous at
    SQLite's compiled default, FULL (2) in most builds."""
    import sqlite3

    conn = sqlite3.connect(":memory:")
    try:
        return int(conn.execute("PRAGMA synchronous").fetchone()[0])
    finally:
        conn.close()


@contextmanager
def _huey(folder: Path, synchronous: str) -> Any:
    """A SqliteHuey on a fresh file with one no-op task. synchronous="full" is huey's own
    fsync=True (SqliteStorage runs `pragma synchronous=2` on its connection, which equals its default
    on a FULL build); "normal" sets synchronous=1 on the connection huey keeps (not a huey option,
    but what a user wanting NORMAL would do)."""
    from huey import SqliteHuey

    path = folder / f"huey-{time.monotonic_ns()}.db"
    huey = SqliteHuey(filename=str(path), fsync=True if synchronous == "full" else None)

    @huey.task(name="bench.noop")
    def noop(n: int = 0) -> None:
        return None

    huey.storage.conn.execute(f"PRAGMA synchronous = {2 if synchronous == 'full' else 1}")
    try:
        yield huey, noop
    finally:
        huey.storage.close()


def huey_enqueue(folder: Path, n: int, synchronous: str) -> float | None:
    """One no-op task call (an enqueue: one single-row commit in huey) per call."""
    if not installed("huey"):
        return None
    with _huey(folder, synchronous) as (huey, noop):
        per_s = rate(n, lambda: [noop(i) for i in range(n)])
        assert huey.pending_count() == n, (huey.pending_count(), n)
        return per_s


def huey_drain(folder: Path, n: int, synchronous: str) -> float | None:
    """n calls enqueued first (setup, synchronous=OFF), then drained in this process the way huey's
    consumer worker does it: `huey.dequeue()` (one commit that DELETEs the row: huey keeps no
    record of a running or finished job) then `huey.execute(task)` (revocation check; a None result
    is not stored, huey's default store_none=False)."""
    if not installed("huey"):
        return None
    with _huey(folder, synchronous) as (huey, noop):
        mode = huey.storage.conn.execute("PRAGMA synchronous").fetchone()[0]
        huey.storage.conn.execute("PRAGMA synchronous = OFF")
        for i in range(n):
            noop(i)
        huey.storage.conn.execute(f"PRAGMA synchronous = {mode}")
        assert huey.pending_count() == n
        done = 0

        def work() -> None:
            nonlocal done
            while (task := huey.dequeue()) is not None:
                huey.execute(task)
                done += 1

        per_s = rate(n, work)
        assert done == n and huey.pending_count() == 0, (done, n)
        assert huey.storage.conn.execute("PRAGMA synchronous").fetchone()[0] == mode
        return per_s


# -- PostgreSQL peers: each in a schema of its own, dropped afterwards -------------------------


@contextmanager
def _schema(server: str, prefix: str) -> Any:
    import psycopg

    schema = f"{prefix}_{time.monotonic_ns()}"
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    try:
        yield schema
    finally:
        with psycopg.connect(server, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def _count(server: str, schema: str, sql: str) -> int:
    import psycopg

    with psycopg.connect(server, autocommit=True, options=f"-c search_path={schema}") as conn:
        row = conn.execute(sql).fetchone()
        assert row is not None
        return int(row[0])


def _run_workers(folder: Path, name: str, script: str, args: list[str], processes: int) -> float:
    """Start `processes` worker processes at once; seconds until the last one exits."""
    path = folder / f"{name}.py"
    path.write_text(script)
    start = time.perf_counter()
    procs = [subprocess.Popen([sys.executable, str(path), *args]) for _ in range(processes)]
    for p in procs:
        assert p.wait(600) == 0, f"{name} worker exited with {p.returncode}"
    return time.perf_counter() - start


# procrastinate: a real worker (App.run_worker) per process, with its own connection pool; wait=False
# makes it exit once it has caught up with the queue.
PROCRASTINATE_WORKER = textwrap.dedent(
    """
    import logging, sys
    import procrastinate
    logging.getLogger("procrastinate").setLevel(logging.ERROR)  # "App is instantiated in __main__"
    app = procrastinate.App(connector=procrastinate.PsycopgConnector(
        conninfo=sys.argv[1], kwargs={"options": f"-c search_path={sys.argv[2]}"}))

    @app.task(name="bench.noop")
    async def noop(n=0):
        return None

    app.run_worker(wait=False, concurrency=int(sys.argv[3]), install_signal_handlers=False)
    """
)
# Two jobs at a time per worker process, as nbqueue's bench workers run two threads (procrastinate's
# default is 1, which drained ~25% slower here; 4 was no faster than 2).
PROCRASTINATE_CONCURRENCY = 2


def _procrastinate_app(server: str, schema: str) -> tuple[Any, Any]:
    import logging

    import procrastinate

    logging.getLogger("procrastinate").setLevel(logging.ERROR)

    connector = procrastinate.PsycopgConnector(
        conninfo=server, kwargs={"options": f"-c search_path={schema}"}
    )
    app = procrastinate.App(connector=connector)

    @app.task(name="bench.noop")
    async def noop(n: int = 0) -> None:
        return None

    app.open()
    app.schema_manager.apply_schema()
    return app, noop


def procrastinate_enqueue(server: str, n: int) -> float | None:
    """`task.defer(n=i)` one job per call, from sync code (its SyncPsycopgConnector's pool)."""
    if not installed("procrastinate"):
        return None
    with _schema(server, "bench_procrastinate") as schema:
        app, noop = _procrastinate_app(server, schema)
        try:
            per_s = rate(n, lambda: [noop.defer(n=i) for i in range(n)])
        finally:
            app.close()
        assert _count(server, schema, "SELECT count(*) FROM procrastinate_jobs WHERE status = 'todo'") == n
        return per_s


def procrastinate_drain(folder: Path, server: str, n: int, processes: int) -> float | None:
    """n no-op jobs deferred first (batch_defer), then drained by `processes` worker processes."""
    if not installed("procrastinate"):
        return None
    with _schema(server, "bench_procrastinate") as schema:
        app, noop = _procrastinate_app(server, schema)
        try:
            for start in range(0, n, 1000):
                noop.batch_defer(*({"n": i} for i in range(start, min(n, start + 1000))))
        finally:
            app.close()
        args = [server, schema, str(PROCRASTINATE_CONCURRENCY)]
        elapsed = _run_workers(folder, "procrastinate_worker", PROCRASTINATE_WORKER, args, processes)
        done = _count(server, schema, "SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'")
        assert done == n, (done, n)
        return n / elapsed


# pgqueuer: a QueueManager per process on its own asyncpg connection (pgqueuer's first driver: with
# its psycopg driver, the NOTIFY watcher holds the connection for up to 1 s at a time, which stalled
# a worker seconds per run), in drain mode (it exits once the queue is empty), its default batch
# size (10 jobs per dequeue).
PGQUEUER_WORKER = textwrap.dedent(
    """
    import asyncio, sys
    import asyncpg
    from pgqueuer import AsyncpgDriver, Queries, QueueManager
    from pgqueuer.types import QueueExecutionMode

    async def main():
        conn = await asyncpg.connect(sys.argv[1], server_settings={"search_path": sys.argv[2]})
        qm = QueueManager(Queries(AsyncpgDriver(conn)))

        @qm.entrypoint("bench_noop")
        async def noop(job):
            return None

        await qm.run(mode=QueueExecutionMode.drain)
        await conn.close()

    asyncio.run(main())
    """
)


def _pgqueuer_install(server: str, schema: str) -> None:
    import psycopg
    from pgqueuer import PsycopgDriver, Queries

    async def install() -> None:
        conn = await psycopg.AsyncConnection.connect(
            server, autocommit=True, options=f"-c search_path={schema}"
        )
        try:
            await Queries(PsycopgDriver(conn)).install()
        finally:
            await conn.close()

    asyncio.run(install())


@contextmanager
def _pgqueuer(server: str) -> Iterator[tuple[str, Any]]:
    """A fresh schema with pgqueuer's tables, and its SyncQueries on an autocommit connection."""
    import psycopg
    from pgqueuer.adapters.drivers.psycopg import SyncPsycopgDriver
    from pgqueuer.queries import SyncQueries

    with _schema(server, "bench_pgqueuer") as schema:
        _pgqueuer_install(server, schema)
        with psycopg.connect(server, autocommit=True, options=f"-c search_path={schema}") as conn:
            yield schema, SyncQueries(SyncPsycopgDriver(conn))


def pgqueuer_enqueue(server: str, n: int) -> float | None:
    """`SyncQueries.enqueue(entrypoint, payload)` one job per call on one autocommit connection."""
    if not installed("pgqueuer"):
        return None
    with _pgqueuer(server) as (schema, queries):
        per_s = rate(
            n, lambda: [queries.enqueue(PGQ_ENTRYPOINT, json.dumps({"n": i}).encode()) for i in range(n)]
        )
        assert _count(server, schema, "SELECT count(*) FROM pgqueuer WHERE status = 'queued'") == n
        return per_s


def pgqueuer_drain(folder: Path, server: str, n: int, processes: int) -> float | None:
    """n no-op jobs enqueued first (one batch enqueue), then drained by `processes` workers.
    pgqueuer deletes a finished job from its queue table and logs it to pgqueuer_log (buffered,
    flushed every batch_size jobs and when the worker exits); done = its 'successful' log rows."""
    if not installed("pgqueuer"):
        return None
    with _pgqueuer(server) as (schema, queries):
        payloads = [json.dumps({"n": i}).encode() for i in range(n)]
        queries.enqueue([PGQ_ENTRYPOINT] * n, list(payloads), [0] * n)
        elapsed = _run_workers(folder, "pgqueuer_worker", PGQUEUER_WORKER, [server, schema], processes)
        done = _count(server, schema, "SELECT count(*) FROM pgqueuer_log WHERE status = 'successful'")
        left = _count(server, schema, "SELECT count(*) FROM pgqueuer")
        assert done == n and left == 0, (done, left, n)
        return n / elapsed


def server_reachable(server: str) -> bool:
    try:
        import psycopg
    except ImportError:
        return False
    try:
        psycopg.connect(server, connect_timeout=3).close()
    except psycopg.Error:
        return False
    return True


if __name__ == "__main__":  # a quick look at one peer: python benchmarks/peers.py
    import tempfile

    pg = os.environ.get("NBQUEUE_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")
    with tempfile.TemporaryDirectory() as tmp:
        f = Path(tmp)
        print("versions", versions())
        print("litequeue enqueue", litequeue_enqueue(f, 300))
        print("huey enqueue normal/full", huey_enqueue(f, 300, "normal"), huey_enqueue(f, 100, "full"))
        print("huey drain normal/full", huey_drain(f, 300, "normal"), huey_drain(f, 100, "full"))
        print("procrastinate enqueue", procrastinate_enqueue(pg, 200))
        print("pgqueuer enqueue", pgqueuer_enqueue(pg, 200))
        for procs in (1, 2, 4):
            print(procs, "procrastinate drain", procrastinate_drain(f, pg, 500, procs))
            print(procs, "pgqueuer drain", pgqueuer_drain(f, pg, 500, procs))
