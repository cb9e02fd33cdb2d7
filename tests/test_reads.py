"""The Queue's reads for tools (the rows the board and the CLI draw), on both backends: each
agrees with the DataFrame a person reads, and refuses bad input by name."""

from __future__ import annotations

import pytest

import nbqueue
from nbqueue import Queue, State


def test_graph_rows_and_relatives_agree_with_the_graph(queue: Queue) -> None:
    a = queue.enqueue({"a": 1})
    b = queue.enqueue({"b": 1})
    child = queue.enqueue({"c": 1}, after=[a, b])
    rows = queue.graph_rows(child)
    frame = queue.graph(child)
    assert [(job.id, parents) for job, parents in rows] == [
        (int(i), list(p)) for i, p in zip(frame["id"], frame["parents"], strict=True)
    ]
    assert dict((job.id, sorted(parents)) for job, parents in rows)[child.id] == [a.id, b.id]
    assert len(queue.graph_rows(child, limit=2)) == 2
    assert queue.relatives(child) == ([a.id, b.id], [])
    assert queue.relatives(a.id) == ([], [child.id])


def test_what_blocks_names_the_parent_to_requeue(queue: Queue) -> None:
    parent = queue.enqueue({"p": 1}, max_retries=0)
    child = queue.enqueue({"c": 1}, after=[parent])
    assert queue.what_blocks([queue.get(child.id)]) == {child.id: f"waiting on #{parent.id} (pending)"}
    claimed = queue.claim()
    assert claimed is not None and claimed.id == parent.id
    assert queue.fail(claimed, "boom") == "dead"
    doomed = queue.get(child.id)
    assert doomed.status is State.UPSTREAM_FAILED
    assert queue.what_blocks([doomed]) == {child.id: f"waiting on dead #{parent.id}: requeue it"}
    assert queue.what_blocks([queue.get(parent.id)]) == {}


def test_find_returns_the_jobs_that_exist(queue: Queue) -> None:
    a = queue.enqueue({"a": 1})
    found = queue.find([a.id, a.id + 1000])
    assert list(found) == [a.id]
    assert found[a.id].payload == {"a": 1}


def test_step_rows_agree_with_steps_and_preview_cuts_values(queue: Queue) -> None:
    @queue.task(name="reads.stepper")
    def stepper() -> int:
        nbqueue.step("long", lambda: "x" * 500)
        return nbqueue.step("short", lambda: 7)

    job = stepper.enqueue()
    with queue.worker() as worker:
        worker.run_until_idle()
    assert job.result(timeout=10) == 7
    rows = queue.step_rows(job)
    assert [r.name for r in rows] == list(queue.steps(job)["step"]) == ["long", "short"]
    previews = queue.step_rows(job.id, preview=20)
    assert len(previews[0].value) == 20
    assert previews[1].value == "7"


def test_pending_per_task_and_task_names(queue: Queue) -> None:
    @queue.task(name="reads.counted")
    def counted(n: int) -> int:
        return n

    counted.enqueue(1)
    counted.schedule(args=(2,), queue="other")
    queue.enqueue({"raw": 1})
    assert queue.pending_per_task() == {"reads.counted": 2, None: 1}
    assert queue.pending_per_task(["other"]) == {"reads.counted": 1}
    assert queue.task_names("pending") == ["reads.counted"]
    assert queue.task_names(["completed", "dead"]) == []
    with pytest.raises(nbqueue.InvalidArgument, match="unknown status 'pendng'"):
        queue.task_names("pendng")
    assert queue.pending_per_task("other") == {"reads.counted": 1}
    with pytest.raises(nbqueue.InvalidArgument, match="queues must name at least one queue"):
        queue.pending_per_task([])


def test_schedule_rows_agree_with_schedules(queue: Queue) -> None:
    @queue.periodic(every=60, name="reads.tick")
    def tick() -> None: ...

    rows = queue.schedule_rows()
    assert [r["name"] for r in rows] == list(queue.schedules()["name"]) == ["reads.tick"]
    assert rows[0]["stored"] is False


def test_cell_task_runs_queued_code_in_the_namespace_given(queue: Queue) -> None:
    namespace: dict[str, object] = {"base": 40}
    task = queue.cell_task(namespace)
    job = task.enqueue("answer = base + 2\nanswer")
    with queue.worker(allow=[task.name]) as worker:
        worker.run_until_idle()
    assert job.result(timeout=10) == 42
    assert namespace["answer"] == 42


def test_missing_tasks_are_pending_jobs_no_task_here_runs(queue: Queue) -> None:
    @queue.task(name="reads.gone")
    def gone(n: int) -> int:
        return n

    gone.map([1, 2])
    gone.schedule(args=(3,), queue="other")
    queue.enqueue({"raw": 1})  # a payload job waits for a claim, not for a function
    assert queue.missing_tasks() == {}
    nbqueue.tasks.unregister("reads.gone")
    assert queue.missing_tasks() == {"reads.gone": 3}
    assert queue.missing_tasks("other") == {"reads.gone": 1}
    with queue.worker(queues=["other"]) as worker:
        assert worker.status()["missing_tasks"] == {"reads.gone": 1}
