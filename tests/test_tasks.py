"""@q.task: names, direct calls, enqueue / schedule, and the process-wide registry."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest

import nbqueue
from nbqueue import Backoff, ManualClock, Queue, tasks

MakeQueue = Callable[..., Queue]


def at(clock: ManualClock, offset: float = 0.0) -> datetime:
    return datetime.fromtimestamp(clock() + offset, UTC)


def double(x: int) -> int:
    return 2 * x


def test_default_name_is_module_qualified(queue: Queue) -> None:
    task = queue.task(double)
    assert task.name == f"{double.__module__}.{double.__qualname__}"
    assert task.name.endswith("test_tasks.double")
    assert tasks.lookup(task.name) is task


def test_default_name_of_a_nested_function(queue: Queue) -> None:
    @queue.task
    def inner() -> None:
        pass

    assert inner.name == f"{__name__}.test_default_name_of_a_nested_function.<locals>.inner"


def test_name_overrides(queue: Queue) -> None:
    @queue.task(name="fetch")
    def fetch(url: str) -> str:
        return url

    assert fetch.name == "fetch"
    assert tasks.lookup("fetch") is fetch
    assert fetch.enqueue("u").task == "fetch"


def test_calling_the_task_runs_it_directly(queue: Queue) -> None:
    task = queue.task(double)
    assert task(21) == 42
    assert task(x=2) == 4
    assert sum(queue.counts().values()) == 0


def test_enqueue_uses_the_task_defaults(clocked_queue: Queue, clock: ManualClock) -> None:
    @clocked_queue.task(
        max_retries=5, queue="slow", priority=3, timeout=2.5, backoff=Backoff(base=3, cap=10, jitter=0)
    )
    def fetch(url: str, *, depth: int = 1) -> dict[str, Any]:
        return {"url": url, "depth": depth}

    job = fetch.enqueue("https://example.org", depth=2)
    assert job.status == "pending"
    assert job.task == fetch.name
    assert job.args == ["https://example.org"]
    assert job.kwargs == {"depth": 2}
    assert (job.queue, job.priority, job.max_retries, job.timeout) == ("slow", 3, 5, 2.5)
    assert job.run_at == at(clock)
    # The task's backoff travels with the job: the first retry waits 3 s.
    claimed = clocked_queue.claim(queues="slow")
    assert claimed is not None
    assert clocked_queue.fail(claimed, "x") == "retry"
    assert clocked_queue.get(job.id).run_at == at(clock, 3)


def test_schedule_with_every_option(clocked_queue: Queue, clock: ManualClock) -> None:
    @clocked_queue.task
    def fetch(url: str, retries: int = 0) -> None:
        pass

    job = fetch.schedule(
        args=("u",), kwargs={"retries": 2}, delay=30, priority=5, key="fetch:u", queue="slow"
    )
    assert job.args == ["u"]
    assert job.kwargs == {"retries": 2}
    assert job.run_at == at(clock, 30)
    assert (job.priority, job.key, job.queue) == (5, "fetch:u", "slow")
    assert fetch.schedule(args=("other",), key="fetch:u").id == job.id  # key held

    later = fetch.schedule(args=["v"], run_at=at(clock, 90), max_retries=0)
    assert later.run_at == at(clock, 90)
    assert later.max_retries == 0
    assert later.queue == "default"

    clock.advance(29)
    assert clocked_queue.claim() is None
    clock.advance(1)
    claimed = clocked_queue.claim(queues="slow")
    assert claimed is not None and claimed.id == job.id


def test_schedule_defaults(queue: Queue) -> None:
    task = queue.task(double)
    job = task.schedule()
    assert job.args == [] and job.kwargs == {}
    assert (job.queue, job.priority, job.key) == ("default", 0, None)


@pytest.mark.parametrize(
    "kwargs",
    [{"args": "abc"}, {"args": 5}, {"kwargs": [1]}, {"delay": -1}, {"priority": "high"}, {"key": ""}],
    ids=repr,
)
def test_schedule_refuses_bad_arguments(queue: Queue, kwargs: dict[str, Any]) -> None:
    task = queue.task(double)
    with pytest.raises(nbqueue.InvalidArgument):
        task.schedule(**kwargs)
    assert sum(queue.counts().values()) == 0


def test_bad_task_options_are_refused(queue: Queue) -> None:
    for options in ({"max_retries": -1}, {"queue": ""}, {"priority": 0.5}, {"name": ""}, {"timeout": -1}):
        with pytest.raises(nbqueue.InvalidArgument):
            queue.task(**options)(double)


def test_unknown_task_lookup() -> None:
    with pytest.raises(nbqueue.TaskNotFound):
        tasks.lookup("no.such.task")


def test_registration_is_process_wide(make_queue: MakeQueue) -> None:
    queue_a = make_queue()
    queue_b = make_queue()

    @queue_a.task(name="shared.add")
    def add(a: int, b: int) -> int:
        return a + b

    job = add.enqueue(2, 3)  # enqueued through Queue A
    with queue_b.worker(lease=5, worker_id="worker-of-b") as worker:
        assert worker.manager is queue_b.manager
        assert job.result(timeout=10) == 5
    done = queue_a.get(job.id)
    assert done.status == "completed"
    assert done.worker_id == "worker-of-b"


def test_newer_definition_wins(queue: Queue) -> None:
    @queue.task(name="versioned")
    def v1() -> int:
        return 1

    @queue.task(name="versioned")
    def v2() -> int:
        return 2

    job = v1.enqueue()
    queue.worker(lease=5).run_until_idle(timeout=10)
    assert job.result(timeout=5) == 2
