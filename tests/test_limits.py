"""Limits: concurrency and rate per key, held across threads and processes, on both backends.

Real worker threads and processes; the database itself is sampled for what runs.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

import nbqueue
from nbqueue import Queue
from nbqueue.limits import KeyState, Limit, admit, format_rate, parse_rate
from tests.helpers import MakeQueue

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(
    ("text", "per_second"),
    [
        ("500/m", 500 / 60),
        ("10/s", 10.0),
        ("2/h", 2 / 3600),
        ("90000/m", 1500.0),
        ("1.5/s", 1.5),
        ("3 / min", 0.05),
    ],
)
def test_rates_parse(text: str, per_second: float) -> None:
    assert parse_rate(text) == pytest.approx(per_second)


@pytest.mark.parametrize("bad", ["500", "0/s", "-1/m", "5/d", "many/s", ""])
def test_bad_rates_are_refused(bad: str) -> None:
    with pytest.raises(nbqueue.InvalidArgument, match="rate"):
        parse_rate(bad)


def test_rates_print_as_written() -> None:
    assert [format_rate(parse_rate(t)) for t in ("500/m", "10/s", "2/h")] == ["500/m", "10/s", "2/h"]


def test_gcra_bounds_every_window() -> None:
    """In any window of length T, units started <= rate x T + burst + the last start's units."""
    limit = Limit("k", rate=10.0, burst=3)
    state = KeyState(limit)
    starts: list[int] = []
    now = 0
    while now < 5_000_000:  # try to start every 1 ms for 5 s
        admitted = admit({"k": 1}, {"k": state}, now)
        if admitted is not None:
            starts.append(now)
            state = KeyState(limit, tat=admitted.tats["k"])
        now += 1000
    assert 10 * 5 <= len(starts) <= 10 * 5 + 3 + 1
    assert starts[:4] == [0, 0 + 1000, 2000, 3000]  # the burst: 4 at once after a quiet spell
    for i, first in enumerate(starts):
        for window in (100_000, 500_000, 1_000_000):
            inside = sum(1 for t in starts[i:] if t < first + window)
            assert inside <= 10 * window / 1e6 + 3 + 1


def test_concurrency_counts_units_and_a_pause_stops_starts() -> None:
    limit = Limit("k", concurrency=3)
    assert admit({"k": 2}, {"k": KeyState(limit, in_flight=1)}, 0) is not None
    assert admit({"k": 2}, {"k": KeyState(limit, in_flight=2)}, 0) is None
    assert admit({"k": 1}, {"k": KeyState(limit, paused_until=10)}, 5) is None
    assert admit({"k": 1}, {"k": KeyState(limit, paused_until=10)}, 10) is not None
    assert admit({"other": 5}, {}, 0) is not None  # a key nobody limited


def test_limit_arguments_are_checked(queue: Queue) -> None:
    for bad in ({"concurrency": 0}, {"concurrency": 1.5}, {"rate": "fast"}, {"burst": -1}):
        with pytest.raises(nbqueue.InvalidArgument):
            queue.limit("k", **bad)  # type: ignore[arg-type]
    with pytest.raises(nbqueue.InvalidArgument, match="units"):
        queue.enqueue({}, limits={"k": 0})
    with pytest.raises(nbqueue.InvalidArgument):
        queue.enqueue({}, limits=5)  # type: ignore[typeddict-item]
    assert sum(queue.counts().values()) == 0


def test_a_full_key_holds_back_only_its_own_jobs(make_queue: MakeQueue) -> None:
    q = make_queue()
    q.limit("slow-api", concurrency=1)
    gate = threading.Event()

    @q.task(name="lim.blocked", limits=["slow-api"])
    def blocked(i: int) -> int:
        gate.wait(10)
        return i

    @q.task(name="lim.free")
    def free(i: int) -> int:
        return i

    held = [blocked.enqueue(i) for i in range(5)]
    others = [free.enqueue(i) for i in range(5)]
    with q.worker(concurrency=3, lease=10):
        done = q.wait(others, timeout=20, progress=False)  # while the key is full
        assert [j.value for j in done] == list(range(5))
        assert q.counts()["running"] == 1  # one holds the key; the others wait for it
        assert q.limits().set_index("key").loc["slow-api", "in_flight"] == 1
        gate.set()
        assert [j.value for j in q.wait(held, timeout=20, progress=False)] == list(range(5))


def test_claims_find_the_runnable_job_behind_many_held_back_jobs(make_queue: MakeQueue) -> None:
    """Thousands of jobs of a full key sit ahead (by priority) of one runnable job. (How fast
    such a claim is lives in the benchmark: "claim, 3,000 held back" in `make bench`.)"""
    q = make_queue()
    q.limit("full", concurrency=1)
    occupant = q.enqueue({"occupant": True}, limits=["full"], priority=100)
    claim = q.claim()
    assert claim is not None and claim.id == occupant.id
    q.enqueue_many([{"n": i} for i in range(3000)], limits=["full"], priority=50)
    runnable = q.enqueue({"free": True}, priority=0)
    for _ in range(20):
        got = q.claim()
        assert got is not None and got.id == runnable.id
        q.release(got)
    assert q.counts()["pending"] == 3001 and q.limits().set_index("key").loc["full", "waiting"] == 3000


def test_priority_holds_across_limited_and_unlimited_jobs(queue: Queue) -> None:
    queue.limit("k", concurrency=5)
    low = queue.enqueue({"low": 1}, priority=0)
    high = queue.enqueue({"high": 1}, priority=9, limits=["k"])
    first, second = queue.claim(), queue.claim()
    assert first is not None and second is not None
    assert (first.id, second.id) == (high.id, low.id)
    assert first.limits == {"k": 1}


def test_a_crashed_workers_slot_comes_back_with_its_lease(
    clocked_queue: Queue, clock: nbqueue.ManualClock
) -> None:
    q = clocked_queue
    q.limit("k", concurrency=1)
    a = q.enqueue({"a": 1}, limits=["k"])
    b = q.enqueue({"b": 1}, limits=["k"])
    claim = q.claim(lease=5)
    assert claim is not None and claim.id == a.id
    assert q.claim(lease=5) is None  # the key is full
    clock.advance(6)  # the holder "crashed": its lease runs out
    assert q.recover() == 1
    second = q.claim(lease=5)
    assert second is not None and second.id in (a.id, b.id)


SAMPLER = textwrap.dedent(
    """
    import json, sys, time
    import nbqueue

    q = nbqueue.Queue(sys.argv[1])
    n = int(sys.argv[2])

    @q.task(name="lim.hammer", limits=["hammered"])
    def hammer(i):
        time.sleep(0.01)
        return i

    with q.worker(concurrency=4, lease=30) as w:
        deadline = time.monotonic() + 120
        while q.counts()["completed"] < n and time.monotonic() < deadline:
            time.sleep(0.05)
    """
)


@pytest.mark.slow
def test_three_processes_never_run_more_than_the_limit(queue_target: str, make_queue: MakeQueue) -> None:
    """Three worker processes with four threads each hammer one key: concurrency 2, 100/s."""
    q = make_queue()
    q.limit("hammered", concurrency=2, rate="100/s", burst=2)
    n = 300
    hammer = q.task(name="lim.hammer", limits=["hammered"])(lambda i: i)  # run by the children
    for i in range(n):
        hammer.enqueue(i)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [
        subprocess.Popen([sys.executable, "-c", SAMPLER, queue_target, str(n)], env=env) for _ in range(3)
    ]
    peak, samples = 0, 0
    try:
        deadline = time.monotonic() + 120
        while q.counts()["completed"] < n and time.monotonic() < deadline:
            running = q.counts()["running"]
            peak = max(peak, running)
            samples += 1
            time.sleep(0.002)
    finally:
        for proc in procs:
            proc.wait(timeout=150)
    assert q.counts()["completed"] == n
    assert samples > 100
    assert peak <= 2, f"{peak} jobs of a key limited to 2 were running at once"
    starts = sorted(job.started_at for job in q.jobs(limit=n) if job.started_at)
    assert len(starts) == n
    for i, first in enumerate(starts):  # in any 1 s window: at most 100 + 2 + 1 starts
        inside = sum(1 for t in starts[i : i + 200] if (t - first).total_seconds() < 1.0)
        assert inside <= 103, inside


def test_a_pause_by_hand_and_resume(queue: Queue) -> None:
    queue.limit("k", concurrency=10)
    queue.pause("k", 60, why="maintenance")
    job = queue.enqueue({"n": 1}, limits=["k"])
    assert queue.claim() is None
    frame = queue.limits().set_index("key")
    assert frame.loc["k", "paused_why"] == "maintenance" and frame.loc["k", "waiting"] == 1
    assert queue.resume("k") is True
    claim = queue.claim()
    assert claim is not None and claim.id == job.id


def test_limits_survive_reopening(queue_target: str, make_queue: MakeQueue) -> None:
    make_queue().limit("openai", concurrency=8, rate="500/m", burst=20)
    frame = make_queue().limits()
    row = frame.set_index("key").loc["openai"]
    assert (row["concurrency"], row["rate"], row["burst"]) == (8, "500/m", 20.0)
