"""A job graph drawn as SVG: one column per level, nodes coloured by state, edges parent -> child.

Plain SVG text, no plotting library: a notebook shows it as HTML, a browser test can
read it (each node carries data-job-id and data-state), and a worker install stays light.
A level wider than MAX_COLUMN jobs shows its first ones and one summary node for the
rest ("+9,970 more: 9,000 completed, 970 blocked"), so a fan-out of 10,000 stays legible;
levels past MAX_LEVELS are one summary node too, so a chain of 5,000 stays small (kilobytes,
not megabytes).
"""

from __future__ import annotations

import html
from collections import Counter
from collections.abc import Sequence

from .jobs import Job, State

#: Each state's colour, shared by the board's count chips, tables and this drawing.
COLOURS = {
    State.BLOCKED: "#6f42c1",
    State.PENDING: "#6c757d",
    State.RUNNING: "#0d6efd",
    State.COMPLETED: "#198754",
    State.FAILED: "#fd7e14",
    State.DEAD: "#dc3545",
    State.CANCELLED: "#adb5bd",
    State.UPSTREAM_FAILED: "#e685b5",
    State.WAITING: "#0aa2c0",
}
MAX_COLUMN = 12  # jobs drawn per level; the rest become one summary node
MAX_LEVELS = 100  # levels drawn; every job deeper is in one last summary node
WIDTH, HEIGHT = 168, 26  # a node
GAP_X, GAP_Y = 56, 10  # between levels, between nodes of a level
MORE = -1  # the summary node of a level is keyed (MORE, level)

Node = tuple[int, int]  # (job id, 0), or (MORE, level) for a level's summary


def levels(graph: Sequence[tuple[Job, list[int]]]) -> dict[int, int]:
    """Each job's level: 0 for a job with no parents among them, else one more than its deepest parent."""
    inside = {job.id for job, _ in graph}
    parents = {job.id: [p for p in ps if p in inside and p != job.id] for job, ps in graph}
    level: dict[int, int] = {}
    for start in sorted(inside):
        stack = [start]
        while stack:  # depth first, without recursion: a chain of 10,000 is fine
            job = stack[-1]
            if job in level:
                stack.pop()
                continue
            todo = [p for p in parents[job] if p not in level and p not in stack]
            if todo:
                stack.extend(todo)
                continue
            level[job] = 1 + max((level.get(p, -1) for p in parents[job]), default=-1)
            stack.pop()
    return level


def svg(graph: Sequence[tuple[Job, list[int]]], title: str = "") -> str:
    """The graph (jobs with their parents' ids, as JobManager.graph gives it) as an SVG element."""
    if not graph:
        return "<i>no jobs</i>"
    jobs = {job.id: job for job, _ in graph}
    level = levels(graph)
    columns: dict[int, list[int]] = {}
    for job_id in sorted(jobs):
        columns.setdefault(min(level[job_id], MAX_LEVELS), []).append(job_id)
    place: dict[int, Node] = {}  # where each job is drawn: its own node, or its level's summary
    rows: dict[Node, tuple[int, int]] = {}  # node -> (column, row)
    hidden: dict[int, Counter[str]] = {}
    for col, ids in sorted(columns.items()):
        room = MAX_COLUMN if col < MAX_LEVELS else 0
        shown, rest = ids[:room], ids[room:]
        for row, job_id in enumerate(shown):
            place[job_id] = (job_id, 0)
            rows[(job_id, 0)] = (col, row)
        if rest:
            hidden[col] = Counter(jobs[j].status.value for j in rest)
            rows[(MORE, col)] = (col, len(shown))
            for job_id in rest:
                place[job_id] = (MORE, col)
    edges = {(place[p], place[job.id]) for job, parents in graph for p in parents if p in place} - {
        (node, node) for node in rows
    }  # (within the deepest summary)
    tallest = max(r for _, r in rows.values()) + 1
    width = (max(columns) + 1) * (WIDTH + GAP_X) - GAP_X + 8
    height = tallest * (HEIGHT + GAP_Y) + (24 if title else 4)
    top = 22 if title else 2

    def corner(node: Node) -> tuple[int, int]:
        col, row = rows[node]
        return 4 + col * (WIDTH + GAP_X), top + row * (HEIGHT + GAP_Y)

    parts = [
        f"<svg class='nbqueue-graph' xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}' "
        f"viewBox='0 0 {width} {height}' font-family='sans-serif' font-size='12'>"
    ]
    if title:
        parts.append(f"<text x='4' y='14' font-weight='600'>{html.escape(title)}</text>")
    for parent, child in sorted(edges):
        (x1, y1), (x2, y2) = corner(parent), corner(child)
        x1, y1, y2 = x1 + WIDTH, y1 + HEIGHT // 2, y2 + HEIGHT // 2
        bend = (x2 - x1) // 2
        parts.append(
            f"<path d='M{x1},{y1} C{x1 + bend},{y1} {x2 - bend},{y2} {x2},{y2}' fill='none' "
            "stroke='#999' stroke-width='1.2'/>"
        )
    for node in sorted(rows):
        x, y = corner(node)
        if node[0] == MORE:
            counts = hidden[node[1]]
            summary = ", ".join(f"{n:,} {state}" for state, n in counts.most_common())
            if node[1] == MAX_LEVELS:
                summary = f"levels {MAX_LEVELS} and deeper: {summary}"
            label, colour, tip, attrs = (
                f"+{sum(counts.values()):,} more",
                "#495057",
                summary,
                f"class='nbqueue-more' data-count='{sum(counts.values())}'",
            )
        else:
            job = jobs[node[0]]
            label = f"#{job.id} {short(job.task)}"
            colour = COLOURS[job.status]
            tip = f"#{job.id} {job.task or '(payload)'}: {job.status.value}"
            if job.error and job.status is not State.COMPLETED:
                tip += f"\n{job.error.strip().splitlines()[-1][:200]}"
            attrs = f"class='nbqueue-node' data-job-id='{job.id}' data-state='{job.status.value}'"
        parts.append(
            f"<g {attrs}><title>{html.escape(tip)}</title>"
            f"<rect x='{x}' y='{y}' width='{WIDTH}' height='{HEIGHT}' rx='5' fill='{colour}'/>"
            f"<text x='{x + 8}' y='{y + 17}' fill='white'>{html.escape(label[:24])}</text></g>"
        )
    parts.append("</svg>")
    return "".join(parts)


def short(task: str | None) -> str:
    """A task's last dotted part ("reports.build" -> "build"); a payload job is "payload"."""
    return (task or "payload").rsplit(".", 1)[-1]
