"""Crash safety: SIGKILL a worker (and an enqueue_many, and a claim loop) at random moments.

Nothing is lost, nothing stays running past its lease, nothing is completed twice.
NBQUEUE_SOAK=N (`make soak`) runs many more kills; NBQUEUE_SEED=S replays a run.
"""

from __future__ import annotations

import random
import signal
import sqlite3
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

import procs
import pytest

import nbqueue
from tests.helpers import wait_until

pytestmark = [pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL is POSIX"), pytest.mark.slow]

KILLS = procs.soak(default=50, soaked=500)
BATCH_ROUNDS = procs.soak(default=3, soaked=12)
BATCH_SIZE = 200_000
CLAIM_ROUNDS = procs.soak(default=12, soaked=150)
CLAIM_LEASE = 0.5


def _wait_until_leases_expired(q: nbqueue.Queue, timeout: float = 30) -> list[nbqueue.Job]:
    """The running jobs, once every one of their leases is in the past."""

    def expired() -> tuple[list[nbqueue.Job]] | None:
        running = q.jobs(status="running", limit=1_000_000)
        latest = max((j.lease_until for j in running if j.lease_until), default=None)
        if latest is None or latest < q.now():
            return (running,)  # a tuple: truthy even when nothing is running
        return None

    [running] = wait_until(expired, timeout, "every running job's lease in the past", every=0.05)
    return running


def test_worker_killed_again_and_again_loses_nothing(tmp_path: Path) -> None:
    """A worker is SIGKILLed KILLS times in a row while a producer keeps enqueueing."""
    db, effects = tmp_path / "jobs.db", tmp_path / "effects.db"
    ids_path, stop_path = tmp_path / "ids.txt", tmp_path / "stop"
    procs.create_effects(effects)
    nbqueue.Queue(db).close()
    rng = random.Random(procs.SEED)
    started: list = []
    producer = procs.spawn(
        "producer", db, ids_path, stop_path, 300, procs.SEED, stderr=tmp_path / "producer.err"
    )
    started.append(producer)
    kills = 0
    try:
        procs.wait_ready(producer, tmp_path / "producer.err")
        for round_no in range(KILLS):
            err = tmp_path / f"worker-{round_no}.err"
            worker = procs.spawn("worker", db, effects, "kill", stderr=err)
            started.append(worker)
            if round_no % 5 == 4:  # now and then while it starts (opening, recovering the file)
                time.sleep(rng.uniform(0.0, 0.15))
            else:  # mostly while it works
                procs.wait_ready(worker, err)
                time.sleep(rng.uniform(0.02, 0.3))
            assert worker.poll() is None, f"worker {round_no} died by itself:\n{err.read_text()}"
            assert procs.sigkill(worker) == -signal.SIGKILL
            kills += 1
            assert producer.poll() is None, (tmp_path / "producer.err").read_text()
        stop_path.touch()
        assert procs.finish(producer, 60) == 0, (tmp_path / "producer.err").read_text()

        q = nbqueue.Queue(db)
        try:
            # Leases held by the killed workers run out; recover() takes back every one of them.
            stranded = _wait_until_leases_expired(q)
            assert q.recover() == len(stranded)
            assert q.counts()["running"] == 0

            drain_err = tmp_path / "drain.err"
            drainer = procs.spawn("worker", db, effects, "drain", stderr=drain_err)
            started.append(drainer)
            procs.wait_ready(drainer, drain_err)
            assert procs.finish(drainer, 240 * procs.SLACK) == 0, drain_err.read_text()

            produced = [tuple(map(int, line.split())) for line in ids_path.read_text().splitlines()]
            by_id = {job_id: n for n, job_id in produced}
            assert len(by_id) == len(produced), "an id was handed out twice"
            missing = [i for i in by_id if not _exists(q, i)]
            assert missing == [], f"jobs lost: {missing[:20]}"
            jobs = {job.id: job for job in q.get_many(sorted(by_id))}
            counts = q.counts()
        finally:
            q.close()
    finally:
        procs.reap(started)

    # No child hit a storage error: no 'database is locked', no raw sqlite3 error, no claim or
    # outcome the worker could not write. (Its warnings about leases lost to a kill are expected.)
    for err in sorted(tmp_path.glob("*.err")):
        text = err.read_text()
        for bad in ("locked", "sqlite3.", "StorageError", "claim failed", "could not record"):
            assert bad not in text, f"{err.name}: {bad!r}\n{text}"

    # Every enqueued job is there, finished by its own rules, and nothing else is.
    assert sum(counts.values()) == len(jobs)
    assert counts["completed"] + counts["dead"] == len(jobs), counts
    for job in jobs.values():
        assert job.status in ("completed", "dead"), job
        assert job.args == [by_id[job.id]]
        assert job.lease_until is None and job.finished_at is not None, job
        assert job.attempts == job.retries + 1, job  # every attempt but the last one failed
        if job.error is not None:  # the only failures here are the kills (a lease run out, or the
            # next worker on this host finding the killed worker's process gone)
            assert "lease expired" in job.error or "is gone" in job.error, (job, job.error)
        if job.status == "dead":
            assert job.attempts == job.max_retries + 1, job
            assert job.retries == job.max_retries, job

    # The effect log: which claim really ran, and which one's result the queue kept.
    effects_rows = procs.read_effects(effects)
    runs = Counter((job, attempt, phase) for job, attempt, _, phase, *_ in effects_rows)
    assert [k for k, n in runs.items() if n > 1] == [], "a claim (job, attempt) ran twice"
    for job_id, attempt, n, phase, _, _, t in effects_rows:
        job = jobs[job_id]
        assert n == by_id[job_id]
        assert 1 <= attempt <= job.attempts, ("an attempt the queue does not know", job, attempt)
        if phase == "start" and job.status == "completed":
            assert t <= job.finished_at.timestamp() + 0.001, ("ran again after completion", job, attempt)
    completions = defaultdict(int)
    for (job_id, _attempt, phase), n in runs.items():
        if phase == "done" and jobs[job_id].status == "completed":
            completions[job_id] += n
    for job in jobs.values():
        if job.status == "completed":
            assert completions[job.id] >= 1, job
            assert (job.id, job.attempts, "done") in runs, job
            assert job.value["attempt"] == job.attempts, (job, job.value)  # the last claim completed it
            assert job.value["n"] == by_id[job.id]

    killed_mid_job = sum(1 for j in jobs.values() if j.error is not None)
    print(
        f"\nkills survived: {kills}; jobs checked: {len(jobs)} ({counts['completed']} completed, "
        f"{counts['dead']} dead); attempts cut short by a kill: {killed_mid_job}; lost: 0; "
        f"seed {procs.SEED}"
    )
    assert kills == KILLS
    assert killed_mid_job > 0, "no kill ever landed while a job was running: the test proved nothing"


def _exists(q: nbqueue.Queue, job_id: int) -> bool:
    try:
        q.get(job_id)
    except nbqueue.JobNotFound:
        return False
    return True


def test_kill_in_the_middle_of_enqueue_many_is_all_or_nothing(tmp_path: Path) -> None:
    db = tmp_path / "jobs.db"
    wal = Path(f"{db}-wal")
    rng = random.Random(procs.SEED + 1)
    with nbqueue.Queue(db) as q:
        before = q.enqueue_many([{"before": i} for i in range(500)], queue="before")
    outcomes: list[str] = []
    for round_no in range(BATCH_ROUNDS):
        err = tmp_path / f"many-{round_no}.err"
        child = procs.spawn("enqueue_many", db, f"batch{round_no}", BATCH_SIZE, stderr=err)
        try:
            procs.wait_ready(child, err)
            # Kill while the transaction writes: once the WAL grows, after a further random delay.
            base = wal.stat().st_size if wal.exists() else 0
            deadline = time.monotonic() + 60
            while child.poll() is None and (wal.stat().st_size if wal.exists() else 0) < base + (1 << 20):
                assert time.monotonic() < deadline, "enqueue_many never started writing"
                time.sleep(0.002)
            time.sleep(rng.uniform(0.0, 0.6 if not procs.SOAK else 5.0))
            code = procs.sigkill(child)
        finally:
            procs.reap([child])
        assert code in (-signal.SIGKILL, 0), err.read_text()

        # The file opens, is intact, and holds all of the batch or none of it.
        conn = sqlite3.connect(db)
        try:
            assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        finally:
            conn.close()
        with nbqueue.Queue(db) as q:
            held = sum(q.counts(f"batch{round_no}").values())
            assert held in (0, BATCH_SIZE), f"round {round_no}: {held} of {BATCH_SIZE} jobs were written"
            outcomes.append("all" if held else "none")
            for earlier in range(round_no):
                expected = BATCH_SIZE if outcomes[earlier] == "all" else 0
                assert sum(q.counts(f"batch{earlier}").values()) == expected
            assert [j.payload for j in q.get_many(before)] == [{"before": i} for i in range(500)]
            # ... and it still works as a queue.
            job = q.enqueue({"after": round_no}, queue="after")
            claimed = q.claim(queues="after")
            assert claimed is not None and claimed.id == job.id
            q.complete(claimed)
    print(f"\nenqueue_many of {BATCH_SIZE} killed {BATCH_ROUNDS} times: {outcomes}")
    assert "none" in outcomes, "no kill landed inside the transaction: the test proved nothing"


def test_kill_in_the_middle_of_claims_loses_nothing(tmp_path: Path) -> None:
    db = tmp_path / "jobs.db"
    total = max(10_000, CLAIM_ROUNDS * 800)
    rng = random.Random(procs.SEED + 2)
    with nbqueue.Queue(db, backoff=nbqueue.Backoff(base=2, cap=0.01, jitter=0)) as q:
        ids = q.enqueue_many([{"i": i} for i in range(total)], queue="claims")
    running_after_kill = 0
    for round_no in range(CLAIM_ROUNDS):
        err = tmp_path / f"claimer-{round_no}.err"
        child = procs.spawn("claim_loop", db, "claims", CLAIM_LEASE, stderr=err)
        try:
            procs.wait_ready(child, err)
            time.sleep(rng.uniform(0.02, 0.3))
            assert child.poll() is None, f"the claimer ended by itself: {err.read_text()}"
            assert procs.sigkill(child) == -signal.SIGKILL
        finally:
            procs.reap([child])
        assert err.read_text() == ""
        with nbqueue.Queue(db) as q:
            counts = q.counts()
            # Only pending, running (a claim the kill cut off) or completed: nothing lost, nothing else.
            assert counts["pending"] + counts["running"] + counts["completed"] == total, counts
            assert sum(counts.values()) == total, counts
            assert counts["pending"] > 0, "the claimer ran out of jobs: enqueue more"
            assert counts["running"] <= round_no + 1, counts  # at most one claim in flight per kill
            running_after_kill = counts["running"]

    with nbqueue.Queue(db) as q:
        stranded = _wait_until_leases_expired(q)
        assert len(stranded) == running_after_kill
        assert {j.attempts for j in stranded} <= {1}
        assert q.recover() == len(stranded)
        counts = q.counts()
        assert counts["running"] == 0
        assert counts["failed"] == len(stranded), counts  # each will be retried after its backoff
        retry_at = max((j.run_at for j in q.jobs(status="failed")), default=q.now())
        time.sleep(max(0.0, (retry_at - q.now()).total_seconds()) + 0.01)
        while (job := q.claim(queues="claims", lease=60)) is not None:
            q.complete(job, {"drained": True})
        jobs = q.get_many(ids)
        counts = q.counts()
    assert counts["completed"] == total == sum(counts.values()), counts
    again = {j.id for j in jobs if j.attempts > 1}
    assert again == {j.id for j in stranded}, "a job was claimed twice without its lease expiring"
    for job in jobs:
        assert job.status == "completed"
        if job.id in again:
            assert job.attempts == 2, job
            assert "lease expired" in (job.error or "") or "is gone" in (job.error or ""), job
        else:
            assert job.attempts == 1 and job.error is None, job
    print(
        f"\nclaim loop killed {CLAIM_ROUNDS} times; claims cut off mid-flight: {len(stranded)}; "
        f"jobs checked: {total}; lost: 0"
    )
    assert stranded, "no kill landed between a claim and its completion: the test proved nothing"
