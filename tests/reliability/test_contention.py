"""Contention: 4 producer and 4 consumer processes on one SQLite file.

Every job is claimed exactly once per attempt, every job completes, and no
process ever sees an error: in particular no 'database is locked'.
NBQUEUE_SOAK=N (`make soak`) runs more jobs.
"""

from __future__ import annotations

import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

import procs
import pytest

import nbqueue

pytestmark = [pytest.mark.skipif(sys.platform == "win32", reason="POSIX processes"), pytest.mark.slow]

PRODUCERS = CONSUMERS = 4
JOBS = procs.soak(default=20_000, soaked=100_000)


def _check_children(started: list, errs: list[Path], timeout: float) -> None:
    """Every child exits 0 with nothing on stderr (and above all no 'locked')."""
    for proc, err in zip(started, errs, strict=True):
        code = procs.finish(proc, timeout)
        text = err.read_text()
        assert "locked" not in text.lower(), f"{err.name}: 'database is locked' reached the user:\n{text}"
        assert code == 0 and text == "", f"{err.name} exited {code}:\n{text}"


def test_four_producers_four_consumers_every_attempt_claimed_once(tmp_path: Path) -> None:
    db, done = tmp_path / "jobs.db", tmp_path / "producers-done"
    nbqueue.Queue(db).close()
    share = JOBS // PRODUCERS
    producers: list = []
    consumers: list = []
    try:
        for p in range(PRODUCERS):
            producers.append(
                procs.spawn(
                    "contention_producer",
                    db,
                    tmp_path / f"ids-{p}.txt",
                    p,
                    share,
                    procs.SEED + p,
                    stderr=tmp_path / f"producer-{p}.err",
                )
            )
        for c in range(CONSUMERS):
            consumers.append(
                procs.spawn(
                    "contention_consumer",
                    db,
                    tmp_path / f"claims-{c}.txt",
                    done,
                    c,
                    stderr=tmp_path / f"consumer-{c}.err",
                )
            )
        for i, proc in enumerate(producers):
            procs.wait_ready(proc, tmp_path / f"producer-{i}.err")
        for i, proc in enumerate(consumers):
            procs.wait_ready(proc, tmp_path / f"consumer-{i}.err")
        procs.go(consumers + producers)
        limit = 240 * procs.SLACK
        _check_children(producers, [tmp_path / f"producer-{p}.err" for p in range(PRODUCERS)], limit)
        done.touch()  # every job is enqueued: consumers stop once nothing is left
        _check_children(consumers, [tmp_path / f"consumer-{c}.err" for c in range(CONSUMERS)], limit)
    finally:
        procs.reap(producers + consumers)

    # What the producers got back: JOBS distinct ids, each with its planned number of failures.
    planned: dict[int, int] = {}
    for p in range(PRODUCERS):
        lines = (tmp_path / f"ids-{p}.txt").read_text().splitlines()
        rows = [tuple(map(int, line.split())) for line in lines]
        assert sorted(i for i, _ in rows) == list(range(share)), f"producer {p} skipped or repeated a job"
        planned.update((job_id, procs.planned_failures(i)) for i, job_id in rows)
    assert len(planned) == share * PRODUCERS, "an id was handed out twice"

    # What the consumers claimed: each (job, attempt) exactly once, across all of them.
    per_consumer = [
        [tuple(map(int, line.split())) for line in (tmp_path / f"claims-{c}.txt").read_text().splitlines()]
        for c in range(CONSUMERS)
    ]
    claims = Counter(pair for one in per_consumer for pair in one)
    assert [pair for pair, n in claims.items() if n > 1] == [], "an attempt was claimed twice"
    attempts: dict[int, set[int]] = defaultdict(set)
    for job_id, attempt in claims:
        attempts[job_id].add(attempt)
    assert set(attempts) == set(planned), "a job was never claimed, or a claimed job was never enqueued"
    wrong = {i: sorted(a) for i, a in attempts.items() if a != set(range(1, planned[i] + 2))}
    assert wrong == {}, f"attempts claimed other than 1..failures+1: {list(wrong.items())[:10]}"
    assert len(claims) == sum(n + 1 for n in planned.values())

    with nbqueue.Queue(db) as q:
        counts = q.counts()
        jobs = q.get_many(sorted(planned))
    assert counts["completed"] == len(planned) == sum(counts.values()), counts
    for job in jobs:
        assert job.status == "completed", job
        assert job.attempts == planned[job.id] + 1 and job.retries == planned[job.id], job
        assert job.value is not None and 0 <= job.value["by"] < CONSUMERS
        if planned[job.id]:
            assert job.error == f"planned failure {planned[job.id]}", job
    print(
        f"\n{len(planned)} jobs, {len(claims)} claims "
        f"({sum(1 for n in planned.values() if n)} jobs retried); claims per consumer: "
        f"{[len(one) for one in per_consumer]}; double claims: 0; 'locked' errors: 0"
    )
    assert sum(1 for one in per_consumer if one) >= 2, "the consumers did not really share the work"


def test_many_openers_create_a_brand_new_file_at_once(tmp_path: Path) -> None:
    """Creating the schema races too: 4 processes x 4 threads open each of many missing files at once.

    A notebook and a worker started together both create the queue file; neither may fail.
    """
    files, openers, threads = procs.soak(default=80, soaked=800), 4, 4
    errs = [tmp_path / f"opener-{i}.err" for i in range(openers)]
    started: list = []
    try:
        for i in range(openers):
            started.append(procs.spawn("opener", tmp_path, i, files, threads, procs.SEED, stderr=errs[i]))
        for proc, err in zip(started, errs, strict=True):
            procs.wait_ready(proc, err)
        assert not (tmp_path / "0.db").exists()
        procs.go(started, at=time.time() + 0.2)
        failures = []
        # The walk takes ~2 s; a lock held for good must not hang the suite.
        deadline = time.monotonic() + 60 * procs.SLACK
        for proc, err in zip(started, errs, strict=True):
            code = procs.finish(proc, max(1.0, deadline - time.monotonic()))
            failures += err.read_text().splitlines()
            assert code == (1 if err.read_text() else 0), err.read_text()
    finally:
        procs.reap(started)
    kinds = Counter(line.split(": ", 1)[1].split(":")[0] for line in failures)
    locked = [line for line in failures if "locked" in line]
    assert locked == [], f"'database is locked' reached the user {len(locked)} times, e.g. {locked[0]}"
    assert failures == [], f"{len(failures)} of {files * openers * threads} opens failed: {dict(kinds)}"
    for k in range(files):
        with nbqueue.Queue(tmp_path / f"{k}.db") as q:
            counts = q.counts()
        assert counts["completed"] == openers * threads == sum(counts.values()), (k, counts)
