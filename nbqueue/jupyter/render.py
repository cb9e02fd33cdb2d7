"""The board's and the dead-letter view's HTML: pure functions, data in, HTML out (no widgets,
no queue), so each is tested on its own. The widgets that show them are in views.py."""

from __future__ import annotations

import html
import json
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

from .. import notebooks
from ..dag import COLOURS, short
from ..frames import last_line
from ..jobs import FINISHED, Job, State, attempt_text, shown_task
from ..tracebacks import user_first
from .lab import open_in_lab

STEP_PREVIEW = 120  # characters of a step's value the detail pane reads and shows


DETAIL_LIMIT = 20_000  # characters of a payload, result, error or output the detail pane shows


def pill(state: State, n: int) -> str:
    return (
        f"<span class='nbqueue-count' data-state='{state.value}' data-count='{n}' "
        f"style='display:inline-block;margin:0 6px 4px 0;padding:2px 10px;border-radius:12px;"
        f"background:{COLOURS[state]};color:white;font-weight:600'>{state.value} {n}</span>"
    )


def legend(states: Iterable[State]) -> str:
    """What a graph's colours mean: a swatch and a name for each state drawn."""
    drawn = set(states)
    keys = [
        f"<span style='display:inline-block;width:10px;height:10px;border-radius:2px;margin:0 3px 0 8px;"
        f"background:{COLOURS[s]}'></span>{s.value}"
        for s in State
        if s in drawn
    ]
    style = "font-size:11px;color:#495057"
    return f"<div class='nbqueue-legend' style='{style}'>{''.join(keys)} · click a job to open it</div>"


def ago(when: datetime | None, now: datetime) -> str:
    """How long ago, in the fewest characters that still read: "4 s ago", "3 min ago"."""
    if when is None:
        return ""
    seconds = (now - when).total_seconds()
    if seconds < 0:
        later = -seconds
        return (
            f"in {later:.0f} s"
            if later < 60
            else f"in {later / 60:.0f} min"
            if later < 3600
            else f"{when:%d %b %H:%M}"
        )
    if seconds < 60:
        return f"{seconds:.0f} s ago"
    if seconds < 3600:
        return f"{seconds / 60:.0f} min ago"
    if seconds < 86400:
        return f"{seconds / 3600:.0f} h ago"
    return f"{when:%d %b %Y}"


def resumes_in(when: datetime, now: datetime) -> str:
    """How long until `when`, for a pause: "4 s", "3 min", "2 h" (at least 1 s)."""
    seconds = max(1.0, (when - now).total_seconds())
    if seconds < 60:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 3600 else f"{seconds / 3600:.1f} h"


def _paused_until(row: Any) -> datetime | None:
    return None if str(row.paused_until) in ("NaT", "None") else row.paused_until.to_pydatetime()


def held_back_notes(jobs: Sequence[Job], limits: Any, now: datetime) -> dict[int, str]:
    """What holds each pending job back among its limit keys (`limits`: q.limits()): "waiting on
    limit openai: paused (HTTP 429), resumes in 4 s", or "waiting on limit openai: 4/4 in flight"."""
    held: dict[str, str] = {}
    for row in limits.itertuples(index=False):
        if isinstance(row.damaged, str):
            continue
        paused = _paused_until(row)
        if paused is not None and paused > now:
            held[row.key] = f"paused ({row.paused_why or 'by hand'}), resumes in {resumes_in(paused, now)}"
        elif str(row.concurrency) != "<NA>" and row.in_flight >= row.concurrency:
            held[row.key] = f"{row.in_flight}/{row.concurrency} in flight"
    notes = {}
    for job in jobs:
        keys = [key for key in (job.limits or {}) if key in held] if job.status is State.PENDING else []
        if keys:
            notes[job.id] = "waiting on " + "; ".join(f"limit {key}: {held[key]}" for key in keys)
    return notes


def _titled(text: str, title: str | None = None, style: str = "") -> str:
    """Text that may be clipped, whole on hover; both escaped."""
    styled = f" style='{style}'" if style else ""
    return f"<span title='{html.escape(title or text)}'{styled}>{html.escape(text)}</span>"


def _progress_cell(job: Job) -> str:
    """A small bar and the message a running job reported with nbqueue.progress() (a job that
    is not running shows none: its last report is history, kept in the detail pane)."""
    progress = job.progress
    if progress is None or job.status is not State.RUNNING:
        return ""
    message = html.escape(progress.message)
    if progress.fraction is None:
        return f"<span class='nbqueue-progress' title='{message}'>{progress.done:g} {message}</span>"
    percent = round(progress.fraction * 100)
    return (
        f"<span class='nbqueue-progress' data-percent='{percent}' title='{message}'>"
        f"<span style='display:inline-block;width:60px;height:8px;background:#e9ecef;border-radius:4px;"
        f"vertical-align:middle'><span style='display:block;width:{percent}%;height:8px;"
        f"background:{COLOURS[job.status]};border-radius:4px'></span></span> {percent}% {message}</span>"
    )


def _attempt_cell(said: str) -> str:
    """The attempt column: "2 of 4", "next: attempt 1 of 4"; "never run", whole on hover."""
    short = "never run" if said.startswith("never run") else said.removeprefix("attempt ")
    return _titled(short, said)


def _text_cell(job: Job, note: str | None = None, silent: bool = False, last: str = "") -> str:
    """What a person should read about the job: its worker gone silent, what it waits for, what
    it emitted last (`last`, HTML) or its last error (the whole error on hover, and in the
    detail pane)."""
    if silent:
        return (
            f"<span class='nbqueue-silent' style='color:{COLOURS[State.DEAD]}' "
            f"title='{html.escape(job.worker_id or '')}'>worker silent: its process is gone or stopped "
            "beating (recovered when found or at lease end)</span>"
        )
    if note:  # what a blocked or upstream_failed job waits for says more than its error
        colour = COLOURS[job.status]
        return f"<span class='nbqueue-waiting'>{_titled(note, style=f'color:{colour}')}</span>"
    if last:  # a running job's stream says what it does now; an earlier attempt's error is history
        return last
    error = html.escape(last_line(job.error) or "")
    if error and job.status is State.COMPLETED:  # kept in history; say it is not current
        return (
            f"<span style='color:#6c757d;font-style:italic' title='{error}'>earlier attempt: {error}</span>"
        )
    return f"<span title='{error}'>{error}</span>" if error else ""


_COLUMNS = (  # heading, width: fixed widths where the text is short, shares of the rest elsewhere
    ("id", "72px"),  # "#4000123": seven digits (12 px text, 6 px padding each side)
    ("task", "14%"),
    ("queue", "8%"),
    ("status", "124px"),  # "upstream_failed", bold
    ("attempt", "148px"),  # "next: attempt 1 of 4"
    ("updated", "76px"),
    ("progress", "16%"),
    ("error / waiting on", "auto"),
)


PROGRESS = 6  # the progress column's place: the dead-letter view's tables leave it out


def jobs_table(
    jobs: list[Job],
    notes: dict[int, str] | None = None,
    *,
    running: list[Job] | None = None,
    silent: set[int] | None = None,
    selected: int = 0,
    now: datetime | None = None,
    progress: bool = True,
    last: dict[int, str] | None = None,
) -> str:
    """An HTML table of jobs (escaped), one line each; `running` jobs pinned above the rest under
    their own heading; `notes` say what waiting jobs wait for; `silent` running jobs are marked;
    `progress=False` leaves the progress column out (jobs that cannot be running); `last`: what
    running jobs emitted last (HTML)."""
    now = now or datetime.now(UTC)
    notes, silent, last = notes or {}, silent or set(), last or {}
    keep = [i for i in range(len(_COLUMNS)) if progress or i != PROGRESS]
    cols = "".join(f"<col style='width:{_COLUMNS[i][1]}'>" for i in keep)
    head = "".join(f"<th>{_COLUMNS[i][0]}</th>" for i in keep)

    def row(job: Job) -> str:
        # Every value is escaped, whatever its column: a row written by hand may hold anything.
        task = html.escape(shown_task(job.task))
        when = ago(job.updated_at, now)
        cells = (
            f"#{html.escape(str(job.id))}",
            f"<span title='{html.escape(job.task or '(payload)')}'>{task}</span>",
            f"<span title='{html.escape(job.queue)}'>{html.escape(job.queue)}</span>",
            f"<span style='color:{COLOURS[job.status]};font-weight:600'>{job.status.value}</span>",
            _attempt_cell(attempt_text(job)),
            f"<span title='{job.updated_at:%Y-%m-%d %H:%M:%S} UTC'>{html.escape(when)}</span>",
            _progress_cell(job),
            _text_cell(job, notes.get(job.id), job.id in silent, last.get(job.id, "")),
        )
        chosen = " class='nbqueue-selected'" if job.id == selected else ""
        return (
            f"<tr data-row-id='{job.id}' data-job-id='{job.id}' data-status='{job.status.value}'{chosen}>"
            + "".join(f"<td>{cells[i]}</td>" for i in keep)
            + "</tr>"
        )

    def section(title: str) -> str:
        return f"<tr class='nbqueue-section'><td colspan='{len(keep)}'>{title}</td></tr>"

    body = ""
    if running:
        body += section("RUNNING NOW") + "".join(row(j) for j in running) + section("RECENT")
    body += "".join(row(j) for j in jobs) or f"<tr><td colspan='{len(keep)}'><i>no jobs</i></td></tr>"
    return (
        f"<table class='nbqueue-jobs'><colgroup>{cols}</colgroup><thead><tr>{head}</tr></thead>"
        f"<tbody>{body}</tbody></table>"
    )


_ONE_LINE = "white-space:nowrap;overflow:hidden;text-overflow:ellipsis"


OUTCOMES = (State.COMPLETED, State.DEAD, State.CANCELLED, State.UPSTREAM_FAILED)


def outcome_bar(counts: dict[str, int]) -> str:
    """One bar split by outcome (completed, dead, cancelled, upstream_failed), the unfinished
    part empty, and the numbers: "35 of 35 finished: 15 completed · 20 dead"."""
    total = sum(counts.values())
    done = sum(counts[s.value] for s in FINISHED)
    segments = "".join(
        f"<span class='nbqueue-outcome-part' data-state='{s.value}' data-count='{counts[s.value]}' "
        f"title='{counts[s.value]:,} {s.value}' style='display:inline-block;height:10px;"
        f"width:{100 * counts[s.value] / total:.3f}%;background:{COLOURS[s]}'></span>"
        for s in OUTCOMES
        if total and counts[s.value]
    )
    parts = " · ".join(
        f"<span style='color:{COLOURS[s]}'>{counts[s.value]:,} {s.value}</span>"
        for s in OUTCOMES
        if counts[s.value]
    )
    queued = counts["pending"] + counts["failed"]  # failed: queued for its retry
    rest = " · ".join(
        bit
        for bit in (
            f"{counts['running']:,} running" if counts["running"] else "",
            f"{counts['waiting']:,} waiting" if counts.get("waiting") else "",
            f"{queued:,} queued" if queued else "",
            f"{counts['blocked']:,} blocked" if counts["blocked"] else "",
        )
        if bit
    )
    return (
        f"<div class='nbqueue-outcome' data-done='{done}' data-total='{total}'>"
        f"<div style='display:flex;width:100%;max-width:720px;height:10px;background:#e9ecef;"
        f"border-radius:5px;overflow:hidden'>{segments}</div>"
        f"<div style='font-size:12px'>{done:,} of {total:,} finished{': ' + parts if parts else ''}"
        f"{' &nbsp;|&nbsp; ' + rest if rest else ''}</div></div>"
    )


RETRIED = ("failed", "timeout", "lost")  # outcomes after which the next run is the next attempt
ENDED = ("completed", "dead", "cancelled")  # after these, a further run is a fresh start (requeue)


def attempt_numbers(outcomes: Sequence[str]) -> list[tuple[int, bool]]:
    """Each run's attempt number as `attempt_text` counts it, and whether a requeue came before
    it: a snoozed or released run is not an attempt (the next run is the same attempt again),
    and a run after the job ended starts again at attempt 1."""
    numbers, attempt, fresh = [], 1, False
    for outcome in outcomes:
        numbers.append((attempt, fresh))
        fresh = outcome in ENDED
        attempt = 1 if fresh else attempt + (outcome in RETRIED)
    return numbers


def attempts_table(frame: Any) -> str:
    """Every run of a job: its attempt (counted as the header counts: snoozes are not attempts,
    a requeue starts again at 1), when it started, how long, which worker, how it ended, its
    error."""
    if frame is None or frame.empty:
        return ""
    rows = []
    numbers = attempt_numbers([str(outcome) for outcome in frame["outcome"]])
    for r, (number, fresh) in zip(frame.itertuples(index=False), numbers, strict=True):
        if fresh:
            rows.append(
                "<tr class='nbqueue-requeued'><td colspan='6' style='padding:1px 8px;color:#6c757d'>"
                "requeued: a fresh start</td></tr>"
            )
        duration = "" if r.duration != r.duration else f"{r.duration:.2f} s"  # NaN while running
        error = (last_line(r.error) if isinstance(r.error, str) else None) or ""
        colour = {"completed": COLOURS[State.COMPLETED], "suspended": COLOURS[State.WAITING]}.get(
            str(r.outcome), COLOURS[State.DEAD] if error else "#495057"
        )
        said = f"<span title='{html.escape(error)}'>{html.escape(error)}</span>"
        if r.outcome == "suspended":  # not an attempt: the job waited, and its next run goes on
            said = "<span style='color:#6c757d'>waited (holding no worker); the next run resumes it</span>"
        cells = (
            f"attempt {number}",
            f"{r.started:%Y-%m-%d %H:%M:%S}",
            duration,
            f"<span style='color:{colour}'>{html.escape(str(r.outcome))}</span>",
            _titled(f"{str(r.host).split('/')[0]}:{r.pid}", str(r.worker)),  # host, not its namespace
            said,
        )
        rows.append(
            f"<tr data-attempt='{number}' data-run='{r.attempt}'>"
            + "".join(f"<td style='padding:1px 8px;{_ONE_LINE}'>{c}</td>" for c in cells)
            + "</tr>"
        )
    widths = ("80px", "150px", "72px", "90px", "150px", "auto")
    cols = "".join(f"<col style='width:{w}'>" for w in widths)
    head = "".join(
        f"<th style='text-align:left;padding:1px 8px'>{h}</th>"
        for h in ("attempt", "started (UTC)", "took", "outcome", "worker", "error")
    )
    return (
        "<div><b>attempts</b><table class='nbqueue-attempts' style='table-layout:fixed;width:100%;"
        f"font-size:12px'><colgroup>{cols}</colgroup><tr>{head}</tr>{''.join(rows)}</table></div>"
    )


def limits_line(frame: Any, now: datetime | None = None) -> str:
    """LIMITS  openai 4/8 in flight · 500/m, next start in 0.2 s · paused (HTTP 429), resumes in
    4 s (the UTC time on hover)."""
    now = now or datetime.now(UTC)
    parts = []
    for row in frame.itertuples(index=False):
        if isinstance(row.damaged, str):  # written by hand: says so, the other keys still shown
            parts.append(
                f"<span class='nbqueue-limit nbqueue-damaged' data-key='{html.escape(str(row.key))}' "
                f"style='color:#dc3545'><b>{html.escape(str(row.key))}</b> damaged: "
                f"{html.escape(row.damaged)}</span>"
            )
            continue
        bits = [f"<b>{html.escape(str(row.key))}</b>"]
        limit = "" if row.concurrency is None or str(row.concurrency) == "<NA>" else f"/{row.concurrency}"
        held = f"{row.in_flight}{limit}"
        bits.append(f"{held} in flight")
        if isinstance(row.rate, str):
            later = f", next start in {row.next_start_in:.1f} s" if row.next_start_in else ""
            bits.append(f"{html.escape(row.rate)}{later}")
        if row.waiting:
            bits.append(f"{row.waiting} waiting")
        paused = _paused_until(row)
        if paused is not None and paused > now:
            why = html.escape(str(row.paused_why or "by hand"))
            bits.append(
                f"<span class='nbqueue-paused' style='color:#dc3545' title='{why}; until "
                f"{paused:%H:%M:%S} UTC'>paused ({why[:60]}), resumes in {resumes_in(paused, now)}</span>"
            )
        key = html.escape(str(row.key))
        parts.append(f"<span class='nbqueue-limit' data-key='{key}'>{' · '.join(bits)}</span>")
    if not parts:
        return ""
    return "<div class='nbqueue-limits'><b>LIMITS</b>&nbsp; " + " &nbsp;|&nbsp; ".join(parts) + "</div>"


def or_damage(title: str, line: Callable[[], str]) -> str:
    """One line of the board, or what stopped it (a row written by hand, say): the line says
    so and the rest of the board still shows."""
    try:
        return line()
    except Exception as exc:  # whatever a damaged row raises, it must not stop every refresh
        said = html.escape(f"{type(exc).__name__}: {exc}"[:300])
        return (
            f"<div class='nbqueue-damaged' style='color:#dc3545'><b>{title}</b>&nbsp; "
            f"cannot be read: {said}</div>"
        )


def missing_text(missing: dict[str, int]) -> list[str]:
    """One sentence per task pending jobs wait for: "no task here for 16 pending jobs of
    slow_work: define it in this notebook" (an imported one: "import pkg.mod")."""
    said = []
    for task, n in sorted(missing.items(), key=lambda item: -item[1]):
        where = shown_task(task)
        fix = (
            "define it in this notebook"
            if task.startswith("__main__.") or "." not in task
            else (f"import {task.rsplit('.', 1)[0]} here")
        )
        said.append(f"no task here for {n:,} pending job{'s' if n != 1 else ''} of {where}: {fix}")
    return said


def missing_line(missing: dict[str, int]) -> str:
    """The board's warning for pending jobs no task of this kernel runs (empty when none)."""
    said = missing_text(missing)
    if not said:
        return ""
    return (
        "<div class='nbqueue-missing' style='color:#b35c00'><b>NO TASK HERE</b>&nbsp; "
        + " &nbsp;|&nbsp; ".join(html.escape(line) for line in said)
        + "</div>"
    )


def worker_status_text(status: dict[str, Any]) -> str:
    """`%worker`'s answer in words: "worker running · 2 threads · in flight #4, #7 · 12 completed,
    1 failed · queues: all", then a line per task it lacks."""
    if not status.get("running"):
        head = "worker stopped"
    else:
        flying = status.get("in_flight") or []
        bits = [
            "worker running",
            f"{status.get('concurrency', 1)} thread{'s' if status.get('concurrency', 1) != 1 else ''}",
            ("in flight " + ", ".join(f"#{i}" for i in flying[:10])) if flying else "idle",
            f"{status.get('completed', 0)} completed, {status.get('failed', 0)} failed",
            "queues: " + (", ".join(status["queues"]) if status.get("queues") else "all"),
        ]
        if status.get("async_in_flight"):
            bits.insert(3, f"{status['async_in_flight']} coroutine(s) in flight")
        head = " · ".join(bits)
    return "\n".join([head, *missing_text(status.get("missing_tasks") or {})])


def worker_status_html(status: dict[str, Any]) -> str:
    """`worker_status_text` for a notebook: the warnings in the board's colour."""
    head, *warnings = worker_status_text(status).split("\n")
    colour = "#198754" if status.get("running") else "#6c757d"
    lines = [f"<div style='color:{colour}'>{html.escape(head)}</div>"]
    lines += [f"<div style='color:#b35c00'>{html.escape(w)}</div>" for w in warnings]
    return "<div class='nbqueue-worker'>" + "".join(lines) + "</div>"


SCHEDULES_SHOWN = 5  # the soonest schedules the board names; q.schedules() has them all


def schedules_line(rows: list[dict[str, Any]]) -> str:
    """SCHEDULES  eu-daily cron 0 6 * * MON-FRI (Europe/Berlin) · next Wed 02 Dec 05:00 here (06:00
    Europe/Berlin): the soonest schedules with their next run in this kernel's local time."""
    coming = sorted(
        (row for row in rows if row["next_run"] is not None), key=lambda row: row["next_run"].timestamp()
    )
    parts = []
    for row in coming[:SCHEDULES_SHOWN]:
        upcoming = row["next_run"]
        local = upcoming.astimezone()
        own = "" if upcoming.utcoffset() == local.utcoffset() else f" ({upcoming:%H:%M} {row['tz']})"
        name = html.escape(str(row["name"]))
        source = f" · {html.escape(os.path.basename(row['notebook']))}" if row["notebook"] else ""
        parts.append(
            f"<span class='nbqueue-schedule' data-name='{name}' title='{upcoming.isoformat()}'><b>{name}</b> "
            f"{html.escape(str(row['schedule']))}{source} · next {local:%a %d %b %H:%M} {local:%Z}"
            f"{html.escape(own)}</span>"
        )
    if not parts:
        return ""
    more = (
        f" &nbsp;(+{len(coming) - SCHEDULES_SHOWN} more: q.schedules())"
        if len(coming) > SCHEDULES_SHOWN
        else ""
    )
    return (
        "<div class='nbqueue-schedules'><b>SCHEDULES</b>&nbsp; "
        + " &nbsp;|&nbsp; ".join(parts)
        + more
        + "</div>"
    )


def step_value(preview: str) -> str:
    """A step's value as the pane shows it: a small one whole, a big one its start."""
    if len(preview) > STEP_PREVIEW:
        return f"{preview[:STEP_PREVIEW]}... (q.steps(job) has it whole)"
    try:  # whole: shown as JSON without \u escapes
        return json.dumps(json.loads(preview), ensure_ascii=False)[:STEP_PREVIEW]
    except ValueError:
        return preview


def notebook_line(job: Job, lab_root: str | None = None) -> str:
    """A notebook job's executed notebook as a link, and the cell that failed. Under a Jupyter
    server (`lab_root`, its root folder) a click opens it as a tab of the same Lab with no
    kernel (nbqueue.jupyter.lab); the href, relative to this kernel's folder when it lies below
    it, serves other front ends."""
    path = notebooks.executed_path(job)
    if path is None:
        return ""
    # The row says where: only a file here is linked, by a percent-encoded relative path, so
    # no "javascript:" or "http:" a row may hold reaches the href as a scheme.
    relative = os.path.relpath(path) if os.path.isfile(path) else os.pardir
    shown = html.escape(os.path.basename(path))
    opens = open_in_lab(path, lab_root) if os.path.isfile(path) else None
    command = (
        ""
        if opens is None
        else " data-commandlinker-command='docmanager:open' "
        f"data-commandlinker-args='{html.escape(json.dumps(opens), quote=True)}'"
    )
    link = (
        f"<a href='{html.escape(quote(relative))}' target='_blank'{command} "
        f"title='{html.escape(path)}'>{shown}</a>"
        if not relative.startswith("..") or command
        else f"<code>{html.escape(path)}</code>"
    )
    cell = notebooks.failed_cell(job)
    count, first = notebooks.failed_cell_shown(job)
    shown_as = f" [{count}]" if count is not None else ""
    code = f" <code>{html.escape(first[:80])}</code>" if first else ""
    failed = (
        ""
        if cell is None
        else f" · <span style='color:{COLOURS[State.DEAD]}'>failed at cell {cell}{shown_as}</span>{code}"
    )
    return f"<div class='nbqueue-notebook'><b>executed notebook</b> {link}{failed}</div>"


def _payload(job: Job) -> str:
    """The payload as JSON; a notebook job's pinned notebook is summarised, not dumped."""
    payload = job.payload
    if job.task == notebooks.NOTEBOOK_TASK and isinstance(payload, dict):
        kwargs = dict(payload.get("kwargs") or {})
        cells = (kwargs.get("notebook") or {}).get("cells") or []
        kwargs["notebook"] = f"(pinned at enqueue: {len(cells)} cells)"
        payload = {**payload, "kwargs": kwargs}
    return json.dumps(payload, indent=2, ensure_ascii=False)


def job_detail(job: Job | None, extra: str = "", attempts: str = "", lab_root: str | None = None) -> str:
    """Everything about one job: the facts, its `attempts` table, the error (your code's frames
    first), result, output, `extra` (its family and steps), and the payload (`lab_root`: see
    notebook_line)."""
    if job is None:
        return "<i>select a job to see its details</i>"

    def block(title: str, text: str | None) -> str:
        if not text:
            return ""
        if len(text) > DETAIL_LIMIT:  # a page, not a dump: the start, and how much more there is
            text = f"{text[:DETAIL_LIMIT]}\n... ({len(text) - DETAIL_LIMIT:,} more characters)"
        return (
            f"<div><b>{title}</b><pre style='white-space:pre-wrap;max-height:16em;overflow:auto;"
            f"background:#f6f8fa;padding:6px'>{html.escape(text)}</pre></div>"
        )

    progress = f" · progress {html.escape(str(job.progress))}" if job.progress is not None else ""
    key = f" · key {html.escape(job.key)}" if job.key else ""
    facts = (
        f"<b>#{job.id} {html.escape(shown_task(job.task))}</b> · queue "
        f"{html.escape(job.queue)} · <span style='color:{COLOURS[job.status]}'>{job.status.value}</span>"
        f" · {html.escape(attempt_text(job))}{key} · priority {job.priority}"
        f" · run at {job.run_at:%Y-%m-%d %H:%M:%S} UTC{progress}"
    )
    return (
        f"<div class='nbqueue-detail' data-job-id='{job.id}'>{facts}"
        + notebook_line(job, lab_root)
        + attempts
        + block(
            "error of an earlier run" if job.status is State.COMPLETED else "error",
            job.error and user_first(job.error),
        )
        + block("result", job.result_json)
        + block("output", job.output)
        + extra
        + block("payload", _payload(job))
        + "</div>"
    )


@dataclass
class DeadGroup:
    """Dead jobs of one task that died of the same kind of exception."""

    task: str | None
    kind: str  # the exception's class ("ConnectionError"), or its last line when it has none
    ids: list[int]
    latest: Job  # the newest job of the group: its error is the one shown

    @property
    def key(self) -> tuple[str | None, str]:
        return (self.task, self.kind)


def error_kind(error: str | None) -> str:
    """The exception class an error's last line names ("ConnectionError: doc 8" -> "ConnectionError")."""
    line = last_line(error) or "(no error recorded)"
    head = line.split(":", 1)[0].strip()
    return head if head.replace(".", "").replace("_", "").isalnum() and " " not in head else line[:120]


def dead_groups(jobs: list[Job]) -> list[DeadGroup]:
    """Group dead jobs (newest first) by task and exception kind: the biggest group first."""
    groups: dict[tuple[str | None, str], DeadGroup] = {}
    for job in jobs:
        kind = error_kind(job.error)
        group = groups.get((job.task, kind))
        if group is None:
            groups[(job.task, kind)] = DeadGroup(job.task, kind, [job.id], job)
        else:
            group.ids.append(job.id)
    return sorted(groups.values(), key=lambda g: (-len(g.ids), -g.latest.id))


def groups_table(groups: list[DeadGroup], selected: int = 0, now: datetime | None = None) -> str:
    """One line per group: task, the newest error, how many, when, and its Requeue and Delete."""
    now = now or datetime.now(UTC)
    cols = "".join(f"<col style='width:{w}'>" for w in ("16%", "auto", "64px", "76px", "190px"))
    head = "".join(f"<th>{h}</th>" for h in ("task", "error (newest of the group)", "jobs", "latest", ""))
    rows = []
    for number, group in enumerate(groups, 1):
        error = html.escape(last_line(group.latest.error) or group.kind)
        n = len(group.ids)
        chosen = " class='nbqueue-selected'" if number == selected else ""
        cells = (
            _titled(shown_task(group.task), group.task or "(payload)"),
            f"<span style='color:{COLOURS[State.DEAD]}' title='{error}'>{error}</span>",
            f"<span class='nbqueue-group-count'>{n:,}</span>",
            _titled(ago(group.latest.updated_at, now), f"{group.latest.updated_at:%Y-%m-%d %H:%M:%S} UTC"),
            f"<button data-action='requeue'>Requeue {n:,}</button>"
            f"<button data-action='delete'>Delete {n:,}</button>",
        )
        rows.append(
            f"<tr data-row-id='{number}' data-group='{html.escape(group.kind)}'{chosen}>"
            + "".join(f"<td>{c}</td>" for c in cells)
            + "</tr>"
        )
    body = "".join(rows) or "<tr><td colspan='5'><i>no dead jobs</i></td></tr>"
    return (
        f"<table class='nbqueue-dead-groups'><colgroup>{cols}</colgroup><thead><tr>{head}</tr></thead>"
        f"<tbody>{body}</tbody></table>"
    )


FAMILY_SHOWN = 20  # parents or children the detail pane names


def family_html(
    job: Job, parents: list[int], children: list[int], known: dict[int, Job], note: str | None, drawing: str
) -> str:
    """A job's parents and children (those `known`, with their states), what it waits for
    (`note`), and its graph (`drawing`, SVG)."""

    def names(ids: list[int]) -> str:
        shown = [
            f"<span data-job-id='{i}' style='color:{COLOURS[known[i].status]}'>#{i} "
            f"{html.escape(short(known[i].task))} {known[i].status.value}</span>"
            for i in ids[:FAMILY_SHOWN]
            if i in known
        ]
        more = f" · +{len(ids) - FAMILY_SHOWN} more" if len(ids) > FAMILY_SHOWN else ""
        return (" · ".join(shown) + more) or "none"

    rule = html.escape(job.when or "all_succeeded")
    lines = [
        f"<div class='nbqueue-parents'><b>parents</b> ({rule}): {names(parents)}</div>",
        f"<div class='nbqueue-children'><b>children</b>: {names(children)}</div>",
    ]
    if note:
        lines.append(f"<div class='nbqueue-waiting'><b>{html.escape(note)}</b></div>")
    lines.append(f"<div class='nbqueue-graph-box' style='overflow:auto;max-height:24em'>{drawing}</div>")
    return "<div class='nbqueue-family'>" + "".join(lines) + "</div>"


def steps_html(previews: Sequence[Sequence[Any]]) -> str:
    """A job's durable steps (name, value preview, error, attempt, started, finished): name,
    status, attempt, value (cut after STEP_PREVIEW characters: q.steps(job) has it whole), and
    the error's last line."""
    rows = []
    for name, value, error, attempt, _started, _finished in previews:
        shown = "" if error is not None or value is None else step_value(str(value))
        error_line = (last_line(error) if isinstance(error, str) else None) or ""
        cells = (str(name), "completed" if error is None else "failed", str(attempt), shown, error_line[:120])
        rows.append(
            f"<tr data-step='{html.escape(str(name))}'>"
            + "".join(f"<td style='text-align:left;padding:1px 8px'>{html.escape(c)}</td>" for c in cells)
            + "</tr>"
        )
    if not rows:
        return ""
    head = "".join(
        f"<th style='text-align:left;padding:1px 8px'>{h}</th>"
        for h in ("step", "status", "attempt", "value", "error")
    )
    return f"<div><b>steps</b><table class='nbqueue-steps'><tr>{head}</tr>{''.join(rows)}</table></div>"
