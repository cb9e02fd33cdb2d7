"""The Queue's reads for tools (the rows the board and the CLI draw), on both backends: each
agrees with the DataFrame a person reads, and refuses bad input by name."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

import nbqueue
from nbqueue import Queue, State
from nbqueue.search import Search


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


def test_a_search_finds_jobs_by_id_task_key_arguments_error_and_output(queue: Queue) -> None:
    @queue.task(name="fetch_page", max_retries=0)
    def fetch_page(url: str) -> None:
        raise ConnectionError(f"{url}: 503 Service Unavailable")

    by_url = fetch_page.enqueue("https://example.org/a")
    keyed = queue.enqueue({"n": 1}, key="report-EU", queue="reports")
    plain = queue.enqueue({"note": "100%_done"})
    with queue.worker() as worker:
        worker.run_until_idle()
    assert queue.get(by_url.id).status is State.DEAD

    def ids(text: str, **filters: object) -> list[int]:
        found = [job.id for job in queue.jobs(search=text, brief=True, **filters)]  # type: ignore[arg-type]
        assert queue.count(search=text, **filters) == len(found)  # type: ignore[arg-type]
        return found

    assert ids("503 service") == [by_url.id]  # the error, in any case
    assert ids("example.org/A") == [by_url.id]  # the arguments
    assert ids("FETCH_") == [by_url.id]  # the task's name
    assert ids("report-eu") == [keyed.id]  # the key
    assert ids(f"#{plain.id}") == [plain.id]  # the id alone
    assert ids(f" {plain.id} ")[0] == plain.id  # the id, and any text that holds the number
    assert ids("100%_") == [plain.id] and ids("10_%") == []  # % and _ are text, not wildcards
    assert ids("example", status="pending") == [] and ids("report", queue="default") == []
    assert ids("o", queue="reports") == [keyed.id]
    assert ids("e") == [plain.id, keyed.id, by_url.id]  # newest first
    assert ids("e")[1:] == [j.id for j in queue.jobs(search="e", offset=1, limit=5)]
    frame = queue.history(search="503")
    assert frame["id"].tolist() == [by_url.id] and "503 Service" in frame["error"].iloc[0]
    assert queue.count() == 3 and queue.count(status="dead") == 1 and queue.count(status=["pending"]) == 2
    assert queue.count(search="") == 3  # an empty search is no search
    with pytest.raises(nbqueue.InvalidArgument, match="status"):
        queue.count(status="nope", search="x")


def test_a_search_reads_only_the_newest_jobs_but_any_id(queue: Queue) -> None:
    old = queue.enqueue({"word": "needle"})
    newer = [queue.enqueue({"n": n}) for n in range(3)]
    new = queue.enqueue({"word": "needle"})
    bounded = Search("needle", scanned=len(newer) + 1)  # the newest four jobs
    assert [j.id for j in queue.manager.jobs(None, None, 10, 0, search=bounded)] == [new.id]
    wide = Search("needle", scanned=10)
    assert [j.id for j in queue.manager.jobs(None, None, 10, 0, search=wide)] == [new.id, old.id]
    by_id = Search(str(old.id), scanned=1)  # an id is found however old
    assert old.id in [j.id for j in queue.manager.jobs(None, None, 10, 0, search=by_id)]


def test_dead_since_counts_the_jobs_that_died_after_a_time(queue: Queue) -> None:
    first = queue.enqueue({"n": 1}, max_retries=0)
    queue.fail(_claimed(queue), "boom")
    mark = datetime.now(UTC)
    assert queue.dead_since(mark - timedelta(minutes=1)) == 1 and queue.dead_since(mark) == 0
    queue.enqueue({"n": 2}, max_retries=0)
    queue.fail(_claimed(queue), "boom")
    assert queue.dead_since(mark) == 1
    queue.requeue([first.id])  # requeued: no longer needs anyone
    assert queue.dead_since(mark - timedelta(minutes=1)) == 1
    with pytest.raises(nbqueue.InvalidArgument):
        queue.dead_since(datetime.now())  # a naive time is refused


def _claimed(queue: Queue) -> nbqueue.Job:
    job = queue.claim()
    assert job is not None
    return job
