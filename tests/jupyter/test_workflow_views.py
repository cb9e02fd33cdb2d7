"""What the board, the graph view and the CLI show of workflows: parents, children, what a waiting
job waits for, steps, and the graph drawn as SVG (nodes coloured by state)."""

from __future__ import annotations

import html
import json
import re
from collections.abc import Iterator
from typing import Any

import pytest

import nbqueue
from nbqueue import Queue
from nbqueue.dag import COLOURS, MAX_COLUMN, MAX_LEVELS, levels, svg
from nbqueue.jupyter.render import job_detail
from nbqueue.jupyter.views import GraphView, JobBoard
from tests.helpers import run_cli, wait_until


def nodes(drawing: str) -> dict[int, str]:
    """job id -> state, as the SVG draws them."""
    return {int(i): s for i, s in re.findall(r"data-job-id='(\d+)' data-state='(\w+)'", drawing)}


def fail_next(q: Queue) -> nbqueue.Job:
    job = q.claim()
    assert job is not None
    q.fail(job, "ConnectionError: 503 from the search API", retry=False)
    return job


def complete_next(q: Queue) -> nbqueue.Job:
    job = q.claim()
    assert job is not None
    q.complete(job, {"ok": job.id})
    return job


@pytest.fixture
def views() -> Iterator[list[Any]]:
    built: list[Any] = []
    yield built
    for view in built:
        view.close()
    wait_until(lambda: not any(v.live for v in built), 5, "view timers stopped")


def test_a_doomed_job_says_which_dead_job_to_requeue(queue: Queue, views: list[Any]) -> None:
    search = queue.enqueue({"search": 1})
    summary = queue.enqueue({"summary": 1}, after=[search])
    other = queue.enqueue({"other": 1})
    late = queue.enqueue({"late": 1}, after=[other])
    fail_next(queue)
    listed = queue.jobs()
    notes = queue.what_blocks(listed)
    assert notes[summary.id] == f"waiting on dead #{search.id}: requeue it"
    assert notes[late.id] == f"waiting on #{other.id} (pending)"
    board = JobBoard(queue, interval=3600, chart=False)
    views.append(board)
    assert f"waiting on dead #{search.id}: requeue it" in board.table.value
    assert f"waiting on #{other.id} (pending)" in board.table.value


def test_the_detail_pane_shows_parents_children_the_graph_and_steps(queue: Queue, views: list[Any]) -> None:
    @queue.task()
    def research(topic: str) -> str:
        return str(nbqueue.step("plan", lambda: f"plan for {topic}"))

    root = research.enqueue("owls")
    left = queue.enqueue({"left": 1}, after=[root])
    right = queue.enqueue({"right": 1}, after=[root])
    join = queue.enqueue({"join": 1}, after=[left, right])
    with queue.worker():
        root.result(timeout=30)
    board = JobBoard(queue, interval=3600, chart=False)
    views.append(board)
    board.select(root.id)
    detail = board.detail.value
    assert f"data-job-id='{left.id}'" in detail and f"data-job-id='{right.id}'" in detail
    assert "<b>children</b>" in detail and "nbqueue-graph" in detail
    assert nodes(detail) == {
        root.id: "completed",
        left.id: "pending",
        right.id: "pending",
        join.id: "blocked",
    }
    assert "data-step='plan'" in detail and "plan for owls" in detail
    board.select(join.id)
    assert f"waiting on #{left.id} (pending), #{right.id} (pending)" in board.detail.value
    assert "all_succeeded" in board.detail.value


def test_a_lone_job_has_no_family_section() -> None:
    assert "parents" not in job_detail(None)


def test_the_graph_view_redraws_as_jobs_move(queue: Queue, views: list[Any]) -> None:
    with queue.workflow("research") as wf:
        plan = queue.enqueue({"plan": 1})
        hits = [queue.enqueue({"hit": nbqueue.result_of(plan), "i": i}) for i in range(3)]
        queue.enqueue({"write": nbqueue.results_of(hits)})
    view = GraphView(queue, wf, interval=3600)
    views.append(view)
    assert "graph of workflow 'research'" in html.unescape(view.drawing.value)
    assert set(nodes(view.drawing.value).values()) == {"pending", "blocked"}
    complete_next(queue)
    fail_next(queue)
    view.refresh()
    drawn = nodes(view.drawing.value)
    assert drawn[plan.id] == "completed" and drawn[hits[0].id] == "dead"
    assert sorted(drawn.values()).count("upstream_failed") == 1
    assert "data-state='upstream_failed'" in view.counts_html.value
    assert wf._repr_html_().startswith("<svg")  # a workflow shows its graph in a notebook


def test_svg_lays_out_levels_and_folds_a_wide_level(queue: Queue) -> None:
    root = queue.enqueue({"root": 1})
    children = [queue.enqueue({"c": i}, after=[root]) for i in range(MAX_COLUMN + 30)]
    join = queue.enqueue({"join": 1}, after=children)
    graph = queue.manager.links.graph(root)
    level = levels(graph)
    assert level[root.id] == 0 and level[join.id] == 2 and {level[c.id] for c in children} == {1}
    drawing = svg(graph)
    assert len(nodes(drawing)) == 1 + MAX_COLUMN + 1
    assert "data-count='30'" in drawing and "+30 more" in drawing and "30 blocked" in drawing
    assert COLOURS[nbqueue.State.BLOCKED] in drawing
    assert "<script" not in svg(
        [(queue.get(queue.enqueue({"x": 1}, queue="<script>alert(1)</script>").id), [])]
    )


def test_the_graph_view_redraws_only_when_a_job_moved(queue: Queue, views: list[Any]) -> None:
    """The live graph refreshes every second; its drawing (2 MB for a 5,000-job workflow) is made
    again only when a job it shows moved: a refresh with nothing new keeps the very same value
    (a widget stores whatever it is given, even text equal to what it had)."""
    with queue.workflow("steady") as wf:
        first = queue.enqueue({"n": 0})
        queue.enqueue({"n": 1}, after=[first])
    view = GraphView(queue, wf, interval=3600)
    views.append(view)
    drawn = view.drawing.value
    view.refresh()
    assert view.drawing.value is drawn, "the drawing was made again although no job moved"
    complete_next(queue)
    view.refresh()
    assert view.drawing.value is not drawn
    assert set(nodes(view.drawing.value).values()) == {"completed", "pending"}


def test_svg_of_a_long_chain_folds_the_deep_levels(queue: Queue) -> None:
    """A chain deeper than MAX_LEVELS draws its first levels and one node for the rest, so the
    drawing of a 5,000-level chain stays kilobytes (it was 2 MB)."""
    with queue.workflow("long") as wf:
        last = queue.enqueue({"n": 0})
        for n in range(1, MAX_LEVELS + 50):
            last = queue.enqueue({"n": n}, after=[last])
    drawing = svg(queue.manager.links.graph(wf))
    assert sorted(nodes(drawing)) == [j.id for j in wf.jobs[:MAX_LEVELS]]
    assert "data-count='50'" in drawing and f"levels {MAX_LEVELS} and deeper: 50 blocked" in drawing
    assert len(drawing) < 120_000


def test_cli_graph_and_steps(queue: Queue, queue_target: str) -> None:
    @queue.task()
    def plan() -> int:
        return int(nbqueue.step("count", lambda: 3))

    first = plan.enqueue()
    second = queue.enqueue({"then": 1}, after=[first])
    with queue.worker():
        first.result(timeout=30)

    def cli(*args: str) -> Any:
        done = run_cli(args[0], queue_target, *args[1:], "--json")
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    graph = cli("graph", str(second.id))
    assert [(r["id"], r["status"], r["parents"]) for r in graph] == [
        (first.id, "completed", []),
        (second.id, "pending", [first.id]),
    ]
    steps = cli("steps", str(first.id))
    assert [(s["step"], s["status"], s["value"]) for s in steps] == [("count", "completed", 3)]
