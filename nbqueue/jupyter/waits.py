"""The HTML of jobs that wait: pure functions, data in, HTML out (no widgets, no queue).

The board's "needs you" entries (needs.py), the notes of waiting rows in its table, and the
detail pane's record of what a job waited for and who answered, with when.
"""

from __future__ import annotations

import html
import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from ..clock import from_us
from ..dag import COLOURS
from ..inbox import describe, span
from ..jobs import Job, State, shown_task
from ..records import StepRow, WaitRow
from .render import STEP_PREVIEW, ago, step_value

COLOUR = COLOURS[State.WAITING]
STEPS_SHOWN = 3  # the last steps a "needs you" entry shows, for context
# Steps an integration records for itself (a LangGraph job's thread and interrupt names): not
# what the job knows, so not shown as its context.
BOOKKEEPING = "langgraph:"


def for_a_person(row: WaitRow | None) -> bool:
    """True for a wait a person answers: an event with a prompt, not yet answered nor expired."""
    return (
        row is not None
        and row.kind == "event"
        and bool(row.prompt)
        and row.value is None
        and row.expired_at is None
    )


def choices_of(row: WaitRow) -> list[Any]:
    """The values a wait accepts ([]: any JSON value)."""
    if not row.choices:
        return []
    try:
        found = json.loads(row.choices)
    except ValueError:  # written by hand: no buttons, the JSON box still answers
        return []
    return found if isinstance(found, list) else []


def label(value: Any) -> str:
    """A choice as its button says it: a text bare, any other value as JSON."""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def due(row: WaitRow, now_us: int) -> str:
    """ "answer within 13 d", "no deadline", or "deadline passed" (the job wakes in a moment)."""
    if row.deadline is None:
        return "no deadline"
    if row.deadline <= now_us:
        return "deadline passed: the job wakes (its default, or WaitExpired)"
    return f"answer within {span((row.deadline - now_us) / 1e6)}"


def _when(us: int | None, now: datetime) -> str:
    """A time as the board says it ("4 s ago"), the UTC time on hover."""
    at = from_us(us)
    if at is None:
        return ""
    return f"<span title='{at:%Y-%m-%d %H:%M:%S} UTC'>{html.escape(ago(at, now))}</span>"


def entry_html(job: Job, row: WaitRow, steps: Sequence[StepRow], now_us: int) -> str:
    """One job a person is asked about: who asks (the job and its wait), since when, the deadline,
    the question, and the last steps it recorded (what it knows so far)."""
    now = from_us(now_us) or datetime.now(UTC)
    task = html.escape(shown_task(job.task))
    deadline = due(row, now_us)
    urgent = row.deadline is not None and row.deadline - now_us < 3600 * 1e6
    head = (
        f"<b>#{job.id} {task}</b> · {html.escape(row.name)} · asked {_when(row.reached_at, now)}"
        f" · <span class='nbqueue-due' style='color:{COLOURS[State.DEAD] if urgent else '#495057'}'"
        f"{_deadline_title(row)}>{html.escape(deadline)}</span>"
    )
    known = [s for s in steps if not s.name.startswith(BOOKKEEPING)]
    recent = [
        f"<span class='nbqueue-need-step'>{html.escape(s.name)} = <code>{html.escape(_step(s))}</code></span>"
        for s in known[-STEPS_SHOWN:]
    ]
    context = (
        "<div style='font-size:11px;color:#6c757d;white-space:nowrap;overflow:hidden;"
        f"text-overflow:ellipsis'>steps: {' · '.join(recent)}</div>"
        if recent
        else ""
    )
    prompt = html.escape(row.prompt or "")
    return (
        f"<div class='nbqueue-need' data-job-id='{job.id}' style='line-height:18px'>"
        f"<div style='font-size:12px;color:#495057'>{head}</div>"
        f"<div class='nbqueue-prompt' style='font-size:14px;font-weight:600;margin:2px 0;"
        f"white-space:pre-wrap'>{prompt}</div>{context}</div>"
    )


def _deadline_title(row: WaitRow) -> str:
    at = from_us(row.deadline)
    return "" if at is None else f" title='{at:%Y-%m-%d %H:%M:%S} UTC'"


def _step(step: StepRow) -> str:
    if step.error is not None:
        return "failed"
    return "" if step.value is None else step_value(str(step.value))[:STEP_PREVIEW]


def heading(people: int, shown: int, more_read: bool) -> str:
    """The section's title: "NEEDS YOU · 3 jobs wait for a person", and how many are not shown."""
    jobs = f"{people:,} job{'' if people == 1 else 's'} wait{'s' if people == 1 else ''} for a person"
    rest = f" · the first {shown} shown (q.waiting() has them all)" if shown < people else ""
    cut = " · the oldest waiting jobs read: q.waiting() has the rest" if more_read else ""
    return (
        f"<div class='nbqueue-needs-head' style='font-weight:700;color:{COLOUR};margin-top:4px'>"
        f"NEEDS YOU <span style='font-weight:400;color:#495057'>· {jobs}{rest}{cut}</span></div>"
    )


def group_html(task: str | None, name: str, n: int) -> str:
    """The line before a group's buttons: "3 publish jobs wait for review, alike:"."""
    return (
        f"<span class='nbqueue-need-group' style='font-size:12px;margin-right:6px'>{n} "
        f"<b>{html.escape(shown_task(task))}</b> jobs wait for <b>{html.escape(name)}</b>, alike:</span>"
    )


def note(job: Job, row: WaitRow | None, now_us: int, known: dict[int, Job], parents: list[int]) -> str:
    """What a waiting job in the table waits for: "needs you: Publish draft 3? (answer within
    13 d)", "sleep cool-off, wakes in 52 min", "waiting for jobs #5 (running), #6 (pending)"."""
    if row is not None and row.kind == "jobs":
        waited = [known[p] for p in parents if p in known and not known[p].finished]
        named = ", ".join(f"#{p.id} ({p.status.value})" for p in waited[:3])
        more = f" +{len(waited) - 3} more" if len(waited) > 3 else ""
        return f"waiting for jobs {named}{more}" if waited else f"waiting for {row.prompt or 'its jobs'}"
    if for_a_person(row):
        assert row is not None
        return f"needs you: {row.prompt} ({due(row, now_us)})"
    return describe(row, now_us)


_WAITS_HEAD = ("name", "waited for", "reached", "deadline / wakes", "answer", "sent by", "sent")


def waits_html(rows: Sequence[WaitRow], now_us: int) -> str:
    """Everything a job waited for and was sent, in order: the question or sleep or jobs, when it
    was reached, its deadline, the value sent (or "expired"), who sent it and when."""
    if not rows:
        return ""
    now = from_us(now_us) or datetime.now(UTC)
    lines = []
    for r in rows:
        what = {
            "sleep": "sleep",
            "jobs": r.prompt or "jobs",
            "event": f"a person: {r.prompt}" if r.prompt else "a value (q.send)",
        }.get(r.kind or "", "sent ahead of its wait")
        if r.choices:
            what += f" ({' or '.join(label(c) for c in choices_of(r))})"
        if r.value is not None:
            answer = f"<code>{html.escape(r.value[:STEP_PREVIEW])}</code>"
        elif r.expired_at is not None:
            answer = f"<span style='color:{COLOURS[State.DEAD]}'>expired {_when(r.expired_at, now)}</span>"
        elif r.kind == "sleep" and r.deadline is not None and r.deadline <= now_us:
            answer = "woke"
        else:
            answer = f"<span style='color:{COLOUR}'>waiting</span>"
        deadline = "" if r.deadline is None else f"{from_us(r.deadline):%Y-%m-%d %H:%M:%S}"
        cells = (
            html.escape(r.name),
            html.escape(what),
            _when(r.reached_at, now),
            deadline,
            answer,
            html.escape(r.sent_by or ""),
            _when(r.sent_at, now),
        )
        lines.append(
            f"<tr data-wait='{html.escape(r.name)}'>"
            + "".join(f"<td style='text-align:left;padding:1px 8px'>{c}</td>" for c in cells)
            + "</tr>"
        )
    head = "".join(f"<th style='text-align:left;padding:1px 8px'>{h}</th>" for h in _WAITS_HEAD)
    return (
        "<div><b>waits</b> <span style='font-size:11px;color:#6c757d'>(times UTC)</span>"
        f"<table class='nbqueue-waits' style='font-size:12px'><tr>{head}</tr>{''.join(lines)}</table></div>"
    )
