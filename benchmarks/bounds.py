"""`make bounds`: where the time of the goals `make bench` misses goes, on the code as it is.

Three profiles, each a median over interleaved rounds (absolute times drift on shared machines;
compare the rows of one run):

1. One enqueue, layer by layer: a minimal INSERT, nbqueue's own INSERT run raw on its schema,
   the storage layer, and `Queue.enqueue`.
2. What nbqueue's schema costs per row, one row per commit and 100,000 in one `executemany`:
   the schema as it is, without the counts trigger, without the (status, id) index, without
   both. (The schema is changed on a scratch file only, to measure it.)
3. PostgreSQL drains: CPU per job in the worker processes and in the rest of the machine (the
   server's backends), nbqueue next to pgqueuer, 1, 2 and 4 processes.
4. The agent-shaped goals that stay short (agent_bounds.py): the fan-out's cascade and the wait
   cycle's phases, per job, next to a plain drain.
"""

from __future__ import annotations

import functools
import json
import os
import resource
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nbqueue.storage import NewJob

sys.path.insert(0, str(Path(__file__).resolve().parent))
import agent_bounds
import bench
import peers

LAYER_CALLS = 1_000
ROUNDS = 7
BULK_ROWS = 100_000
SCHEMA_CUTS = {
    "nbqueue's, as it is": [],
    "without the counts trigger": ["DROP TRIGGER nbqueue_count_insert"],
    "without the (status, id) index": ["DROP INDEX nbqueue_status"],
    "without both": ["DROP TRIGGER nbqueue_count_insert", "DROP INDEX nbqueue_status"],
}


def interleaved(cases: dict[str, Callable[[], float]], rounds: int = ROUNDS) -> dict[str, float]:
    """Each case's median over `rounds`, the cases taking turns within each round."""
    samples: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(rounds):
        for name, measure in cases.items():
            samples[name].append(measure())
    return {name: statistics.median(values) for name, values in samples.items()}


def enqueue_layers(folder: Path) -> dict[str, float]:
    """Microseconds per enqueue at each layer, all on files of the same kind."""
    raw = bench.raw_db(folder)
    q = bench.new_queue(folder)
    storage = q.manager.storage
    nbq = bench.schema_db(folder)  # nbqueue's schema, written to with plain sqlite3
    backoff = bench.BACKOFF

    def per_call(work: Callable[[int], object]) -> Callable[[], float]:
        def measure() -> float:
            start = time.perf_counter()
            for i in range(LAYER_CALLS):
                work(i)
            return (time.perf_counter() - start) / LAYER_CALLS * 1e6

        return measure

    def own_insert(i: int) -> None:
        stamp = bench.now_us()
        nbq.execute("BEGIN IMMEDIATE")
        nbq.execute(bench.SCHEMA_INSERT, (json.dumps({"n": i}), stamp, stamp, stamp))
        nbq.execute("COMMIT")

    try:
        return interleaved(
            {
                "raw minimal INSERT (claim index only, autocommit)": per_call(
                    lambda i: raw.execute(bench.RAW_INSERT, (json.dumps({"n": i}), bench.now_us()))
                ),
                "nbqueue's INSERT run raw on its schema": per_call(own_insert),
                "+ the storage layer (lock, transaction, wake-up)": per_call(
                    lambda i: storage.insert(
                        [NewJob("default", None, json.dumps({"n": i}), 0, None, 3, 0, None, backoff)]
                    )
                ),
                "q.enqueue (options, JSON checks, the Job returned)": per_call(lambda i: q.enqueue({"n": i})),
            }
        )
    finally:
        q.close()
        raw.close()
        nbq.close()


Variant = tuple[Callable[[], sqlite3.Connection], str, Callable[[int, int], tuple[Any, ...]]]


def schema_costs(folder: Path) -> dict[str, tuple[float, float]]:
    """Per table: (us per single-row commit, rows/s in one executemany)."""

    def schema(cuts: list[str]) -> Variant:
        def connect() -> sqlite3.Connection:
            conn = bench.schema_db(folder)  # a scratch file: the cuts are only for measuring
            for statement in cuts:
                conn.execute(statement)
            return conn

        return connect, bench.SCHEMA_INSERT, lambda i, stamp: (json.dumps({"n": i}), stamp, stamp, stamp)

    raw: Variant = (
        lambda: bench.raw_db(folder),
        bench.RAW_INSERT,
        lambda i, stamp: (json.dumps({"n": i}), stamp),
    )
    variants = {"the raw table (4 KiB pages)": raw} | {name: schema(c) for name, c in SCHEMA_CUTS.items()}

    def single(variant: Variant) -> Callable[[], float]:
        def measure() -> float:
            connect, statement, row = variant
            conn, values = connect(), [row(i, bench.now_us()) for i in range(LAYER_CALLS)]
            start = time.perf_counter()
            for value in values:
                conn.execute(statement, value)
            conn.close()
            return (time.perf_counter() - start) / LAYER_CALLS * 1e6

        return measure

    def bulk(variant: Variant) -> Callable[[], float]:
        def measure() -> float:
            connect, statement, row = variant
            conn, values = connect(), [row(i, bench.now_us()) for i in range(BULK_ROWS)]
            start = time.perf_counter()
            conn.execute("BEGIN IMMEDIATE")
            conn.executemany(statement, values)
            conn.execute("COMMIT")
            conn.close()
            return BULK_ROWS / (time.perf_counter() - start)

        return measure

    singles = interleaved({name: single(v) for name, v in variants.items()})
    bulks = interleaved({name: bulk(v) for name, v in variants.items()}, rounds=3)
    return {name: (singles[name], bulks[name]) for name in variants}


def cpu_busy() -> float:
    """Seconds of CPU the whole machine has spent busy (all cores), from /proc/stat."""
    with open("/proc/stat") as stat:
        fields = [int(x) for x in stat.readline().split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def nbqueue_drain(folder: Path, n: int, processes: int) -> float:
    return bench.postgres_drain(folder, bench.PG_SERVER, n, processes)[0]


def pg_cpu(folder: Path, n: int = 5_000) -> list[tuple[str, int, float, float, float]]:
    """(who, processes, jobs/s, worker CPU us/job, rest-of-machine CPU us/job), medians of 2."""
    out = []
    for processes in (1, 2, 4):
        drains: dict[str, Callable[[], float | None]] = {
            "nbqueue": functools.partial(nbqueue_drain, folder, n, processes),
            "pgqueuer": functools.partial(peers.pgqueuer_drain, folder, bench.PG_SERVER, n, processes),
        }
        samples: dict[str, list[tuple[float, float, float]]] = {who: [] for who in drains}
        for _ in range(2):
            for who, drain in drains.items():
                kids, machine = children_cpu(), cpu_busy()
                per_s = drain()
                if per_s is None:
                    continue
                kids, machine = children_cpu() - kids, cpu_busy() - machine
                samples[who].append((per_s, kids / n * 1e6, (machine - kids) / n * 1e6))
        for who, got in samples.items():
            if got:
                per_s, kids, rest = (statistics.median(sample[i] for sample in got) for i in range(3))
                out.append((who, processes, per_s, kids, rest))
    return out


def main() -> int:
    print(f"nbqueue bounds, {time.strftime('%Y-%m-%d %H:%M')}, SQLite {sqlite3.sqlite_version}")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        print(f"\none enqueue, synchronous normal (us per call, medians of {ROUNDS} interleaved rounds):")
        for name, us in enqueue_layers(folder).items():
            print(f"  {name:55s} {us:7.1f}")
        print(f"\nnbqueue's schema: us per single-row commit; rows/s in one executemany of {BULK_ROWS:,}:")
        for name, (us, per_s) in schema_costs(folder).items():
            print(f"  {name:55s} {us:7.1f} us {per_s:>10,.0f}/s")
        if peers.server_reachable(bench.PG_SERVER) and peers.installed("pgqueuer"):
            print(
                f"\nPostgreSQL drain of 5,000 no-op jobs, CPU per job (us), medians of 2 ({bench.PG_SERVER}):"
            )
            for who, processes, per_s, kids, rest in pg_cpu(folder):
                print(
                    f"  {who:9s} {processes} process(es) {per_s:7,.0f}/s  workers {kids:5.0f}  "
                    f"server and the rest {rest:5.0f}  total {kids + rest:5.0f}"
                )
        agent_bounds.report(folder)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
