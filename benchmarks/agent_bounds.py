"""`make bounds`, part 4: where the agent-shaped goals that stay short spend their time.

Each shape is drained by one worker thread, as in `bench.py --only agents`, with timers put
around the functions that make it differ from a plain drain (time inside them, per job; a timer
costs ~1 µs a call). The fastest of interleaved rounds, each part on its own (as the bench takes
each side's best run: a neighbour's burst slows a run, never speeds one), on the code as it is:

- the fan-out + fan-in: the cascade (`storage.cascade.resolve`), the root's release of its N
  leaves (one `UNBLOCK_GROUP`) apart from the join's count-down, once per batch of leaves;
- the wait cycle (`wait_for` + `send_many` + resume): each phase next to a plain drain, and inside
  them the wait's read (with the batch's claim, `sqlite._peeked`, once the task is known to wait;
  `peek_waits` before that), its reach (`Inbox.reach`), the suspensions written with each batch
  (`waits.suspend_all`) and the sends (`storage.send`).
"""

from __future__ import annotations

import gc
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import bench

from nbqueue import inbox
from nbqueue.storage import cascade, sql, statements, waits
from nbqueue.storage import sqlite as sqlite_storage

N = 3_000
ROUNDS = 7
SEND_CHUNK = 500


@contextmanager
def timed(spent: Counter[str], targets: dict[str, tuple[Any, str]]) -> Iterator[None]:
    """Add the seconds spent inside each target (label -> (owner, attribute)) to `spent`."""
    originals = {label: getattr(owner, name) for label, (owner, name) in targets.items()}

    def wrapped(label: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def run(*args: Any, **kwargs: Any) -> Any:
            began = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[label] += time.perf_counter() - began

        return run

    for label, (owner, name) in targets.items():
        setattr(owner, name, wrapped(label, originals[label]))
    try:
        yield
    finally:
        for label, (owner, name) in targets.items():
            setattr(owner, name, originals[label])


def drain_seconds(q: Any) -> float:
    with q.worker(concurrency=1, lease=60) as worker:
        gc.collect()
        began = time.perf_counter()
        worker.run_until_idle()
        return time.perf_counter() - began


def plain(folder: Path) -> dict[str, float]:
    with bench.fresh_queue(folder) as q:
        bench.fill(q, N)
        return {"plain drain": drain_seconds(q)}


def fan_out(folder: Path) -> dict[str, float]:
    spent: Counter[str] = Counter()
    released: list[float] = []  # the statements that release leaves (the root's, all at once)
    run = statements.Tx.__call__

    def call(tx: statements.Tx, statement: str, params: statements.Params) -> list[statements.Row]:
        if statement != tx.sql.UNBLOCK_GROUP:
            return run(tx, statement, params)
        began = time.perf_counter()
        try:
            return run(tx, statement, params)
        finally:
            released.append(time.perf_counter() - began)

    with bench.fresh_queue(folder) as q:
        step = q.task(name="bench.step")(bench.noop)
        with q.workflow("fan"):
            root = step.enqueue()
            step.schedule(after=[step.schedule(after=[root]) for _ in range(N - 2)])
        statements.Tx.__call__ = call  # type: ignore[method-assign]
        try:
            with timed(spent, {"  cascade (storage.cascade.resolve)": (cascade, "resolve")}):
                spent["fan-out drain"] = drain_seconds(q)
        finally:
            statements.Tx.__call__ = run  # type: ignore[method-assign]
    cascaded = spent.pop("  cascade (storage.cascade.resolve)")
    return {
        "fan-out drain": spent["fan-out drain"],
        "  cascade (storage.cascade.resolve)": cascaded,
        "    the root's leaves released (UNBLOCK_GROUP)": sum(released),
        "    the join counted down, once per batch": cascaded - sum(released),
    }


def wait_cycle(folder: Path) -> dict[str, float]:
    spent: Counter[str] = Counter()
    targets = {
        "    the wait's read, with the claim (_peeked)": (sqlite_storage, "_peeked"),
        "    the wait's read, alone (peek_waits)": (sql.SqlStorage, "peek_waits"),
        "    reaching it (Inbox.reach, with the read)": (inbox.Inbox, "reach"),
        "    suspensions written (suspend_all)": (waits, "suspend_all"),
    }
    with bench.fresh_queue(folder) as q, timed(spent, targets):
        q.task(name=bench.WAITS)(bench.waits)
        ids = bench.fill(q, N, bench.WAITS)
        with q.worker(concurrency=1, lease=60) as worker:
            gc.collect()
            began = time.perf_counter()
            worker.run_until_idle()
            suspended = time.perf_counter()
            for start in range(0, N, SEND_CHUNK):
                q.send_many(ids[start : start + SEND_CHUNK], "go", 1)
            sent = time.perf_counter()
            worker.run_until_idle()
            spent["wait cycle"] = time.perf_counter() - began
    return {
        "wait cycle": spent["wait cycle"],
        "  drain into waiting": suspended - began,
        "  send_many by 500": sent - suspended,
        "  drain of the resumptions": spent["wait cycle"] - (sent - began),
        "  inside them:": 0.0,
        **{label: spent[label] for label in targets},
    }


def agent_bounds(folder: Path, rounds: int = ROUNDS) -> dict[str, float]:
    """Microseconds per job in each part, the fastest of `rounds` interleaved rounds."""
    samples: dict[str, list[float]] = {}
    for _ in range(rounds):
        for measure in (plain, fan_out, wait_cycle):
            for label, seconds in measure(folder).items():
                samples.setdefault(label, []).append(seconds / N * 1e6)
    return {label: min(values) for label, values in samples.items()}


def report(folder: Path) -> None:
    print(f"\nagent shapes that stay short, SQLite, {N:,} jobs, us per job (the fastest of {ROUNDS} rounds):")
    figures = agent_bounds(folder)
    base = figures["plain drain"]
    for label, us in figures.items():
        whole = not label.startswith(" ") and label != "plain drain"  # a shape, not a part of one
        figure = f"{us:7.1f}" if us else ""
        print(f"  {label:45s} {figure:>7}  " + (f"{base / us:5.2f}x a plain drain" if whole else ""))
