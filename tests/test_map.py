"""task.map: one job per item in one transaction, all or none, on both backends; and a
workflow's write that grows with its size, not with its square."""

from __future__ import annotations

import gc
import time
from collections import Counter

import pytest

import nbqueue
from nbqueue import Queue, State
from tests.helpers import QUICK_RETRY, MakeQueue


def test_map_makes_one_job_per_item_in_order_with_the_options_given(queue: Queue) -> None:
    @queue.task(name="map.square")
    def square(x: int) -> int:
        return x * x

    jobs = square.map(range(5), queue="maths", priority=3)
    assert [j.args for j in jobs] == [[0], [1], [2], [3], [4]]
    assert [j.id for j in jobs] == sorted(j.id for j in jobs)
    assert {(j.queue, j.priority, j.status) for j in jobs} == {("maths", 3, State.PENDING)}
    assert queue.get(jobs[2].id).args == [2]  # what map returned is what was written
    with queue.worker(queues=["maths"]) as worker:
        worker.run_until_idle()
    assert [j.result(timeout=10) for j in jobs] == [0, 1, 4, 9, 16]
    assert square.map([]) == []


def test_a_bad_item_refuses_the_whole_map_and_writes_nothing(queue: Queue) -> None:
    @queue.task(name="map.echo")
    def echo(x: object) -> object:
        return x

    before = queue.counts()
    with pytest.raises(nbqueue.PayloadError, match=r"map: item 2: .*args\[0\]"):
        echo.map([1, {"ok": True}, object(), 4])
    with pytest.raises(nbqueue.PayloadError, match="item 1"):
        echo.map([1.0, float("nan")])
    assert queue.counts() == before
    with pytest.raises(nbqueue.InvalidArgument, match="idempotency key"):
        echo.map([1, 2], key="same")
    for not_items in ("abc", {"a": 1}, 5):
        with pytest.raises(nbqueue.InvalidArgument, match="iterable of items"):
            echo.map(not_items)  # type: ignore[arg-type]
    assert queue.counts() == before


def test_map_after_a_parent_waits_for_it(queue: Queue) -> None:
    @queue.task(name="map.child")
    def child(x: int) -> int:
        return x

    parent = queue.enqueue({"parent": 1})
    kids = child.map([1, 2, 3], after=[parent])
    assert {queue.get(k.id).status for k in kids} == {State.BLOCKED}
    claimed = queue.claim()
    assert claimed is not None and claimed.id == parent.id
    queue.complete(claimed, "ok")
    assert {queue.get(k.id).status for k in kids} == {State.PENDING}


def test_map_inside_a_workflow_joins_it(queue: Queue) -> None:
    @queue.task(name="map.leaf")
    def leaf(x: int) -> int:
        return x

    with queue.workflow("fan") as wf:
        root = leaf.enqueue(0)
        leaf.map([1, 2], after=[root])
    assert len(wf.jobs) == 3
    assert sorted(len(p) for p in queue.graph(wf)["parents"]) == [0, 1, 1]


def test_map_inside_a_running_job_makes_its_children_once(make_queue: MakeQueue) -> None:
    q = make_queue(backoff=QUICK_RETRY)
    runs: Counter[str] = Counter()

    @q.task(name="map.kid")
    def kid(x: int) -> int:
        return x

    @q.task(name="map.fan", max_retries=2)
    def fan() -> list[int]:
        made = kid.map([10, 20, 30])
        runs["fan"] += 1
        if runs["fan"] == 1:
            raise ConnectionError("the first run fails after its map")
        return [j.id for j in made]

    job = fan.enqueue()
    with q.worker() as worker:
        worker.run_until_idle()
        ids = job.result(timeout=20)
    assert runs["fan"] == 2
    assert len(ids) == 3
    assert q.counts()["completed"] == 4  # the parent and three children, not six
    assert [q.get(i).args for i in ids] == [[10], [20], [30]]


@pytest.mark.slow  # about 4 s of CPU a backend: make test runs it
def test_a_workflow_s_write_grows_linearly_with_its_size(queue: Queue) -> None:
    """Its jobs' ids were rebuilt for every job written (n**2): 8,000 jobs took 8.5 s. A ratio
    in one run, in this process's CPU time (other processes' load is not ours): 8 times the jobs
    may take at most 14 times as long (linear: 8 on SQLite, 10 on PostgreSQL, whose server does
    part of the work; the ids copied per job made it 24 and 15)."""

    @queue.task(name="map.step")
    def step(x: int) -> int:
        return x

    def write(n: int) -> float:
        gc.collect()
        gc.disable()  # the interpreter's collections grow with what is alive: not what is measured
        try:
            started = time.process_time()
            with queue.workflow(f"w{n}"):
                root = step.enqueue(0)
                for i in range(n):
                    step.schedule(args=(nbqueue.result_of(root), i), after=[root])
            return time.process_time() - started
        finally:
            gc.enable()

    write(50)  # warm: statements prepared, caches filled
    small = min(write(400) for _ in range(3))
    large = min(write(3200) for _ in range(3))
    assert large / small < 14, f"400 jobs {small:.3f} s, 3,200 jobs {large:.3f} s"
