"""PostgreSQL only: the network and the server fail under a queue, through a real TCP proxy.

Queues under test connect through `tests/reliability/proxy.py` (their URL's host:port
is the proxy's), which forwards to the real server and, on demand, drops every
connection, refuses new ones for a while (a restarting server), or loses the reply
to one statement after the server has committed it. Checks read the truth directly
from the server, never through the proxy.

None of these faults has a SQLite twin: SQLite has no connection or server to lose.

The lost-reply tests pin what a statement whose answer never came back must not do:
write twice, strand a claimed job, or report a committed completion as a lost lease.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlsplit

import psycopg
import pytest
from psycopg import sql

import nbqueue
from nbqueue import Queue
from tests.helpers import QUICK_RETRY, wait_until
from tests.reliability.conftest import Records
from tests.reliability.proxy import Proxy

# What the client's message carries, for the proxy to lose the answer to it.
INSERT = b"INSERT INTO nbqueue_jobs"
CLAIM = b"UPDATE nbqueue_jobs SET status = 'running'"
COMPLETE = b"UPDATE nbqueue_jobs SET status = 'completed'"
# A worker's batch: its successes (and, in the same statement, its next claims).
BATCH = b"SET status = 'completed', result = d.result"
LEASE = 1.0  # seconds: short, so that a stranded claim shows within the test

# A worker thread that dies of a fault is a failure, not a warning: the worker would go on
# with fewer threads (or none) while `worker.running` stays true.
pytestmark = pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")


def assert_nbqueue_error(exc: BaseException) -> None:
    """An error a caller can catch as NbqueueError, raised by nbqueue itself (not psycopg)."""
    kind = f"{type(exc).__module__}.{type(exc).__qualname__}"
    assert isinstance(exc, nbqueue.NbqueueError), f"raw {kind} escaped: {exc}"
    assert type(exc).__module__.startswith("nbqueue"), kind


def outcome_of(call: Callable[[], Any]) -> Any:
    """What `call` returns, or the exception it raises."""
    try:
        return call()
    except Exception as exc:
        return exc


class Truth:
    """The queue's jobs as the server has them, over a connection of its own (no proxy)."""

    def __init__(self, server: str, schema: str) -> None:
        self.conn = psycopg.connect(server, autocommit=True)
        self.table = sql.Identifier(schema, "nbqueue_jobs")

    def rows(self) -> dict[int, dict[str, Any]]:
        query = sql.SQL("SELECT id, status, attempts, error, payload, result FROM {} ORDER BY id").format(
            self.table
        )
        found = self.conn.execute(query).fetchall()
        names = ("id", "status", "attempts", "error", "payload", "result")
        return {int(r[0]): dict(zip(names, r, strict=True)) for r in found}

    def by_status(self) -> Counter[str]:
        query = sql.SQL("SELECT status, count(*) FROM {} GROUP BY status").format(self.table)
        return Counter({str(s): int(n) for s, n in self.conn.execute(query).fetchall()})

    def finished(self, n: int) -> bool:
        counts = self.by_status()
        return counts["completed"] + counts["dead"] + counts["cancelled"] == n

    def close(self) -> None:
        self.conn.close()


@pytest.fixture
def proxy(pg_server: str) -> Iterator[Proxy]:
    parts = urlsplit(pg_server)
    with Proxy((parts.hostname or "127.0.0.1", parts.port or 5432)) as running:
        yield running


@pytest.fixture
def truth(pg_server: str, pg_url: str) -> Iterator[Truth]:
    seen = Truth(pg_server, pg_url.rsplit("schema=", 1)[1])
    yield seen
    seen.close()


@pytest.fixture
def through(pg_url: str, proxy: Proxy) -> Iterator[Callable[..., Queue]]:
    """Open Queues on the test's schema through the proxy; each is closed at teardown."""
    opened: list[Queue] = []

    def make(**options: Any) -> Queue:
        q = Queue(proxy.url(pg_url), **options)
        opened.append(q)
        return q

    yield make
    for q in opened:
        q.close()


class Calls:
    """How many times each job's handler ran."""

    def __init__(self) -> None:
        self.counter: Counter[int] = Counter()
        self._guard = threading.Lock()

    def add(self, n: int) -> None:
        with self._guard:
            self.counter[n] += 1


def assert_each_ran_once_or_after_a_lost_lease(truth: Truth, ids: dict[int, int], calls: Calls) -> None:
    """Every job completed, none lost or dead; a handler ran more than once only for a job
    whose lease expired in between (at-least-once delivery, and only then)."""
    rows = truth.rows()
    assert sorted(rows) == sorted(ids), "jobs were lost or written twice"
    ended = Counter(row["status"] for row in rows.values())
    assert ended == Counter({"completed": len(ids)}), f"not every job completed: {dict(ended)}"
    for job_id, n in ids.items():
        row = rows[job_id]
        assert json.loads(row["result"]) == n
        ran = calls.counter[n]
        assert ran >= 1, f"job {job_id} completed without its handler running"
        if ran > 1:
            assert (row["error"] or "").startswith("lease expired"), (
                f"job {job_id} ran {ran} times though its lease never expired ({row['error']!r})"
            )
            assert row["attempts"] >= ran


# -- the connection is lost, the server restarts ---------------------------------------------


@pytest.mark.slow
def test_a_lost_connection_under_a_draining_worker_loses_no_job(
    through: Callable[..., Queue], proxy: Proxy, truth: Truth
) -> None:
    """Every connection dropped again and again while a worker drains 500 jobs: every job
    completes, none twice unless its lease expired, none dead because of the drops.
    (No SQLite twin: SQLite has no connection or server to lose.)"""
    q = through()
    calls = Calls()

    @q.task(name="net.record", max_retries=3, backoff=QUICK_RETRY)
    def record(n: int) -> int:
        calls.add(n)
        time.sleep(0.003)
        return n

    ids = {record.enqueue(i).id: i for i in range(500)}
    worker = q.worker(concurrency=2, lease=2).start()
    try:
        hits = 0
        for _ in range(40):  # drop every connection every 0.1 s while work remains
            time.sleep(0.1)
            if truth.by_status()["completed"] == 500:
                break
            if proxy.drop_all():
                hits += 1
        assert hits >= 5, f"only {hits} drops hit the worker while it had work"
        wait_until(lambda: truth.finished(500), timeout=60, what="all 500 jobs finished")
        assert worker.running
    finally:
        worker.stop(timeout=10)
    assert_each_ran_once_or_after_a_lost_lease(truth, ids, calls)


@pytest.mark.slow
def test_a_restarted_server_is_waited_out_and_the_queue_finishes(
    through: Callable[..., Queue], proxy: Proxy, truth: Truth
) -> None:
    """New connections refused for 2 s and the live ones cut, as a restart looks to clients,
    while a worker runs: it carries on afterwards and the queue finishes; an enqueue during
    the outage raises a StorageError (never a raw psycopg error) or succeeds.
    (No SQLite twin: SQLite has no connection or server to lose.)"""
    q = through()
    calls = Calls()

    @q.task(name="net.record", max_retries=3, backoff=QUICK_RETRY)
    def record(n: int) -> int:
        calls.add(n)
        time.sleep(0.01)
        return n

    ids = {record.enqueue(i).id: i for i in range(150)}
    worker = q.worker(concurrency=2, lease=5).start()
    try:
        wait_until(lambda: truth.by_status()["completed"] >= 10, timeout=20, what="the worker under way")
        with proxy.restart(2.0):
            time.sleep(0.3)  # the worker meets the outage
            during = outcome_of(lambda: record.enqueue(1000))
            assert truth.by_status()["completed"] < 150, "the outage must hit a worker with work left"
        assert proxy.refused > 0, "nothing tried to connect during the outage"
        if isinstance(during, BaseException):
            assert_nbqueue_error(during)
            assert isinstance(during, nbqueue.StorageError), during
        else:
            ids[during.id] = 1000
        after = record.enqueue(2000)
        ids[after.id] = 2000
        wait_until(lambda: truth.finished(len(ids)), timeout=60, what="every job finished")
        assert worker.running
    finally:
        worker.stop(timeout=10)
    assert_each_ran_once_or_after_a_lost_lease(truth, ids, calls)


@pytest.mark.slow
def test_a_worker_survives_its_wake_up_connection_failing_to_reconnect(
    through: Callable[..., Queue], proxy: Proxy
) -> None:
    """The idle worker's LISTEN connection is cut while new connections are refused (a
    server at max_connections, say); its other connections live on. The worker keeps its
    thread, and runs the next job once connections can be made again.
    (No SQLite twin: SQLite has no connection or server to lose.)"""
    q = through()

    @q.task(name="net.echo")
    def echo(n: int) -> int:
        return n

    worker = q.worker(concurrency=1, lease=5).start()
    try:
        wait_until(lambda: proxy.live(containing=b"LISTEN"), timeout=10, what="the worker listening")
        proxy.refuse(1.5)
        assert proxy.drop_all(containing=b"LISTEN") == 1
        time.sleep(2.0)  # the idle worker listens again: refused, then allowed
        assert proxy.refused > 0, "the worker did not try to listen again during the refusal"
        job = echo.enqueue(7)
        assert job.result(timeout=10) == 7
    finally:
        worker.stop(timeout=10)


# -- the server commits, the reply is lost ----------------------------------------------------


@pytest.mark.parametrize("key", [None, "once"])
def test_a_lost_reply_to_an_enqueue_never_writes_twice(
    through: Callable[..., Queue], proxy: Proxy, truth: Truth, key: str | None
) -> None:
    """The INSERT commits, its reply is lost: enqueue returns the one job it wrote, or raises
    an nbqueue error; in no case are two jobs written.
    (No SQLite twin: SQLite has no connection or server to lose.)"""
    q = through()
    proxy.lose_reply(INSERT)
    job = outcome_of(lambda: q.enqueue({"n": 1}, key=key))
    assert proxy.lost == [INSERT], "the fault did not happen"
    rows = truth.rows()
    assert len(rows) == 1, f"one enqueue wrote {len(rows)} jobs"
    [(job_id, row)] = rows.items()
    assert json.loads(row["payload"]) == {"n": 1}
    if isinstance(job, BaseException):
        assert_nbqueue_error(job)
    else:
        assert job.id == job_id


def test_a_lost_reply_to_enqueue_many_is_all_or_nothing_never_twice(
    through: Callable[..., Queue], proxy: Proxy, truth: Truth
) -> None:
    """The batch's INSERT commits, its reply is lost: all of the batch is written once, and
    enqueue_many returns its ids or raises an nbqueue error.
    (No SQLite twin: SQLite has no connection or server to lose.)"""
    q = through()
    proxy.lose_reply(INSERT)
    ids = outcome_of(lambda: q.enqueue_many([{"n": i} for i in range(50)]))
    assert proxy.lost == [INSERT], "the fault did not happen"
    rows = truth.rows()
    written = sorted(json.loads(row["payload"])["n"] for row in rows.values())
    assert written == list(range(50)), f"{len(written)} jobs written for a batch of 50"
    if isinstance(ids, BaseException):
        assert_nbqueue_error(ids)
    else:
        assert sorted(ids) == sorted(rows)


def test_a_lost_reply_to_a_claim_does_not_strand_the_job(
    through: Callable[..., Queue], proxy: Proxy, truth: Truth
) -> None:
    """The claim commits, its reply is lost: the job is not stranded. The same (retried)
    claim or a later one returns it, or it stays claimable; with max_retries=0 it must still
    run and complete, never end dead without having run.
    (No SQLite twin: SQLite has no connection or server to lose.)"""
    q = through()
    ids = q.enqueue_many([{"n": 0}, {"n": 1}], max_retries=0)
    proxy.lose_reply(CLAIM)
    first = outcome_of(lambda: q.claim(lease=LEASE, worker_id="me"))
    assert proxy.lost == [CLAIM], "the fault did not happen"
    ran: list[int] = []
    if isinstance(first, BaseException):
        assert_nbqueue_error(first)
    elif first is not None:
        ran.append(first.id)
        q.complete(first, "ran")
    deadline = time.monotonic() + 3 * LEASE + 10
    while not truth.finished(2) and time.monotonic() < deadline:
        q.recover()
        job = q.claim(lease=LEASE, worker_id="me")
        if job is None:
            time.sleep(0.05)
            continue
        ran.append(job.id)
        q.complete(job, "ran")
    rows = truth.rows()
    for job_id in ids:
        row = rows[job_id]
        assert row["status"] == "completed", (
            f"job {job_id} ended {row['status']} ({row['error']!r}), claimed {ran.count(job_id)} times"
        )
    assert sorted(ran) == sorted(ids), f"claims returned {ran}"


def test_a_worker_whose_claim_reply_is_lost_still_runs_every_job(
    through: Callable[..., Queue], proxy: Proxy, truth: Truth
) -> None:
    """The worker's claim commits, its reply is lost: no job is stranded until its lease
    ends; with max_retries=0 every job still runs once and completes.
    (No SQLite twin: SQLite has no connection or server to lose.)"""
    q = through()
    calls = Calls()

    @q.task(name="net.once", max_retries=0)
    def once(n: int) -> int:
        calls.add(n)
        return n

    ids = {once.enqueue(i).id: i for i in range(5)}
    proxy.lose_reply(CLAIM)
    worker = q.worker(lease=LEASE).start()
    try:
        wait_until(lambda: truth.finished(5), timeout=20, what="all 5 jobs finished")
        assert worker.running
    finally:
        worker.stop(timeout=10)
    assert proxy.lost == [CLAIM], "the fault did not happen"
    rows = truth.rows()
    assert {i: rows[i]["status"] for i in ids} == dict.fromkeys(ids, "completed"), {
        i: (rows[i]["status"], rows[i]["error"]) for i in ids
    }
    assert calls.counter == Counter(ids.values())


def test_a_lost_reply_to_complete_is_not_a_lost_lease(
    through: Callable[..., Queue], proxy: Proxy, truth: Truth
) -> None:
    """The completion commits, its reply is lost: complete() does not raise LeaseLost
    (nothing was lost, and LeaseLost says nothing was changed); if it raises another nbqueue
    error, the job is still completed exactly once on the server. The queue goes on.
    (No SQLite twin: SQLite has no connection or server to lose.)"""
    q = through()
    job = q.enqueue({"n": 1})
    claim = q.claim(lease=30)
    assert claim is not None and claim.id == job.id
    proxy.lose_reply(COMPLETE)
    outcome = outcome_of(lambda: q.complete(claim, result={"ok": True}))
    assert proxy.lost == [COMPLETE], "the fault did not happen"
    row = truth.rows()[job.id]
    assert (row["status"], row["attempts"], json.loads(row["result"])) == ("completed", 1, {"ok": True})
    if isinstance(outcome, BaseException):
        assert_nbqueue_error(outcome)
        assert not isinstance(outcome, nbqueue.LeaseLost), (
            f"complete() raised LeaseLost though its completion committed: {outcome}"
        )
    # The queue goes on.
    later = q.enqueue({"n": 2})
    again = q.claim(lease=30)
    assert again is not None and again.id == later.id
    q.complete(again, result="fine")
    assert truth.rows()[later.id]["status"] == "completed"


def test_a_worker_whose_completion_reply_is_lost_goes_on(
    through: Callable[..., Queue], proxy: Proxy, truth: Truth, records: Records
) -> None:
    """The worker's completion (with the next claim in the same statement) commits, its reply
    is lost: no LeaseLost is reported for a job that did complete, the job claimed with it is
    not left waiting for its lease to end, and every job runs once.
    (No SQLite twin: SQLite has no connection or server to lose.)"""
    q = through()
    calls = Calls()

    @q.task(name="net.record", max_retries=3)
    def record(n: int) -> int:
        calls.add(n)
        return n

    ids = {record.enqueue(i).id: i for i in range(10)}
    proxy.lose_reply(BATCH)
    worker = q.worker(lease=2).start()
    try:
        wait_until(lambda: truth.finished(10), timeout=30, what="all 10 jobs finished")
        assert worker.running
    finally:
        worker.stop(timeout=10)
    assert proxy.lost == [BATCH], "the fault did not happen"
    assert_each_ran_once_or_after_a_lost_lease(truth, ids, calls)
    assert calls.counter == Counter(ids.values())
    wrongly_lost = [
        m for r in records.records if "cannot complete job" in (m := r.getMessage()) or "claim was lost" in m
    ]
    assert not wrongly_lost, wrongly_lost
    stranded = {i: row["error"] for i, row in truth.rows().items() if row["attempts"] != 1}
    assert not stranded, f"jobs claimed more than once, after their lease ran out: {stranded}"


def test_a_lost_reply_to_a_batch_runs_every_job_once(
    through: Callable[..., Queue], proxy: Proxy, truth: Truth, records: Records
) -> None:
    """A worker takes quick jobs in batches (nbqueue.batches): their successes and the next
    claims are one statement. It commits on the server, its reply is lost, three times: the
    worker reads back what the batch took (by its claim token) and what it completed, so no
    job is claimed twice, none is reported lost, and every job runs once.
    (No SQLite twin: SQLite has no connection or server to lose.)"""
    q = through()
    calls = Calls()

    @q.task(name="net.quick", max_retries=3)
    def quick(n: int) -> int:
        calls.add(n)
        return n

    ids = {quick.enqueue(i).id: i for i in range(120)}
    proxy.lose_reply(BATCH, times=3)
    worker = q.worker(lease=5).start()
    try:
        wait_until(lambda: truth.finished(120), timeout=60, what="all 120 jobs finished")
        assert worker.running
    finally:
        worker.stop(timeout=10)
    assert proxy.lost == [BATCH] * 3, "the fault did not happen"
    assert calls.counter == Counter(ids.values())
    wrongly_lost = [r.getMessage() for r in records.records if "claim was lost" in r.getMessage()]
    assert not wrongly_lost, wrongly_lost
    twice = {i: row["error"] for i, row in truth.rows().items() if row["attempts"] != 1}
    assert not twice, f"jobs claimed more than once: {twice}"
