"""Periodic tasks: each slot enqueued exactly once however many workers run, no burst after a gap.

Real worker threads and the real PostgreSQL server; the manual clock where a slot must be exact.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

import nbqueue
from nbqueue import Queue
from nbqueue.schedule import Every, make
from tests.helpers import MakeQueue, wait_until

START = datetime(2023, 11, 14, 22, 13, 20, tzinfo=UTC)  # ManualClock's default start


def declare(queues: list[Queue], fn: Callable[..., Any], **plan: Any) -> None:
    """Each queue declares the schedule, as each worker process importing the tasks would."""
    for q in queues:
        q.periodic(**plan)(fn)


def tick_together(queues: list[Queue], names: list[str] | None = None) -> list[list[str]]:
    """Every queue ticks at the same moment, each in its own thread (the schedules of the
    tasks in `names` only, as a worker that runs only those would)."""
    barrier = threading.Barrier(len(queues), timeout=10)
    results: list[Any] = [None] * len(queues)

    def tick(i: int) -> None:
        barrier.wait()
        try:
            results[i] = queues[i].manager.periodic.tick(names)
        except BaseException as exc:
            results[i] = exc

    threads = [threading.Thread(target=tick, args=(i,)) for i in range(len(queues))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return results


def keys(queue: Queue) -> list[str]:
    return [job.key or "" for job in reversed(queue.jobs(limit=1000))]


@pytest.mark.parametrize("plan", [{"every": timedelta(minutes=5)}, {"cron": "*/5 * * * *"}], ids=str)
def test_each_periodic_slot_is_enqueued_once_by_three_queues(
    make_queue: MakeQueue, clock: nbqueue.ManualClock, plan: dict[str, Any]
) -> None:
    queues = [make_queue(clock=clock) for _ in range(3)]

    def tick(n: int) -> int:
        return n

    declare(queues, tick, name="lr.tick", args=(3,), **plan)

    # First sighting: the current slot (22:10) is recorded, nothing is enqueued.
    assert tick_together(queues) == [[], [], []]
    assert queues[0].counts()["pending"] == 0
    clock.advance(4 * 60)  # 22:17:20: the 22:15 slot
    assert sorted(tick_together(queues)) == [[], [], ["lr.tick"]]
    assert tick_together(queues) == [[], [], []]  # the same slot again: nothing
    clock.advance(60)  # 22:18:20: still the 22:15 slot
    assert tick_together(queues) == [[], [], []]
    assert keys(queues[1]) == ["periodic:lr.tick:2023-11-14T22:15:00+00:00"]

    clock.advance(timedelta(hours=3))  # nothing ran for three hours: one job, for the latest slot
    assert sorted(tick_together(queues)) == [[], [], ["lr.tick"]]
    assert keys(queues[2]) == [
        "periodic:lr.tick:2023-11-14T22:15:00+00:00",
        "periodic:lr.tick:2023-11-15T01:15:00+00:00",
    ]
    jobs = queues[0].jobs()
    assert {job.task for job in jobs} == {"lr.tick"}
    assert all(job.args == [3] and job.status == "pending" for job in jobs)


def test_a_cron_task_is_enqueued_once_per_slot_with_three_workers(
    make_queue: MakeQueue, clock: nbqueue.ManualClock
) -> None:
    queues = [make_queue(clock=clock) for _ in range(3)]
    ran: list[int] = []

    def every_five_minutes() -> int:
        ran.append(1)
        return len(ran)

    declare(queues, every_five_minutes, cron="*/5 * * * *", name="lr.cron")
    # first sighting, before any worker runs
    assert queues[0].manager.periodic.tick() == []
    workers = [q.worker(lease=5, periodic_interval=0.05) for q in queues]
    try:
        for worker in workers:
            worker.start()
        clock.advance(timedelta(minutes=5))  # 22:18:20: the 22:15 slot
        wait_until(lambda: ran, 10, "the slot's job run")
        time.sleep(0.3)  # every worker's keeper ticks several more times within this slot
    finally:
        for worker in workers:
            worker.stop(timeout=10)
    assert len(ran) == 1
    assert keys(queues[0]) == ["periodic:lr.cron:2023-11-14T22:15:00+00:00"]
    assert queues[0].counts()["completed"] == 1


@pytest.mark.slow
def test_every_second_with_three_real_workers_enqueues_each_slot_once(tmp_path: Path) -> None:
    """The real clock, on SQLite; both backends race for slots in the two tests above."""
    queues = [Queue(tmp_path / "jobs.db") for _ in range(3)]

    def beat() -> str:
        return "beat"

    declare(queues, beat, every=1, name="lr.beat")

    workers = [q.worker(lease=5) for q in queues]
    try:
        for worker in workers:
            worker.start()
        wait_until(lambda: len(queues[0].jobs()) >= 3, 15, "three slots enqueued")
    finally:
        for worker in workers:
            worker.stop(timeout=10)
    found = keys(queues[0])
    assert len(found) >= 3
    assert all(key.startswith("periodic:lr.beat:") for key in found)
    assert Counter(found).most_common(1)[0][1] == 1  # no slot twice
    slots = [datetime.fromisoformat(key.removeprefix("periodic:lr.beat:")) for key in found]
    assert all(slot.microsecond == 0 for slot in slots)
    assert slots == sorted(slots)
    assert all(job.attempts <= 1 for job in queues[0].jobs())
    for q in queues:
        q.close()


def test_an_impossible_cron_does_not_stop_the_worker_heartbeating(tmp_path: Path) -> None:
    """The keeper thread also heartbeats: a schedule's error must not end it (SQLite is enough)."""
    q = Queue(tmp_path / "jobs.db")
    try:

        @q.periodic(cron="0 0 30 2 *", name="lr.never")
        def never() -> None:
            return None

    except nbqueue.InvalidArgument:
        pass  # refused at registration: fine

    @q.task(name="lr.longer_than_its_lease", max_retries=0)
    def slow() -> str:
        time.sleep(0.8)
        return "ok"

    job = slow.enqueue()
    try:
        with q.worker(lease=0.3, periodic_interval=0.05):  # only the keeper's heartbeats keep this claim
            try:
                [done] = q.wait([job], timeout=5, progress=False)
            except nbqueue.WaitTimeout:
                done = q.get(job.id)
        assert done.status == "completed", f"job {done.status}: the keeper died, no heartbeats"
        assert done.value == "ok"
    finally:
        q.close()


def test_periodic_needs_exactly_one_schedule(tmp_path: Path) -> None:
    for cron, every in ((None, None), ("* * * * *", 60), (None, 0.5), (None, "5m"), (None, True)):
        with pytest.raises(nbqueue.InvalidArgument):
            make(cron, every)
    with Queue(tmp_path / "jobs.db") as q:
        with pytest.raises(nbqueue.InvalidArgument):
            q.periodic(cron="*/5 * * *")
        with pytest.raises(nbqueue.InvalidArgument):
            q.periodic(every=timedelta(milliseconds=10))
        with pytest.raises(nbqueue.PayloadError):

            @q.periodic(every=60, name="lr.bad_args", args=(object(),))
            def bad_args(x: object) -> None:
                return None

    assert make(None, timedelta(minutes=5)) == Every(300)
    assert str(make("*/5 * * * *", None)) == "cron */5 * * * *"


def test_a_schedule_belongs_to_the_queue_that_declared_it(tmp_path: Path, clock: nbqueue.ManualClock) -> None:
    """Another queue's workers, in another database, never enqueue (or run) it."""
    ours, theirs = Queue(tmp_path / "ours.db", clock=clock), Queue(tmp_path / "theirs.db", clock=clock)

    @ours.periodic(every=60, name="lr.ours")
    def ours_only() -> str:
        return "ours"

    for _ in range(2):  # first sighting, then the next slot
        assert theirs.manager.periodic.tick() == []
        ours.manager.periodic.tick()
        clock.advance(60)
    assert theirs.counts()["pending"] == 0
    assert ours.counts()["pending"] == 1
    with theirs.worker(lease=5) as worker:
        worker.run_until_idle()
    assert sum(theirs.counts().values()) == 0
    ours.close()
    theirs.close()


@pytest.mark.slow
def test_a_daily_cron_in_berlin_is_enqueued_once_per_day_across_both_dst_changes(
    make_queue: MakeQueue,
) -> None:
    """Three queues tick every ten minutes through March 30 - April 1 and October 26 - 28, 2024 (an
    injected clock): the 02:30 Berlin job is enqueued once a day, at 03:00 on the spring-forward day
    and at the first 02:30 on the fall-back day."""
    found = []
    for start in (datetime(2024, 3, 29, 23, 0, tzinfo=UTC), datetime(2024, 10, 25, 22, 0, tzinfo=UTC)):
        clock = nbqueue.ManualClock(start.timestamp())
        queues = [make_queue(clock=clock) for _ in range(3)]
        name = f"lr.berlin.{start.month}"
        declare(queues, lambda: None, cron="30 2 * * *", tz="Europe/Berlin", name=name)
        for _ in range(3 * 24 * 6):
            tick_together(queues)
            clock.advance(600)
        found += [key.split(":", 2)[2] for key in keys(queues[0]) if name in key]
    assert found == [
        "2024-03-30T01:30:00+00:00",  # 02:30 CET
        "2024-03-31T01:00:00+00:00",  # 03:00 CEST: 02:30 did not exist
        "2024-04-01T00:30:00+00:00",  # 02:30 CEST
        "2024-10-26T00:30:00+00:00",  # 02:30 CEST
        "2024-10-27T00:30:00+00:00",  # the first 02:30 (CEST); not again at 02:30 CET
        "2024-10-28T01:30:00+00:00",  # 02:30 CET
    ]


def test_every_is_bounded_at_declaration_and_the_schedules_stay_readable(tmp_path: Path) -> None:
    """every=timedelta.max put the next slot past the year 9999: q.schedules() and every board
    raised. Refused when declared (up to a century is a schedule; beyond, a mistake)."""
    with Queue(tmp_path / "jobs.db") as q:
        for every in (timedelta.max, timedelta(days=365.25 * 100 + 1), 1e300):
            with pytest.raises(nbqueue.InvalidArgument, match="every must be from one second to a century"):
                q.periodic(every=every)
        q.periodic(every=timedelta(days=365 * 100), name="lr.century")(lambda: None)
        q.periodic(cron="0 0 29 2 *", name="lr.leap")(lambda: None)  # every fourth year
        frame = q.schedules()
    assert set(frame["name"]) == {"lr.century", "lr.leap"}
    assert frame["next_run"].notna().all()
