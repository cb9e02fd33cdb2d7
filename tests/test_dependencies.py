"""Dependencies between jobs on both backends: after=, when=, result_of, cascades, re-arming.

Each test drives the public API by hand (claim, complete, fail) so every state it asserts
is the one the contract names, in the transaction that caused it.
"""

from __future__ import annotations

from typing import Any

import pytest

import nbqueue
from nbqueue import Queue, State
from tests.helpers import MakeQueue, wait_until


def run_one(q: Queue, ok: bool = True, value: Any = "done") -> nbqueue.Job:
    """Claim the next due job and complete it (or fail it for good)."""
    job = q.claim()
    assert job is not None, "a job should be due"
    if ok:
        q.complete(job, value)
    else:
        q.fail(job, "it broke", retry=False)
    return q.get(job.id)


def status(q: Queue, *jobs: nbqueue.Job | int) -> list[str]:
    return [q.get(getattr(j, "id", j)).status.value for j in jobs]


def test_a_blocked_child_is_never_claimed_before_its_parents(queue: Queue) -> None:
    a = queue.enqueue({"n": "a"})
    b = queue.enqueue({"n": "b"})
    child = queue.enqueue({"n": "child"}, after=[a, b], priority=100)
    assert child.status is State.BLOCKED and child.parents_left == 2
    first = queue.claim()
    assert first is not None and first.id == a.id  # the child's priority does not let it jump in
    queue.complete(first, 1)
    assert status(queue, child) == ["blocked"] and queue.get(child.id).parents_left == 1
    second = queue.claim()
    assert second is not None and second.id == b.id
    assert queue.claim() is None  # the child is still blocked while b runs
    queue.complete(second, 2)
    assert status(queue, child) == ["pending"]
    assert queue.claim().id == child.id  # type: ignore[union-attr]


def test_result_of_and_results_of_are_the_parents_values_at_claim(queue: Queue) -> None:
    a = queue.enqueue({"n": "a"})
    b = queue.enqueue({"n": "b"})
    child = queue.enqueue(
        {"one": nbqueue.result_of(a), "both": nbqueue.results_of([a, b]), "plain": [1, {"x": 2}]}
    )
    assert child.status is State.BLOCKED  # placeholders make their jobs parents too
    queue.complete(queue.claim(), {"value": "A"})  # type: ignore[arg-type]
    queue.complete(queue.claim(), ["B"])  # type: ignore[arg-type]
    claimed = queue.claim()
    assert claimed is not None and claimed.id == child.id
    assert claimed.payload == {"one": {"value": "A"}, "both": [{"value": "A"}, ["B"]], "plain": [1, {"x": 2}]}


def test_a_task_gets_its_parents_results_as_arguments(queue: Queue) -> None:
    @queue.task()
    def add(x: int, y: int) -> int:
        return x + y

    @queue.task()
    def total(values: list[int], scale: int = 1) -> int:
        return sum(values) * scale

    a, b = add.enqueue(1, 2), add.enqueue(3, 4)
    s = total.schedule(
        args=(nbqueue.results_of([a, b]),), kwargs={"scale": nbqueue.result_of(a)}, after=[a, b]
    )
    with queue.worker(concurrency=2):
        assert s.result(timeout=20) == (3 + 7) * 3


def test_a_diamond_runs_its_join_once_after_both_sides(queue: Queue) -> None:
    top = queue.enqueue({"n": "top"})
    left = queue.enqueue({"n": "left"}, after=[top])
    right = queue.enqueue({"n": "right"}, after=[top])
    join = queue.enqueue({"n": "join"}, after=[left, right])
    order = [run_one(queue).id for _ in range(4)]
    assert order[0] == top.id and order[3] == join.id and set(order[1:3]) == {left.id, right.id}
    assert queue.claim() is None
    assert status(queue, top, left, right, join) == ["completed"] * 4


def test_a_parent_settles_its_children_group_by_group_each_once(queue: Queue) -> None:
    """One parent that completes settles its children in groups alike (rule, count left), each
    group by one statement: a child counted down from 2 to 1 is not then let go with the group
    that had 1 left (the groups go fewest left first)."""
    done = queue.enqueue({"n": "done"})
    queue.complete(queue.claim(), 0)  # type: ignore[arg-type]
    parent = queue.enqueue({"n": "parent"}, priority=10)
    other = queue.enqueue({"n": "other"})
    third = queue.enqueue({"n": "third"})
    children = {
        "alone": queue.enqueue({"c": 1}, after=[parent]),
        "with other": queue.enqueue({"c": 2}, after=[parent, other]),
        "other done": queue.enqueue({"c": 3}, after=[parent, done]),  # 1 left, like "alone"
        "any": queue.enqueue({"c": 4}, after=[parent, other], when="any_succeeded"),
        "all done": queue.enqueue({"c": 5}, after=[parent, other], when="all_done"),
        "three": queue.enqueue({"c": 6}, after=[parent, other, third]),
    }

    def settled() -> dict[str, tuple[str, int]]:
        jobs = {name: queue.get(job.id) for name, job in children.items()}
        return {name: (job.status.value, job.parents_left) for name, job in jobs.items()}

    assert run_one(queue).id == parent.id
    assert settled() == {
        "alone": ("pending", 0),
        "with other": ("blocked", 1),
        "other done": ("pending", 0),
        "any": ("pending", 1),
        "all done": ("blocked", 1),
        "three": ("blocked", 2),
    }
    assert run_one(queue).id == other.id
    assert settled() == {
        "alone": ("pending", 0),
        "with other": ("pending", 0),
        "other done": ("pending", 0),
        "any": ("pending", 1),
        "all done": ("pending", 0),
        "three": ("blocked", 1),
    }


def test_a_parent_finished_before_the_child_counts_at_once(queue: Queue) -> None:
    queue.enqueue({"n": 1})
    done = run_one(queue)
    dead = queue.enqueue({"n": 2})
    run_one(queue, ok=False)
    assert queue.enqueue({"n": 3}, after=[done]).status is State.PENDING
    doomed = queue.enqueue({"n": 4}, after=[done, dead])
    assert doomed.status is State.UPSTREAM_FAILED and doomed.root_cause == dead.id
    assert f"job {dead.id}" in (doomed.error or "") and doomed.finished
    assert queue.enqueue({"n": 5}, after=[done, dead], when="all_done").status is State.PENDING


def test_a_dead_parent_dooms_its_descendants_level_by_level(queue: Queue) -> None:
    root = queue.enqueue({"n": "root"})
    child = queue.enqueue({"n": "child"}, after=[root])
    grandchild = queue.enqueue({"n": "grandchild"}, after=[child])
    cleanup = queue.enqueue({"n": "cleanup"}, after=[grandchild], when="all_done")
    run_one(queue, ok=False)
    assert status(queue, root, child, grandchild, cleanup) == [
        "dead",
        "upstream_failed",
        "upstream_failed",
        "pending",
    ]
    assert queue.get(grandchild.id).root_cause == root.id
    assert queue.counts()["upstream_failed"] == 2
    claimed = queue.claim()
    assert claimed is not None and claimed.id == cleanup.id


def test_requeue_rearms_the_descendants_and_never_reruns_the_completed(queue: Queue) -> None:
    ok1 = queue.enqueue({"n": "ok1"})
    bad = queue.enqueue({"n": "bad"})
    ok2 = queue.enqueue({"n": "ok2"})
    join = queue.enqueue({"n": "join"}, after=[ok1, bad, ok2])
    after_join = queue.enqueue({"n": "after"}, after=[join])
    ran = [run_one(queue, ok=job_ok).id for job_ok in (True, False, True)]
    assert ran == [ok1.id, bad.id, ok2.id]
    assert status(queue, join, after_join) == ["upstream_failed", "upstream_failed"]

    assert queue.requeue(bad) == 1
    assert status(queue, bad, join, after_join) == ["pending", "blocked", "blocked"]
    assert queue.get(join.id).parents_left == 1 and queue.get(join.id).root_cause is None
    assert run_one(queue).id == bad.id  # only the requeued job is due: ok1 and ok2 do not run again
    assert run_one(queue).id == join.id
    assert run_one(queue).id == after_join.id
    assert queue.claim() is None
    assert [queue.get(j.id).attempts for j in (ok1, bad, ok2, join, after_join)] == [1, 2, 1, 1, 1]


def test_requeue_of_a_doomed_job_names_its_root_cause(queue: Queue) -> None:
    root = queue.enqueue({"n": "root"})
    child = queue.enqueue({"n": "child"}, after=[root])
    run_one(queue, ok=False)
    with pytest.raises(nbqueue.InvalidTransition, match=f"requeue job {root.id}"):
        queue.requeue(child)
    assert status(queue, child) == ["upstream_failed"]


def test_cancel_dooms_the_waiting_descendants_and_requeue_brings_them_back(queue: Queue) -> None:
    a = queue.enqueue({"n": "a"})
    b = queue.enqueue({"n": "b"}, after=[a])
    c = queue.enqueue({"n": "c"}, after=[b])
    queue.cancel(a)
    assert status(queue, a, b, c) == ["cancelled", "upstream_failed", "upstream_failed"]
    assert queue.get(c.id).root_cause == a.id
    queue.requeue(a)
    assert status(queue, a, b, c) == ["pending", "blocked", "blocked"]


def test_cancelling_a_blocked_job_dooms_its_children(queue: Queue) -> None:
    a = queue.enqueue({"n": "a"})
    b = queue.enqueue({"n": "b"}, after=[a])
    c = queue.enqueue({"n": "c"}, after=[b])
    queue.cancel(b)
    assert status(queue, a, b, c) == ["pending", "cancelled", "upstream_failed"]
    assert queue.requeue(b) == 1
    assert status(queue, b, c) == ["blocked", "blocked"]  # b still waits for a
    run_one(queue)
    assert status(queue, b, c) == ["pending", "blocked"]


def test_any_succeeded_runs_at_the_first_success_and_fails_when_none(queue: Queue) -> None:
    a, b = queue.enqueue({"n": "a"}), queue.enqueue({"n": "b"})
    first = queue.enqueue({"n": "first"}, after=[a, b], when="any_succeeded")
    run_one(queue, ok=False)
    assert status(queue, first) == ["blocked"]
    run_one(queue)
    assert status(queue, first) == ["pending"]

    c, d = queue.enqueue({"n": "c"}), queue.enqueue({"n": "d"})
    none = queue.enqueue({"n": "none"}, after=[c, d], when="any_succeeded")
    run_one(queue)  # 'first' is due before c: finish it
    run_one(queue, ok=False)
    run_one(queue, ok=False)
    assert status(queue, none) == ["upstream_failed"]


def test_all_done_gives_a_failed_parent_as_an_outcome(queue: Queue) -> None:
    good, bad = queue.enqueue({"n": "good"}), queue.enqueue({"n": "bad"})
    report = queue.enqueue({"results": nbqueue.results_of([good, bad])}, when="all_done")
    run_one(queue, value={"rows": 3})
    run_one(queue, ok=False)
    claimed = queue.claim()
    assert claimed is not None and claimed.id == report.id
    first, second = claimed.payload["results"]
    assert first == {"rows": 3}
    assert isinstance(second, nbqueue.Outcome) and second.ok is False and "it broke" in (second.error or "")


def test_after_refuses_unknown_parents_and_writes_nothing(queue: Queue) -> None:
    a = queue.enqueue({"n": "a"})
    before = queue.counts()
    with pytest.raises(nbqueue.JobNotFound, match="no job with id 999"):
        queue.enqueue({"n": "orphan"}, after=[a, 999])
    with pytest.raises(nbqueue.InvalidArgument, match="after takes jobs or job ids"):
        queue.enqueue({"n": "bad"}, after=["a"])
    with pytest.raises(nbqueue.InvalidArgument, match="when must be one of"):
        queue.enqueue({"n": "bad"}, after=[a], when="sometimes")
    assert queue.counts() == before


def test_retention_keeps_a_parent_that_a_blocked_child_needs(clocked_queue: Queue, clock: Any) -> None:
    q = clocked_queue
    parent = q.enqueue({"n": "parent"})
    other = q.enqueue({"n": "other"})
    child = q.enqueue({"n": "child"}, after=[parent, other])
    run_one(q)  # the parent completes; the child still waits for `other`
    clock.advance(3600)
    assert q.purge("completed", older_than=60) == 0
    with pytest.raises(nbqueue.InvalidTransition, match=f"job {child.id} \\(blocked\\) waits for it"):
        q.delete([parent.id])
    assert q.get(parent.id).status is State.COMPLETED
    run_one(q)
    run_one(q)  # the child
    clock.advance(3600)
    assert q.purge("completed", older_than=60) == 3
    with pytest.raises(nbqueue.JobNotFound):
        q.get(child.id)
    assert q.manager.storage.edges([parent.id, other.id, child.id]) == []  # the edges went with them


def test_a_workflow_writes_all_its_jobs_at_the_end_or_none(queue: Queue) -> None:
    with queue.workflow("research") as wf:
        plan = queue.enqueue({"step": "plan"})
        hits = [queue.enqueue({"search": nbqueue.result_of(plan), "i": i}) for i in range(3)]
        write = queue.enqueue({"write": nbqueue.results_of(hits)})
        assert queue.counts()["blocked"] == queue.counts()["pending"] == 0  # nothing written yet
    assert wf.id is not None and [j.id for j in wf.jobs] == [plan.id, *(h.id for h in hits), write.id]
    assert status(queue, plan, *hits, write) == ["pending"] + ["blocked"] * 4
    frame = queue.graph(wf)
    assert list(frame["id"]) == [j.id for j in wf.jobs]
    assert frame.loc[write.id, "parents"] == [h.id for h in hits]
    assert frame.loc[hits[0].id, "parents"] == [plan.id]
    assert (frame["workflow"] == wf.id).all()

    before = queue.counts()
    with pytest.raises(RuntimeError, match="changed my mind"), queue.workflow("abandoned"):
        queue.enqueue({"n": 1})
        raise RuntimeError("changed my mind")
    with pytest.raises(nbqueue.PayloadError), queue.workflow("bad"):
        queue.enqueue({"n": 1})
        queue.enqueue({"n": {1, 2}})  # not JSON: refused at the end, with the whole workflow
    assert queue.counts() == before


def test_graph_of_a_job_is_everything_linked_to_it(queue: Queue) -> None:
    a = queue.enqueue({"n": "a"})
    b = queue.enqueue({"n": "b"}, after=[a])
    c = queue.enqueue({"n": "c"}, after=[b])
    d = queue.enqueue({"n": "d"}, after=[a])
    loner = queue.enqueue({"n": "loner"})
    for job in (a, c, d):
        frame = queue.graph(job)
        assert list(frame["id"]) == [a.id, b.id, c.id, d.id]
        assert frame.loc[c.id, "parents"] == [b.id] and frame.loc[a.id, "parents"] == []
        assert list(frame["status"]) == ["pending", "blocked", "blocked", "blocked"]
    assert list(queue.graph(loner)["id"]) == [loner.id]


def test_children_made_by_a_job_are_made_once_across_its_attempts(make_queue: MakeQueue) -> None:
    q = make_queue(backoff=nbqueue.Backoff(base=0.05, cap=0.05, jitter=0))
    attempts = []

    @q.task(max_retries=2)
    def leaf(i: int) -> int:
        return i

    @q.task(max_retries=2)
    def planner(n: int) -> list[int]:
        children = [leaf.enqueue(i) for i in range(n)]
        attempts.append([c.id for c in children])
        if len(attempts) == 1:
            raise RuntimeError("crashed after the fan-out")
        return [c.id for c in children]

    job = planner.enqueue(3)
    with q.worker():
        ids = job.result(timeout=20)
        q.wait(ids, timeout=20)
    assert attempts[0] == attempts[1] == ids
    assert q.counts()["completed"] == 4 and sum(q.counts().values()) == 4


@pytest.mark.parametrize("rule", ["all_succeeded", "all_done", "any_succeeded"])
def test_a_worker_runs_a_graph_in_order(queue: Queue, rule: str) -> None:
    order: list[str] = []

    @queue.task()
    def note(name: str) -> str:
        order.append(name)
        return name

    first = note.enqueue("first")
    second = note.schedule(args=("second",), after=[first], when=rule)
    third = note.schedule(args=("third",), after=[first, second], when=rule)
    with queue.worker(concurrency=3):  # under any_succeeded `third` may finish before `second`:
        wait_until(lambda: queue.get(third.id).finished, 20, "the last job finished")  # both
        wait_until(lambda: queue.get(second.id).finished, 20, "the second job finished")  # while it runs
    assert order[0] == "first" and sorted(order) == ["first", "second", "third"]
    if rule != "any_succeeded":  # any_succeeded lets `third` start as soon as `first` completed
        assert order == ["first", "second", "third"]
