"""A worker survives any row or setting, on both backends.

A row or a limit written by hand (a BLOB where text belongs, a `limits` column that is not
JSON, a limits row that `Queue.limit` would refuse, a rate whose schedule outgrows 64 bits)
must never stop a runner: the job it spoils goes dead saying why, every other job runs, and
`worker.running` tells the truth. Limits that the claim cannot compute are refused when they
are set or enqueued. A runner that dies of an error nbqueue did not foresee is logged, with
its traceback, and replaced. Rows are written by hand through plain sqlite3 or psycopg.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Callable
from typing import Any

import pytest

import nbqueue
from nbqueue import Queue
from tests.helpers import wait_until
from tests.reliability.conftest import Records

# A runner thread that dies is a failure, not a warning: the worker would go on with fewer
# runners (or none) while `worker.running` stays true.
pytestmark = pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")


def write_by_hand(target: str, statement: str, params: tuple[Any, ...] = ()) -> None:
    """One statement on the queue's own tables, past nbqueue (`?` placeholders)."""
    if target.startswith("postgresql://"):
        import psycopg

        server, schema = target.split("?schema=")
        with psycopg.connect(server, autocommit=True) as conn:
            conn.execute(f'SET search_path TO "{schema}"'.encode())
            conn.execute(statement.replace("?", "%s").encode(), params)
        return
    conn = sqlite3.connect(target)
    try:
        with conn:
            conn.execute(statement, params)
    finally:
        conn.close()


def dead_reason(q: Queue, job_id: int) -> str:
    dead = q.dead_letters()
    assert job_id in set(dead["id"]), f"job {job_id} is not dead: {q.counts()}"
    return str(dead.loc[job_id, "error"])


def run_around(q: Queue, done: Callable[[], bool], what: str, concurrency: int = 2) -> None:
    """Work the queue until `done`, checking the worker keeps every runner all the while."""
    worker = q.worker(concurrency=concurrency, lease=5).start()
    try:
        wait_until(lambda: done() or not worker.running, timeout=20, what=what)
        assert worker.running, "a runner died"
        assert done(), what
    finally:
        assert worker.stop(timeout=5)
    assert not worker.running


# -- hostile job rows ----------------------------------------------------------------------------

# (backend, column, value as written, what the dead job's error names). A BLOB cannot be
# stored in PostgreSQL's TEXT columns, so those are SQLite's alone.
ROWS = [
    ("sqlite", "payload", "blob", "cannot be read"),
    ("sqlite", "signature", "blob", "cannot be read"),
    *[(b, "limits", "not json", "limits column") for b in ("sqlite", "postgres")],
    *[(b, "limits", '{"k": "x"}', "limits column") for b in ("sqlite", "postgres")],
    *[(b, "limits", "[1, 2]", "limits column") for b in ("sqlite", "postgres")],
]


@pytest.mark.parametrize(
    ("backend", "column", "value", "named"),
    [pytest.param(*row, id=f"{row[0]}-{row[1]}-{row[2]}") for row in ROWS],
)
def test_a_worker_survives_a_row_that_spoils_its_claim(
    queue_target: str, column: str, value: str, named: str, records: Records
) -> None:
    """Before: a payload as a BLOB reached the claim's `MARK in payload` as bytes (TypeError), a
    `limits` column that is not JSON raised JSONDecodeError in the storage's claim: the runner
    thread died, `worker.running` stayed true, and the other jobs waited."""
    with Queue(queue_target) as q:
        q.limit("k", concurrency=5)

        @q.task(name="survival.echo", max_retries=0)
        def echo(text: str) -> str:
            return text

        bad = echo.schedule(["SPOIL-ME"], limits=["k"], priority=10)  # the first in line
        good = [echo.enqueue(f"fine {i}") for i in range(3)]
        good += [echo.schedule([f"held {i}"], limits=["k"]) for i in range(3)]
        if value == "blob":
            write_by_hand(
                queue_target,
                f"UPDATE nbqueue_jobs SET {column} = CAST(payload AS BLOB) WHERE id = ?",
                (bad.id,),
            )
        else:
            write_by_hand(queue_target, f"UPDATE nbqueue_jobs SET {column} = ? WHERE id = ?", (value, bad.id))
        run_around(q, lambda: q.counts()["completed"] == 6 and q.counts()["dead"] == 1, "the 6 good jobs ran")
        assert [q.get(j.id).value for j in good] == [
            *(f"fine {i}" for i in range(3)),
            *(f"held {i}" for i in range(3)),
        ]
        why = dead_reason(q, bad.id)
        assert f"job {bad.id}" in why and named in why, why
        assert q.counts()["running"] == 0


# -- hostile limits rows ---------------------------------------------------------------------------

# (backend, column, value, what the dead job's error names). PostgreSQL's INTEGER and BIGINT
# columns refuse text: those are SQLite's alone.
LIMIT_ROWS = [
    *[(b, "concurrency", 0, "concurrency") for b in ("sqlite", "postgres")],
    *[(b, "concurrency", -3, "concurrency") for b in ("sqlite", "postgres")],
    ("sqlite", "concurrency", "x", "concurrency"),
    *[(b, "rate", -1.0, "rate") for b in ("sqlite", "postgres")],
    ("postgres", "rate", float("nan"), "rate"),
    ("postgres", "burst", float("inf"), "burst"),
    ("sqlite", "rate", "x", "rate"),
    ("sqlite", "tat", "x", "TAT"),
    ("sqlite", "paused_until", 1.5, "pause"),
]


@pytest.mark.parametrize(
    ("backend", "column", "value", "named"),
    [pytest.param(*row, id=f"{row[0]}-{row[1]}-{row[2]}") for row in LIMIT_ROWS],
)
def test_a_damaged_limit_stops_only_its_own_jobs(
    queue_target: str, column: str, value: object, named: str, records: Records
) -> None:
    """Before: one limits row that `Queue.limit` would refuse made every claim raise (jobs with
    no limits too, since a claim under limits weighs them all): InvalidArgument backed off for
    ever, text raised a raw ValueError that killed the runner. Now the jobs holding that key go
    dead saying which limit to set again; the jobs without it run."""
    with Queue(queue_target) as q:
        q.limit("k", concurrency=5, rate="100/s")
        q.limit("ok", concurrency=2)

        @q.task(name="survival.echo", max_retries=0)
        def echo(text: str) -> str:
            return text

        spoiled = [echo.schedule([f"k {i}"], limits=["k"], priority=10) for i in range(3)]
        plain = [echo.enqueue(f"plain {i}") for i in range(3)]
        limited = [echo.schedule([f"ok {i}"], limits={"ok": 2}) for i in range(3)]
        write_by_hand(queue_target, f"UPDATE nbqueue_limits SET {column} = ? WHERE key = 'k'", (value,))
        counts = q.counts
        run_around(q, lambda: counts()["completed"] == 6 and counts()["dead"] == 3, "the 6 good jobs ran")
        assert [q.get(j.id).value for j in plain + limited] == [
            *(f"plain {i}" for i in range(3)),
            *(f"ok {i}" for i in range(3)),
        ]
        for job in spoiled:
            why = dead_reason(q, job.id)
            assert "limit 'k'" in why and named in why and "q.limit('k'" in why, why
        q.limit("k", concurrency=5, rate="100/s")  # set again: its jobs run once requeued
        assert q.requeue([j.id for j in spoiled]) == 3
        run_around(q, lambda: counts()["completed"] == 9, "the requeued jobs ran")


# -- limits the claim cannot compute -----------------------------------------------------------------


def test_limits_the_claim_cannot_compute_are_refused(queue: Queue) -> None:
    """Before: `q.limit("k", rate="0.1/h")` and `limits={"k": 999_999_998}` were both accepted,
    and the first claim's TAT (3.6e19 µs) overflowed 64 bits: a raw OverflowError on SQLite,
    "bigint out of range" backed off for ever on PostgreSQL. A rate of at least 1/h with units
    and burst under 10^9 keeps every TAT within 64 bits; concurrency must fit an INTEGER."""
    for rate in ("0.1/h", "0.5/hour", "0.0002/s", "0.01/m"):
        with pytest.raises(nbqueue.InvalidArgument, match="slower than 1/h"):
            queue.limit("k", rate=rate)
    for concurrency in (0, 10**9 + 1, 2**31, True, 1.5):
        with pytest.raises(nbqueue.InvalidArgument, match="concurrency"):
            queue.limit("k", concurrency=concurrency)  # type: ignore[arg-type]
    for burst in (-1, 10**9, float("nan"), float("inf")):
        with pytest.raises(nbqueue.InvalidArgument, match="burst"):
            queue.limit("k", rate="1/h", burst=burst)
    for units in (0, 10**9, 2**63, -1):
        with pytest.raises(nbqueue.InvalidArgument, match="units"):
            queue.enqueue({}, limits={"k": units})
    assert queue.limits().empty
    assert queue.counts()["pending"] == 0


def test_the_largest_limits_allowed_are_computed_without_overflow(queue: Queue, records: Records) -> None:
    """The slowest rate, the largest burst and the largest units that are accepted: two starts
    fit the burst, the third waits (its next start is some 114,000 years away), and no claim
    raised."""
    queue.limit("k", rate="1/h", burst=999_999_999, concurrency=10**9)

    @queue.task(name="survival.echo")
    def echo(n: int) -> int:
        return n

    jobs = [echo.schedule([i], limits={"k": 999_999_999}) for i in range(3)]
    worker = queue.worker(concurrency=1, lease=5).start()
    try:
        wait_until(lambda: queue.counts()["completed"] == 2, timeout=20, what="two starts in the burst")
        assert worker.running
    finally:
        assert worker.stop(timeout=5)
    assert [queue.get(j.id).status for j in jobs] == ["completed", "completed", "pending"]
    [row] = queue.limits().to_dict("records")
    assert row["next_start_in"] > 3e12  # seconds: the third start is far, not overflowed
    assert not [r for r in records.since(0) if "claim failed" in r.getMessage()]


@pytest.mark.parametrize("rate", [1e-5, 1e-300])
def test_a_hand_written_rate_whose_schedule_overflows_kills_only_its_jobs(
    queue_target: str, rate: float, records: Records
) -> None:
    """A rate below 1/h written by hand, with units that would move the key's TAT past 2^63:
    the job holding them goes dead saying so, the others run (before: OverflowError killed the
    runner on SQLite; PostgreSQL's "bigint out of range" failed every claim, backing off for ever)."""
    with Queue(queue_target) as q:
        q.limit("k", rate="1/h")
        write_by_hand(queue_target, "UPDATE nbqueue_limits SET rate = ? WHERE key = 'k'", (rate,))

        @q.task(name="survival.echo")
        def echo(text: str) -> str:
            return text

        big = echo.schedule(["big"], limits={"k": 999_999_998}, priority=10)
        small = echo.schedule(["small"], limits={"k": 1}) if rate > 1e-200 else None
        plain = [echo.enqueue(f"plain {i}") for i in range(3)]
        want = 3 + (small is not None)
        run_around(q, lambda: q.counts()["completed"] == want and q.counts()["dead"] == 1, "the others ran")
        why = dead_reason(q, big.id)
        assert "limit 'k'" in why and "64-bit" in why, why
        assert [q.get(j.id).status for j in plain] == ["completed"] * 3
        assert not [r for r in records.since(0) if "claim failed" in r.getMessage()]


# -- a runner that dies ---------------------------------------------------------------------------------


class Unlisted(dict[str, Any]):
    """A result whose JSON encoding raises what no encoder error is: an error nbqueue did not
    foresee, in the runner's own code (recording an outcome), not in the handler."""

    def items(self) -> Any:
        raise RuntimeError("items() refused")


def test_a_runner_that_crashes_is_logged_and_restarted(queue: Queue, records: Records) -> None:
    """Before: the runner thread died of the RuntimeError, its job stayed running until its
    lease ran out, the worker (one runner) took nothing more, and `worker.running` stayed true.
    Now: the crash is logged with its traceback, the job fails with it (dead: no retries), a
    new runner takes the old one's place, and the other jobs run."""

    @queue.task(name="survival.odd", max_retries=0)
    def odd() -> dict[str, Any]:
        return Unlisted(a=1)

    @queue.task(name="survival.echo")
    def echo(text: str) -> str:
        return text

    crasher = odd.schedule(priority=10)
    after = [echo.enqueue(f"after {i}") for i in range(3)]
    worker = queue.worker(concurrency=1, lease=30).start()
    try:
        wait_until(lambda: queue.counts()["completed"] == 3, timeout=20, what="the jobs after the crash ran")
        assert worker.running
        assert worker.status()["running"]
        runners = [t for t in worker._threads if t.name != "nbqueue-keeper"]
        assert len(runners) == 1 and all(t.is_alive() for t in runners)
    finally:
        assert worker.stop(timeout=5)
    assert not worker.running
    why = dead_reason(queue, crasher.id)
    assert "RuntimeError: items() refused" in why, why
    crashes = [r for r in records.since(0, logging.ERROR) if "crashed" in r.getMessage()]
    assert len(crashes) == 1, [r.getMessage() for r in records.since(0)]
    assert crashes[0].exc_info is not None and "items() refused" in str(crashes[0].exc_info[1])
    assert [queue.get(j.id).value for j in after] == [f"after {i}" for i in range(3)]
