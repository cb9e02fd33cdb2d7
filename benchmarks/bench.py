"""`make bench`: nbqueue next to raw sqlite3 doing the same work, in the same run.

Absolute times drift on shared machines, so every figure is reported as a
ratio to raw SQLite measured moments before, on the same kind of file.
Each figure is the median of several runs.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import nbqueue

RAW_SCHEMA = """
CREATE TABLE jobs (id INTEGER PRIMARY KEY AUTOINCREMENT, status TEXT NOT NULL, queue TEXT NOT NULL,
    payload TEXT NOT NULL, priority INTEGER NOT NULL, run_at INTEGER NOT NULL, attempts INTEGER NOT NULL
    DEFAULT 0, lease_until INTEGER, result TEXT, updated_at INTEGER);
CREATE INDEX jobs_claim ON jobs (queue, priority DESC, run_at, id) WHERE status = 'pending';
"""
RAW_INSERT = (
    "INSERT INTO jobs (status, queue, payload, priority, run_at) VALUES ('pending', 'default', ?, 0, ?)"
)
RAW_CLAIM = (
    "UPDATE jobs SET status = 'running', attempts = attempts + 1, lease_until = ? WHERE id = ("
    "SELECT id FROM jobs WHERE status = 'pending' AND queue = 'default' AND run_at <= ? "
    "ORDER BY priority DESC, run_at, id LIMIT 1) RETURNING id"
)
RAW_COMPLETE = "UPDATE jobs SET status = 'completed', result = ?, updated_at = ? WHERE id = ?"


def raw_db(folder: Path, synchronous: str = "NORMAL") -> sqlite3.Connection:
    conn = sqlite3.connect(folder / f"raw-{time.monotonic_ns()}.db", isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute(f"PRAGMA synchronous = {synchronous}")
    conn.executescript(RAW_SCHEMA)
    return conn


def now_us() -> int:
    return int(time.time() * 1e6)


def rate(n: int, work: Callable[[], None]) -> float:
    start = time.perf_counter()
    work()
    return n / (time.perf_counter() - start)


# -- the measurements: each returns (nbqueue ops/s, raw ops/s) ----------------------


def enqueue_one(folder: Path, n: int, synchronous: str) -> tuple[float, float]:
    conn = raw_db(folder, synchronous.upper())

    def raw() -> None:
        for i in range(n):
            conn.execute(RAW_INSERT, (json.dumps({"n": i}), now_us()))

    raw_rate = rate(n, raw)
    q = nbqueue.Queue(folder / f"nb-{time.monotonic_ns()}.db", synchronous=synchronous)  # type: ignore[arg-type]
    nb_rate = rate(n, lambda: [q.enqueue({"n": i}) for i in range(n)] and None)
    q.close()
    conn.close()
    return nb_rate, raw_rate


def enqueue_many(folder: Path, n: int) -> tuple[float, float]:
    conn = raw_db(folder)

    def raw() -> None:
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany(RAW_INSERT, [(json.dumps({"n": i}), now_us()) for i in range(n)])
        conn.execute("COMMIT")

    raw_rate = rate(n, raw)
    q = nbqueue.Queue(folder / f"nb-{time.monotonic_ns()}.db")
    nb_rate = rate(n, lambda: q.enqueue_many([{"n": i} for i in range(n)]) and None)
    q.close()
    conn.close()
    return nb_rate, raw_rate


def drain(folder: Path, n: int, threads: int, synchronous: str = "normal") -> tuple[float, float]:
    conn = raw_db(folder, synchronous.upper())
    conn.execute("BEGIN IMMEDIATE")
    conn.executemany(RAW_INSERT, [(json.dumps({"n": i}), 0) for i in range(n)])
    conn.execute("COMMIT")

    def raw() -> None:
        while True:
            conn.execute("BEGIN IMMEDIATE")
            row = conn.execute(RAW_CLAIM, (now_us() + 60_000_000, now_us())).fetchone()
            conn.execute("COMMIT")
            if row is None:
                return
            conn.execute(RAW_COMPLETE, ("null", now_us(), row[0]))

    raw_rate = rate(n, raw)
    q = nbqueue.Queue(folder / f"nb-{time.monotonic_ns()}.db", synchronous=synchronous)  # type: ignore[arg-type]

    @q.task(name="bench.noop")
    def noop(n: int) -> None:
        return None

    q.storage.insert(
        [
            q._new_job(
                "bench.noop",
                json.dumps({"args": [i], "kwargs": {}}),
                "default",
                3,
                None,
                None,
                0,
                None,
                None,
                q._default_backoff,
            )
            for i in range(n)
        ],
        q._now(),
    )
    worker = q.worker(concurrency=threads, lease=60)
    nb_rate = rate(n, worker.run_until_idle)
    assert q.counts()["completed"] == n
    q.close()
    conn.close()
    return nb_rate, raw_rate


def claim_rate(folder: Path, pending: int, claims: int = 2000) -> float:
    """Claims per second (claim + complete) with `pending` jobs waiting."""
    q = nbqueue.Queue(folder / f"claim-{pending}-{time.monotonic_ns()}.db")
    for start in range(0, pending + claims, 50_000):
        q.enqueue_many([{"n": i} for i in range(start, min(pending + claims, start + 50_000))])

    def work() -> None:
        for _ in range(claims):
            job = q.claim(lease=60)
            assert job is not None
            q.complete(job)

    result = rate(claims, work)
    q.close()
    return result


def median_of(runs: int, measure: Callable[[], tuple[float, float]]) -> tuple[float, float, float]:
    samples = [measure() for _ in range(runs)]
    ratios = [nb / raw for nb, raw in samples]
    return (
        statistics.median(s[0] for s in samples),
        statistics.median(s[1] for s in samples),
        statistics.median(ratios),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--n", type=int, default=3000, help="jobs per throughput run")
    parser.add_argument("--json", type=Path, help="write every figure here")
    args = parser.parse_args(argv)
    rows: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory(prefix="nbqueue-bench-") as tmp:
        folder = Path(tmp)
        cases: list[tuple[str, Callable[[], tuple[float, float]]]] = [
            ("enqueue, synchronous normal", lambda: enqueue_one(folder, args.n, "normal")),
            ("enqueue, synchronous full", lambda: enqueue_one(folder, max(200, args.n // 10), "full")),
            ("enqueue_many", lambda: enqueue_many(folder, args.n * 10)),
            ("drain, 1 thread", lambda: drain(folder, args.n, 1)),
            ("drain, 4 threads", lambda: drain(folder, args.n, 4)),
            ("drain, full, 1 thread", lambda: drain(folder, max(200, args.n // 10), 1, "full")),
        ]
        print(f"{'measure':<30} {'nbqueue/s':>12} {'raw/s':>12} {'ratio':>7}")
        for name, measure in cases:
            nb, raw, ratio = median_of(args.runs, measure)
            rows.append({"measure": name, "nbqueue_per_s": nb, "raw_per_s": raw, "ratio": ratio})
            print(f"{name:<30} {nb:>12,.0f} {raw:>12,.0f} {ratio:>6.2f}x", flush=True)
        small = statistics.median(claim_rate(folder, 1_000) for _ in range(args.runs))
        big = statistics.median(claim_rate(folder, 100_000) for _ in range(args.runs))
        rows.append({"measure": "claim+complete/s at 1k pending", "nbqueue_per_s": small})
        rows.append({"measure": "claim+complete/s at 100k pending", "nbqueue_per_s": big})
        print(f"{'claim+complete at 1k pending':<30} {small:>12,.0f}")
        print(f"{'claim+complete at 100k pending':<30} {big:>12,.0f} {'':>12} {big / small:>6.2f}x of 1k")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
