"""The live job board and the dead-letter view (ipywidgets).

A timer thread refreshes each view by reading the queue and setting widget
values; it never displays anything, so no output lands in a running cell.
Tables are paged in SQL, so a view of a million-job queue stays fast.
"""

from __future__ import annotations

import html
import json
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

import ipywidgets as widgets

from .. import notebooks
from ..dag import COLOURS, short, svg
from ..errors import DamagedJob, NbqueueError
from ..frames import last_line
from ..jobs import FINISHED, Job, State, attempt_text, shown_task
from ..queue import Queue
from ..tracebacks import user_first
from ..workflows import Planned, Workflow
from .table import ClickTable

log = logging.getLogger("nbqueue.views")

ALL = "all"
FAMILY_SHOWN = 20  # parents or children the detail pane names
GRAPH_DRAWN = 300  # jobs of a job's graph the detail pane draws (q.graph has them all)
STEP_PREVIEW = 120  # characters of a step's value the detail pane reads and shows
DETAIL_LIMIT = 20_000  # characters of a payload, result, error or output the detail pane shows


def _pill(state: State, n: int) -> str:
    return (
        f"<span class='nbqueue-count' data-state='{state.value}' data-count='{n}' "
        f"style='display:inline-block;margin:0 6px 4px 0;padding:2px 10px;border-radius:12px;"
        f"background:{COLOURS[state]};color:white;font-weight:600'>{state.value} {n}</span>"
    )


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


def _text_cell(job: Job, note: str | None = None, silent: bool = False) -> str:
    """What a person should read about the job: its worker gone silent, what it waits for, or
    its last error (the whole error on hover, and in the detail pane)."""
    if silent:
        return (
            f"<span class='nbqueue-silent' style='color:{COLOURS[State.DEAD]}' "
            f"title='{html.escape(job.worker_id or '')}'>worker silent: its process is gone or stopped "
            "beating (recovered when found or at lease end)</span>"
        )
    if note:  # what a blocked or upstream_failed job waits for says more than its error
        colour = COLOURS[job.status]
        return f"<span class='nbqueue-waiting'>{_titled(note, style=f'color:{colour}')}</span>"
    error = html.escape(last_line(job.error) or "")
    if error and job.status is State.COMPLETED:  # kept in history; say it is not current
        return (
            f"<span style='color:#6c757d;font-style:italic' title='{error}'>earlier attempt: {error}</span>"
        )
    return f"<span title='{error}'>{error}</span>" if error else ""


_COLUMNS = (  # heading, width: fixed widths where the text is short, shares of the rest elsewhere
    ("id", "52px"),
    ("task", "14%"),
    ("queue", "8%"),
    ("status", "112px"),
    ("attempt", "84px"),
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
) -> str:
    """An HTML table of jobs (escaped), one line each; `running` jobs pinned above the rest under
    their own heading; `notes` say what waiting jobs wait for; `silent` running jobs are marked;
    `progress=False` leaves the progress column out (jobs that cannot be running)."""
    now = now or datetime.now(UTC)
    notes, silent = notes or {}, silent or set()
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
            html.escape(attempt_text(job).removeprefix("attempt ")),
            f"<span title='{job.updated_at:%Y-%m-%d %H:%M:%S} UTC'>{html.escape(when)}</span>",
            _progress_cell(job),
            _text_cell(job, notes.get(job.id), job.id in silent),
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
    waiting = counts["pending"] + counts["failed"]
    rest = " · ".join(
        bit
        for bit in (
            f"{counts['running']:,} running" if counts["running"] else "",
            f"{waiting:,} waiting" if waiting else "",
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


def attempts_table(frame: Any) -> str:
    """Every attempt of a job: when it started, how long, which worker, how it ended, its error."""
    if frame is None or frame.empty:
        return ""
    rows = []
    for r in frame.itertuples(index=False):
        duration = "" if r.duration != r.duration else f"{r.duration:.2f} s"  # NaN while running
        error = (last_line(r.error) if isinstance(r.error, str) else None) or ""
        colour = (
            COLOURS[State.COMPLETED]
            if r.outcome == "completed"
            else COLOURS[State.DEAD]
            if error
            else "#495057"
        )
        cells = (
            f"attempt {r.attempt}",
            f"{r.started:%Y-%m-%d %H:%M:%S}",
            duration,
            f"<span style='color:{colour}'>{html.escape(str(r.outcome))}</span>",
            _titled(f"{str(r.host).split('/')[0]}:{r.pid}", str(r.worker)),  # host, not its namespace
            f"<span title='{html.escape(error)}'>{html.escape(error)}</span>",
        )
        rows.append(
            f"<tr data-attempt='{r.attempt}'>"
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


def limits_line(frame: Any) -> str:
    """LIMITS  openai 4/8 in flight · 500/m, next start in 0.2 s · paused by 429 until 14:32:10 UTC."""
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
        if str(row.paused_until) not in ("NaT", "None"):
            why = html.escape(str(row.paused_why or "paused"))
            bits.append(
                f"<span class='nbqueue-paused' style='color:#dc3545' title='{why}'>paused until "
                f"{row.paused_until:%H:%M:%S} UTC ({why[:60]})</span>"
            )
        key = html.escape(str(row.key))
        parts.append(f"<span class='nbqueue-limit' data-key='{key}'>{' · '.join(bits)}</span>")
    if not parts:
        return ""
    return "<div class='nbqueue-limits'><b>LIMITS</b>&nbsp; " + " &nbsp;|&nbsp; ".join(parts) + "</div>"


def _or_damage(title: str, line: Callable[[], str]) -> str:
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


def waiting_notes(queue: Queue, jobs: list[Job]) -> dict[int, str]:
    """What each blocked or upstream_failed job waits for, in a few words:
    "waiting on #4 (running), #5 (pending)", or "waiting on dead #12: requeue it"."""
    manager = queue.manager
    blocked = [j.id for j in jobs if j.status is State.BLOCKED]
    doomed = {j.id: j.root_cause for j in jobs if j.status is State.UPSTREAM_FAILED and j.root_cause}
    if not blocked and not doomed:
        return {}
    parents = manager.parents_of(blocked)
    known = manager.found([*doomed.values(), *(p for ps in parents.values() for p in ps)])
    notes = {}
    for job_id, root_id in doomed.items():
        root = known.get(root_id)
        if root is None:
            notes[job_id] = f"upstream job #{root_id} failed and is gone"
        elif root.status in (State.DEAD, State.CANCELLED):
            notes[job_id] = f"waiting on {root.status.value} #{root.id}: requeue it"
    for job_id in blocked:
        waited = [known[p] for p in parents.get(job_id, []) if p in known and not known[p].finished]
        named = ", ".join(f"#{p.id} ({p.status.value})" for p in waited[:3])
        more = f" +{len(waited) - 3} more" if len(waited) > 3 else ""
        notes[job_id] = f"waiting on {named}{more}" if waited else "waiting on its parents"
    return notes


def family(queue: Queue, job: Job) -> str:
    """A job's parents and children with their states, what it waits for, and its graph drawn."""
    parents, children = queue.manager.relatives(job.id)
    if not parents and not children:
        return ""
    known = queue.manager.found([*parents[:FAMILY_SHOWN], *children[:FAMILY_SHOWN]])

    def names(ids: list[int]) -> str:
        shown = [
            f"<span data-job-id='{i}' style='color:{COLOURS[known[i].status]}'>#{i} "
            f"{html.escape(short(known[i].task))} {known[i].status.value}</span>"
            for i in ids[:FAMILY_SHOWN]
            if i in known
        ]
        more = f" · +{len(ids) - FAMILY_SHOWN} more" if len(ids) > FAMILY_SHOWN else ""
        return (" · ".join(shown) + more) or "none"

    note = waiting_notes(queue, [job]).get(job.id)
    rule = html.escape(job.when or "all_succeeded")
    lines = [
        f"<div class='nbqueue-parents'><b>parents</b> ({rule}): {names(parents)}</div>",
        f"<div class='nbqueue-children'><b>children</b>: {names(children)}</div>",
    ]
    if note:
        lines.append(f"<div class='nbqueue-waiting'><b>{html.escape(note)}</b></div>")
    drawing = svg(queue.manager.graph(job, limit=GRAPH_DRAWN))
    lines.append(f"<div class='nbqueue-graph-box' style='overflow:auto;max-height:24em'>{drawing}</div>")
    return "<div class='nbqueue-family'>" + "".join(lines) + "</div>"


def steps_table(queue: Queue, job: Job) -> str:
    """A job's durable steps: name, status, attempt, value (a preview: the pane reads no more of
    it, however big; q.steps(job) has it whole), error's last line."""
    rows = []
    for name, value, error, attempt, _started, _finished in queue.manager.step_previews(
        job.id,
        STEP_PREVIEW + 1,  # one more: a value that long was cut
    ):
        shown = "" if error is not None or value is None else _step_value(str(value))
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


def _step_value(preview: str) -> str:
    """A step's value as the pane shows it: a small one whole, a big one its start."""
    if len(preview) > STEP_PREVIEW:
        return f"{preview[:STEP_PREVIEW]}... (q.steps(job) has it whole)"
    try:  # whole: shown as JSON without \u escapes
        return json.dumps(json.loads(preview), ensure_ascii=False)[:STEP_PREVIEW]
    except ValueError:
        return preview


def graph_html(queue: Queue, of: Workflow | Planned | Job | int, title: str = "") -> str:
    """A workflow's (or a job's) graph drawn as SVG."""
    return svg(queue.manager.graph(of), title)


def notebook_line(job: Job) -> str:
    """A notebook job's executed notebook as a link (JupyterLab opens a relative link in a tab,
    so the path is made relative to this kernel's folder when it lies below it) and the cell
    that failed."""
    path = notebooks.executed_path(job)
    if path is None:
        return ""
    # The row says where: only a file here is linked, by a percent-encoded relative path, so
    # no "javascript:" or "http:" a row may hold reaches the href as a scheme.
    relative = os.path.relpath(path) if os.path.isfile(path) else os.pardir
    shown = html.escape(os.path.basename(path))
    link = (
        f"<a href='{html.escape(quote(relative))}' target='_blank' title='{html.escape(path)}'>{shown}</a>"
        if not relative.startswith("..")
        else f"<code>{html.escape(path)}</code>"
    )
    cell = notebooks.failed_cell(job)
    failed = (
        "" if cell is None else f" · <span style='color:{COLOURS[State.DEAD]}'>failed at cell {cell}</span>"
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


def job_detail(job: Job | None, extra: str = "", attempts: str = "") -> str:
    """Everything about one job: the facts, its `attempts` table, the error (your code's frames
    first), result, output, `extra` (its family and steps), and the payload."""
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
        + notebook_line(job)
        + attempts
        + block("error", job.error and user_first(job.error))
        + block("result", job.result_json)
        + block("output", job.output)
        + extra
        + block("payload", _payload(job))
        + "</div>"
    )


class _LiveView(widgets.VBox):  # type: ignore[misc]
    """A VBox refreshed by a timer thread until it is closed."""

    def __init__(self, queue: Queue, interval: float, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.queue = queue
        self.interval = interval
        self._lock = threading.RLock()
        self._closed = threading.Event()
        self._timer: threading.Thread | None = None

    def _start_timer(self) -> None:
        if self.interval and self._timer is None:
            self._timer = threading.Thread(target=self._tick, name="nbqueue-view", daemon=True)
            self._timer.start()

    def _tick(self) -> None:
        failures = 0
        while not self._closed.wait(self.interval):
            try:
                self.refresh()
                failures = 0
            except Exception:  # a view must never kill the kernel's threads
                failures += 1
                log.exception("refreshing %s failed", type(self).__name__)
                if failures >= 5:
                    return

    def refresh(self) -> None:
        """Re-read the queue and update the widgets."""
        raise NotImplementedError

    @property
    def live(self) -> bool:
        """True while the refresh timer runs."""
        return self._timer is not None and self._timer.is_alive()

    def close(self) -> None:
        """Stop refreshing and close the widgets."""
        self._closed.set()
        super().close()


RUNNING_SHOWN = 10  # running jobs pinned at the top of the board (the count says how many more)
CHART_EVERY = 10.0  # seconds between redraws of the board's chart (it reads the last hour)
CHART_JOBS = 300  # the newest finished jobs the time-in-queue panel reads


def board_picture(queue: Queue, wanted: Callable[[], bool] = lambda: True) -> str:
    """The board's chart as SVG ("" with nothing to draw, or without matplotlib, or when `wanted`
    says no more before the drawing starts: a board closed meanwhile)."""
    try:
        from . import charts  # noqa: PLC0415 - matplotlib only when a board draws
    except ImportError:
        return ""
    try:
        timings = charts.task_timings(queue.history(State.COMPLETED, limit=CHART_JOBS))
        activity = queue.activity(60)
        # the drawing is the long part (half a second): a closed board's thread ends before it
        return charts.board_chart(activity, timings) if wanted() else ""
    except ImportError:  # matplotlib is in the notebook extra; without it, no picture
        return ""


class JobBoard(_LiveView):
    """Counts per state, the outcome bar, a chart, the running jobs pinned above a paged table of
    the rest (a click on a row opens it), and one job's details with its actions."""

    def __init__(
        self,
        queue: Queue,
        *,
        status: str | None = None,
        queue_name: str | None = None,
        interval: float = 1.0,
        page_size: int = 15,
        chart: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(queue, interval, **kwargs)
        self.page_size = page_size
        self.page = 0
        self.chart_wanted = chart
        self._chart_at = 0.0
        self._chart_thread: threading.Thread | None = None
        self._updating = False
        self._detail_key: tuple[int, object, tuple[int, ...]] | None = None
        self._steps: tuple[object, str] = (None, "")  # a finished job's steps table, read once
        self.counts: dict[str, int] = {}
        self.rows: list[Job] = []
        self.running: list[Job] = []
        self.title = widgets.HTML(
            f"<b>nbqueue</b> <code>{html.escape(str(queue))}</code>", layout={"margin": "0"}
        )
        self.counts_html = widgets.HTML()
        self.outcome = widgets.HTML(layout={"width": "100%"})
        self.chart = widgets.HTML(layout={"width": "100%"})
        self.limits_html = widgets.HTML()
        self.schedules_html = widgets.HTML()
        small = {"width": "auto"}
        self.status_filter = widgets.Dropdown(
            options=[ALL, *(s.value for s in State)],
            value=status or ALL,
            description="status",
            layout={"width": "220px"},
        )
        self.queue_filter = widgets.Dropdown(
            options=[ALL], value=ALL, description="queue", layout={"width": "220px"}
        )
        if queue_name:  # a queue with no jobs yet is still a valid filter
            self.queue_filter.options = [ALL, queue_name]
            self.queue_filter.value = queue_name
        self.refresh_button = widgets.Button(description="Refresh", icon="refresh", layout=small)
        self.newer = widgets.Button(description="Newer", icon="arrow-left", disabled=True, layout=small)
        self.older = widgets.Button(description="Older", icon="arrow-right", layout=small)
        self.page_label = widgets.HTML()
        self.table = ClickTable(layout={"width": "100%"})
        self.cancel_button = widgets.Button(
            description="Cancel job", icon="stop", disabled=True, layout=small
        )
        self.requeue_button = widgets.Button(
            description="Requeue job", icon="redo", disabled=True, layout=small
        )
        self.message = widgets.HTML()
        self.detail = widgets.HTML(layout={"width": "100%"})
        self.children = [
            widgets.HBox([self.title, self.refresh_button], layout={"justify_content": "space-between"}),
            self.counts_html,
            self.outcome,
            self.chart,
            self.limits_html,
            self.schedules_html,
            widgets.HBox([self.status_filter, self.queue_filter, self.newer, self.page_label, self.older]),
            self.table,
            widgets.HBox([self.cancel_button, self.requeue_button, self.message]),
            self.detail,
        ]
        self.layout.width = "100%"
        self.add_class("nbqueue-board")
        self.status_filter.observe(self._filter_changed, names="value")
        self.queue_filter.observe(self._filter_changed, names="value")
        self.table.observe(lambda _change: self._show_detail(), names="selected")
        self.refresh_button.on_click(lambda _b: self.refresh())
        self.cancel_button.on_click(lambda _b: self._act("cancel"))
        self.requeue_button.on_click(lambda _b: self._act("requeue"))
        self.newer.on_click(lambda _b: self._turn(-1))
        self.older.on_click(lambda _b: self._turn(+1))
        self.refresh()
        self._start_timer()

    def _filter_changed(self, _change: Any) -> None:
        if self._updating:  # our own refresh changed the options; not the person
            return
        self.page = 0
        self.refresh()

    def _turn(self, step: int) -> None:
        self.page = max(0, self.page + step)
        self.refresh()

    def refresh(self) -> None:
        with self._lock:
            status = None if self.status_filter.value == ALL else self.status_filter.value
            queue = None if self.queue_filter.value == ALL else self.queue_filter.value
            everywhere = self.queue.counts()
            counts = everywhere if queue is None else self.queue.counts(queue)
            # Running jobs are pinned above the table when it lists every state; the pages
            # then hold the rest, newest first.
            pinned = status is None and counts["running"] > 0
            shown = [s for s in State if s is not State.RUNNING] if pinned else None
            running = (
                self.queue.manager.jobs([State.RUNNING], queue, RUNNING_SHOWN, 0, brief=True)
                if pinned
                else []
            )
            if status is not None:
                matching = counts[status]
            else:
                matching = sum(counts.values()) - (counts["running"] if pinned else 0)
            pages = max(1, -(-matching // self.page_size))
            self.page = min(self.page, pages - 1)
            offset = self.page * self.page_size
            if shown is not None:
                rows = self.queue.manager.jobs(shown, queue, self.page_size, offset, brief=True)
            else:
                rows = self.queue.jobs(status, queue, self.page_size, offset, brief=True)
            names = [ALL, *self.queue.queues()]
            if queue and queue not in names:
                names.append(queue)
            if list(self.queue_filter.options) != names:
                self._updating = True
                try:
                    self.queue_filter.options = names
                    self.queue_filter.value = queue or ALL
                finally:
                    self._updating = False
            self.counts, self.rows, self.running = counts, rows, running
            self.counts_html.value = "".join(_pill(s, counts[s.value]) for s in State)
            self.outcome.value = outcome_bar(counts)
            self._draw_chart()
            self.limits_html.value = _or_damage("LIMITS", lambda: limits_line(self.queue.limits()))
            self.schedules_html.value = _or_damage(
                "SCHEDULES", lambda: schedules_line(self.queue.manager.schedule_rows())
            )
            more = counts["running"] - len(running)
            notes = waiting_notes(self.queue, rows)
            self.table.value = jobs_table(
                rows,
                notes,
                running=running,
                silent=self.queue.manager.silent(running) if running else set(),
                selected=self.table.selected,
            ) + (
                f"<div style='font-size:12px'>+{more} more running: status filter 'running'</div>"
                if more > 0
                else ""
            )
            first = offset + 1 if rows else 0
            self.page_label.value = (
                f"&nbsp;{first}-{offset + len(rows)} of {matching:,}{' more' if pinned else ''}&nbsp;"
            )
            self.newer.disabled = self.page == 0
            self.older.disabled = self.page >= pages - 1
            self._show_detail()

    def _draw_chart(self) -> None:
        """Redraw the chart now and then, on a thread of its own: it reads an hour of attempts
        and matplotlib takes a moment, which the table must not wait for."""
        drawing = self._chart_thread is not None and self._chart_thread.is_alive()
        if not self.chart_wanted or drawing or time.monotonic() - self._chart_at < CHART_EVERY:
            return
        self._chart_at = time.monotonic()
        self._chart_thread = threading.Thread(target=self.draw_chart, name="nbqueue-chart", daemon=True)
        self._chart_thread.start()

    @property
    def live(self) -> bool:
        """True while the refresh timer runs or the chart is being drawn."""
        drawing = self._chart_thread is not None and self._chart_thread.is_alive()
        return drawing or super().live

    def draw_chart(self) -> None:
        """Draw the chart now (the board redraws it by itself every 10 s)."""
        try:
            picture = board_picture(self.queue, lambda: not self._closed.is_set())
        except Exception:  # a picture must never break the board
            if not self._closed.is_set():  # closed with its queue mid-draw: nothing to say
                log.exception("drawing the board's chart failed")
            return
        if self._closed.is_set():
            return
        self.chart.value = (
            f"<div class='nbqueue-chart' style='width:100%;max-width:960px'>{picture}</div>"
            if picture
            else ""
        )

    def select(self, job_id: int | None) -> None:
        """Show one job's details, as a click on its row does; None clears."""
        self.table.selected = job_id or 0

    def _show_detail(self) -> None:
        job_id = self.table.selected
        listed = next((j for j in [*self.running, *self.rows] if j.id == job_id), None)
        # Its parents and children move too: any change of the counts reads it again.
        key = (job_id, None if listed is None else listed.updated_at, tuple(self.counts.values()))
        if key == self._detail_key:  # unchanged: the whole job is read only when it changes
            return
        self._detail_key = key
        try:
            job = self.queue.get(job_id) if job_id else None
        except DamagedJob:
            job = listed  # what can be read of it, its damage in its error
        except NbqueueError:
            job = None
        self.cancel_button.disabled = job is None or job.finished
        self.requeue_button.disabled = job is None or job.status not in (State.DEAD, State.CANCELLED)
        if job is None:
            self.detail.value = job_detail(None)
            return
        # A finished job's steps change only with its row (a replay or requeue moves it): read
        # once, not at each change of the counts; an unfinished job's are read each time.
        mark = (job.id, job.updated_at)
        if not job.finished or self._steps[0] != mark:
            self._steps = (mark, steps_table(self.queue, job))
        extra = family(self.queue, job) + self._steps[1]
        self.detail.value = job_detail(job, extra, attempts_table(self.queue.attempts(job)))

    def _act(self, action: str) -> None:
        """Cancel (a running job is told to stop; process mode kills it) or requeue the job shown."""
        job_id = self.table.selected
        with self._lock:
            try:
                if action == "cancel":
                    self.queue.cancel(job_id)
                    text = f"cancelled job {job_id}"
                else:
                    self.queue.requeue([job_id])
                    text = f"requeued job {job_id}"
                self.message.value = f"<span class='nbqueue-message'>{html.escape(text)}</span>"
            except NbqueueError as exc:
                self.message.value = f"<span style='color:#dc3545'>{html.escape(str(exc))}</span>"
            self._detail_key = None
            self.refresh()


class GraphView(_LiveView):
    """A workflow's graph (or the graph a job belongs to), drawn live: nodes coloured by state."""

    def __init__(
        self, queue: Queue, of: Workflow | Planned | Job | int, *, interval: float = 1.0, **kwargs: Any
    ) -> None:
        super().__init__(queue, interval, **kwargs)
        self.of = of
        name = f"workflow {of.name!r}" if isinstance(of, Workflow) else f"job {getattr(of, 'id', of)}"
        self.title = f"graph of {name}"
        self.drawing = widgets.HTML()
        self.counts_html = widgets.HTML()
        self.children = [self.counts_html, self.drawing]
        self.add_class("nbqueue-graph-view")
        self._drawn: object = None  # what the drawing shows: redrawn only when it changes
        self.refresh()
        self._start_timer()

    def refresh(self) -> None:
        with self._lock:
            graph = self.queue.manager.graph(self.of)
            counts: dict[State, int] = {}
            for job, _ in graph:
                counts[job.status] = counts.get(job.status, 0) + 1
            self.counts_html.value = "".join(_pill(s, counts[s]) for s in State if s in counts)
            # Everything the drawing shows of each job: states that have not moved redraw nothing.
            shown = [(job.id, job.task, job.status, job.error, tuple(parents)) for job, parents in graph]
            if shown != self._drawn:
                self._drawn = shown
                self.drawing.value = (
                    f"<div style='overflow:auto;max-height:40em'>{svg(graph, self.title)}</div>"
                )


DEAD_SCANNED = 5_000  # the newest dead jobs the view groups (the header says when there are more)


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


class DeadLetterView(_LiveView):
    """The dead jobs grouped by error (one Requeue per group), a page of a group's jobs (a click
    opens one's traceback, your code first), and the actions at the top."""

    def __init__(
        self,
        queue: Queue,
        *,
        queue_name: str | None = None,
        interval: float = 2.0,
        page_size: int = 15,
        **kw: Any,
    ) -> None:
        super().__init__(queue, interval, **kw)
        self.queue_name = queue_name
        self.page_size = page_size
        self.page = 0
        self.jobs: list[Job] = []  # the jobs listed now: a page of the chosen group, or of all
        self.groups: list[DeadGroup] = []
        self._group: tuple[str | None, str] | None = None
        self._detail_key: tuple[int | None, object] | None = None
        small = {"width": "auto"}
        self.header = widgets.HTML()
        self.requeue_selected = widgets.Button(
            description="Requeue selected", button_style="primary", layout=small
        )
        self.requeue_all = widgets.Button(description="Requeue all", button_style="warning", layout=small)
        self.delete_selected = widgets.Button(
            description="Delete selected", button_style="danger", layout=small
        )
        self.refresh_button = widgets.Button(description="Refresh", icon="refresh", layout=small)
        self.message = widgets.HTML()
        self.groups_table = ClickTable(layout={"width": "100%"})
        self.table = ClickTable(layout={"width": "100%"})
        self.newer = widgets.Button(description="Newer", icon="arrow-left", disabled=True, layout=small)
        self.older = widgets.Button(description="Older", icon="arrow-right", layout=small)
        self.page_label = widgets.HTML()
        self.traceback = widgets.HTML(layout={"width": "100%"})
        # The jobs chosen for "Requeue/Delete selected": a click on a row chooses it; code may
        # set several (view.select.value = (3, 4)). Kept as a widget, not shown.
        self.select = widgets.SelectMultiple(options=[])
        self.children = [
            self.header,
            widgets.HBox(
                [
                    self.requeue_selected,
                    self.delete_selected,
                    self.requeue_all,
                    self.refresh_button,
                    self.message,
                ]
            ),
            self.groups_table,
            widgets.HBox([self.newer, self.page_label, self.older]),
            self.table,
            self.traceback,
        ]
        self.layout.width = "100%"
        self.add_class("nbqueue-deadletters")
        self.requeue_selected.on_click(lambda _b: self._act("requeue", list(self.select.value)))
        self.requeue_all.on_click(lambda _b: self._act("requeue", None))
        self.delete_selected.on_click(lambda _b: self._act("delete", list(self.select.value)))
        self.refresh_button.on_click(lambda _b: self.refresh())
        self.newer.on_click(lambda _b: self._turn(-1))
        self.older.on_click(lambda _b: self._turn(+1))
        self.groups_table.observe(lambda _c: self._group_chosen(), names="selected")
        self.groups_table.on_action(self._group_action)
        self.table.observe(lambda _c: self._row_chosen(), names="selected")
        self.select.observe(lambda _change: self._show_traceback(), names="value")
        self.refresh()
        self._start_timer()

    def _turn(self, step: int) -> None:
        self.page = max(0, self.page + step)
        self.refresh()

    def _group_chosen(self) -> None:
        number = self.groups_table.selected
        chosen = self.groups[number - 1].key if 0 < number <= len(self.groups) else None
        if chosen != self._group:
            self._group, self.page = chosen, 0
            self.refresh()

    def choose_group(self, number: int) -> None:
        """List the jobs of group `number` (1 = the first line; 0 lists every dead job)."""
        self.groups_table.selected = number

    def _row_chosen(self) -> None:
        job_id = self.table.selected
        self.select.value = (job_id,) if job_id in {j.id for j in self.jobs} else ()

    def _group_action(self, action: str, number: int) -> None:
        if 0 < number <= len(self.groups):
            self._act(action, list(self.groups[number - 1].ids))

    def refresh(self) -> None:
        with self._lock:
            scanned = self.queue.jobs(State.DEAD, self.queue_name, DEAD_SCANNED, brief=True)
            total = self.queue.counts(self.queue_name)["dead"]
            self.groups = dead_groups(scanned)
            keys = [g.key for g in self.groups]
            number = keys.index(self._group) + 1 if self._group in keys else 0
            if not number:
                self._group = None
            listed = (
                [j for j in scanned if (j.task, error_kind(j.error)) == self._group]
                if self._group
                else scanned
            )
            pages = max(1, -(-len(listed) // self.page_size))
            self.page = min(self.page, pages - 1)
            start = self.page * self.page_size
            self.jobs = listed[start : start + self.page_size]
            self.header.value = (
                f"<b>dead letters</b> <span class='nbqueue-dead-count' data-count='{total}'>{total}</span>"
                f" in <code>{html.escape(str(self.queue))}</code> · {len(self.groups)} group(s) by error"
                + (f" (grouping the newest {len(scanned):,})" if total > len(scanned) else "")
                + (" · click a group to list its jobs" if self.groups else "")
            )
            self.groups_table.value = groups_table(self.groups, number)
            self.groups_table.selected = number
            ids = {j.id for j in self.jobs}
            options = [
                (f"#{j.id} {shown_task(j.task)}: {(last_line(j.error) or '')[:70]}", j.id) for j in self.jobs
            ]
            if list(self.select.options) != options:
                keep = tuple(v for v in self.select.value if v in ids)
                self.select.options = options
                self.select.value = keep
            chosen = self.select.value[0] if self.select.value else 0
            self.table.value = jobs_table(self.jobs, selected=chosen, progress=False)
            self.table.selected = chosen
            group = (
                f" of {html.escape(shown_task(self._group[0]))} · {html.escape(self._group[1])}"
                if self._group
                else ""
            )
            first = start + 1 if self.jobs else 0
            self.page_label.value = f"&nbsp;{first}-{start + len(self.jobs)} of {len(listed):,}{group}&nbsp;"
            self.newer.disabled = self.page == 0
            self.older.disabled = self.page >= pages - 1
            self.requeue_all.disabled = not total
            self._show_traceback()

    def _show_traceback(self) -> None:
        chosen = list(self.select.value)
        for button in (self.requeue_selected, self.delete_selected):
            button.disabled = not chosen
        listed = next((j for j in self.jobs if chosen and j.id == chosen[0]), None)
        key = (None, None) if listed is None else (listed.id, listed.updated_at)
        if key == self._detail_key:  # unchanged: the whole job is read only when it changes
            return
        self._detail_key = key
        try:
            job = None if listed is None else self.queue.get(listed.id)
        except DamagedJob:
            job = listed  # what can be read of it, its damage in its error
        except NbqueueError:
            job = None
        if job is None:
            self.traceback.value = "<i>select dead jobs to see their tracebacks (click a row)</i>"
            return
        self.traceback.value = job_detail(job, attempts=attempts_table(self.queue.attempts(job)))

    def _act(self, action: str, ids: list[int] | None) -> None:
        with self._lock:
            try:
                if action == "requeue" and ids is None:
                    if self.queue_name is None:
                        n = self.queue.requeue(None)
                    else:  # only this view's queue
                        dead = self.queue.jobs(State.DEAD, self.queue_name, limit=10**9)
                        n = self.queue.requeue([j.id for j in dead]) if dead else 0
                    text = f"requeued {n} job(s)"
                elif not ids:
                    text = "select jobs first"
                elif action == "requeue":
                    text = f"requeued {self.queue.requeue(ids)} job(s)"
                else:
                    text = f"deleted {self.queue.delete(ids)} job(s)"
                self.message.value = f"<span class='nbqueue-message'>{html.escape(text)}</span>"
            except NbqueueError as exc:
                self.message.value = f"<span style='color:#dc3545'>{html.escape(str(exc))}</span>"
            self.select.value = ()
            self.refresh()
