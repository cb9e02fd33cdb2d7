"""Durable steps on both backends: recorded once, returned on every later run, matched by name."""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from typing import Any

import pytest

import nbqueue
from nbqueue import Queue, State
from tests.helpers import QUICK_RETRY, MakeQueue


@pytest.fixture
def quick(make_queue: MakeQueue) -> Queue:
    """A queue whose retries are due a tenth of a second later."""
    return make_queue(backoff=QUICK_RETRY)


def test_a_retry_gets_recorded_steps_without_calling_them_again(quick: Queue) -> None:
    calls: Counter[str] = Counter()

    def fetch(name: str) -> dict[str, Any]:
        calls[name] += 1
        return {"page": name, "words": len(name)}

    @quick.task(max_retries=3)
    def research(topic: str) -> list[Any]:
        plan = nbqueue.step("plan", fetch, topic)
        pages = [nbqueue.step(f"fetch:{u}", fetch, u) for u in ("a", "bb")]
        if calls["boom"] < 2:  # the first two runs crash after their steps
            calls["boom"] += 1
            raise ConnectionError("the summariser is down")
        return [plan, pages, nbqueue.step("summary", fetch, "summary")]

    job = research.enqueue("cats")
    with quick.worker():
        value = job.result(timeout=30)
    assert value == [
        {"page": "cats", "words": 4},
        [{"page": "a", "words": 1}, {"page": "bb", "words": 2}],
        {"page": "summary", "words": 7},
    ]
    assert calls == Counter({"cats": 1, "a": 1, "bb": 1, "summary": 1, "boom": 2})
    frame = quick.steps(job)
    assert list(frame["step"]) == ["plan", "fetch:a", "fetch:bb", "summary"]
    assert list(frame["status"]) == ["completed"] * 4
    assert list(frame["attempt"]) == [1, 1, 1, 3]
    assert frame["value"].iloc[1] == {"page": "a", "words": 1}


def test_a_step_that_raises_is_recorded_failed_and_called_again(quick: Queue) -> None:
    tries: list[int] = []

    def flaky() -> str:
        tries.append(1)
        if len(tries) == 1:
            raise TimeoutError("slow API")
        return "ok"

    @quick.task(max_retries=2)
    def job_fn() -> str:
        return str(nbqueue.step("call", flaky))

    job = job_fn.enqueue()
    with quick.worker():
        assert job.result(timeout=30) == "ok"
    assert len(tries) == 2
    frame = quick.steps(job)
    assert list(frame["status"]) == ["completed"] and frame["value"].iloc[0] == "ok"
    assert frame["attempt"].iloc[0] == 2


def test_a_failed_step_shows_its_error_until_a_run_succeeds(queue: Queue) -> None:
    @queue.task(max_retries=0)
    def broken() -> None:
        nbqueue.step("parse", lambda: int("x"))

    job = broken.enqueue()
    with queue.worker():
        with pytest.raises(nbqueue.JobFailed):
            job.result(timeout=30)
    frame = queue.steps(job)
    assert list(frame["status"]) == ["failed"] and frame["value"].iloc[0] is None
    assert "ValueError: invalid literal" in frame["error"].iloc[0]


def test_a_second_call_with_the_same_name_gets_the_first_value(queue: Queue) -> None:
    @queue.task()
    def twice() -> list[int]:
        return [nbqueue.step("n", lambda: 1), nbqueue.step("n", lambda: 2)]

    job = twice.enqueue()
    with queue.worker():
        assert job.result(timeout=30) == [1, 1]
    assert list(queue.steps(job)["step"]) == ["n"]


def test_parallel_steps_in_threads_and_coroutines_are_each_recorded_once(queue: Queue) -> None:
    calls: Counter[str] = Counter()
    lock = threading.Lock()

    def work(name: str) -> str:
        with lock:
            calls[name] += 1
        return name.upper()

    async def awork(name: str) -> str:
        await asyncio.sleep(0.01)
        return work(name)

    @queue.task()
    def threaded() -> list[Any]:
        results: dict[int, Any] = {}

        def one(i: int) -> None:
            results[i] = nbqueue.step(f"t{i}", work, f"t{i}")

        threads = [threading.Thread(target=one, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return [results[i] for i in range(6)]

    @queue.task()
    async def gathered() -> list[Any]:
        return list(await asyncio.gather(*(nbqueue.step(f"a{i}", awork, f"a{i}") for i in range(6))))

    t, g = threaded.enqueue(), gathered.enqueue()
    with queue.worker(concurrency=2):
        assert t.result(timeout=30) == [f"T{i}" for i in range(6)]
        assert g.result(timeout=30) == [f"A{i}" for i in range(6)]
    assert set(calls.values()) == {1} and len(calls) == 12
    assert sorted(queue.steps(g)["step"]) == [f"a{i}" for i in range(6)]


def test_replay_forgets_a_step_and_those_after_it(clocked_queue: Queue, clock: Any) -> None:
    q = clocked_queue
    calls: Counter[str] = Counter()

    def record(name: str) -> str:
        calls[name] += 1
        clock.advance(1)  # each step finishes a second after the one before
        return f"{name}-{calls[name]}"

    @q.task()
    def pipeline() -> list[str]:
        return [nbqueue.step(n, record, n) for n in ("plan", "search", "summary")]

    job = pipeline.enqueue()
    claimed = q.claim()
    assert claimed is not None
    q.complete(claimed, _run_in_context(q, claimed, pipeline.fn))
    assert q.get(job.id).value == ["plan-1", "search-1", "summary-1"]

    replayed = q.replay(job, from_step="search")
    assert replayed.status is State.PENDING
    assert list(q.steps(job)["step"]) == ["plan"]
    claimed = q.claim()
    assert claimed is not None
    q.complete(claimed, _run_in_context(q, claimed, pipeline.fn))
    assert q.get(job.id).value == ["plan-1", "search-2", "summary-2"]
    assert calls == Counter({"plan": 1, "search": 2, "summary": 2})

    q.replay(job)  # no step named: every step runs again
    assert q.steps(job).empty


def _run_in_context(q: Queue, job: nbqueue.Job, fn: Any) -> Any:
    """Run a handler as a worker would: inside the job's context, with its step book."""
    from nbqueue.context import JobContext, running

    context = JobContext(job, lambda *_: True, steps=q.manager.journal.step_book(job))
    with running(context):
        return fn(*job.args, **job.kwargs)


def test_replay_refuses_what_it_cannot_do(queue: Queue) -> None:
    job = queue.enqueue({"n": 1})
    with pytest.raises(nbqueue.InvalidArgument, match="has no step 'nope'"):
        queue.replay(job, from_step="nope")
    running = queue.claim()
    assert running is not None
    with pytest.raises(nbqueue.InvalidTransition, match="running"):
        queue.replay(job)
    with pytest.raises(nbqueue.InvalidArgument, match="step's name"):
        queue.replay(job, from_step="")


def test_step_checks_its_arguments_and_its_value(queue: Queue) -> None:
    with pytest.raises(nbqueue.InvalidArgument, match="step's name"):
        nbqueue.step("", print)
    with pytest.raises(nbqueue.InvalidArgument, match="needs a function"):
        nbqueue.step("x", 42)  # type: ignore[arg-type]
    assert nbqueue.step("outside", lambda x: x + 1, 1) == 2  # outside a job: a plain call

    @queue.task(max_retries=0)
    def bad() -> None:
        nbqueue.step("set", lambda: {1, 2})

    job = bad.enqueue()
    with queue.worker():
        with pytest.raises(nbqueue.JobFailed):
            job.result(timeout=30)
    assert "the value of step 'set'" in (queue.get(job.id).error or "")
    assert queue.steps(job).empty


def test_steps_of_a_deleted_job_go_with_it(queue: Queue) -> None:
    @queue.task()
    def one() -> int:
        return int(nbqueue.step("a", lambda: 1))

    job = one.enqueue()
    with queue.worker():
        job.result(timeout=30)
    assert len(queue.steps(job)) == 1
    queue.delete(job)
    assert queue.manager.journal.steps(job.id) == []
