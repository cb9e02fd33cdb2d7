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
from typing import Any

import ipywidgets as widgets

from .. import notebooks
from ..dag import COLOURS, short, svg
from ..errors import NbqueueError
from ..frames import last_line
from ..jobs import FINISHED, Job, State
from ..queue import Queue
from ..workflows import Planned, Workflow

log = logging.getLogger("nbqueue.views")

ALL = "all"
FAMILY_SHOWN = 20  # parents or children the detail pane names
GRAPH_DRAWN = 300  # jobs of a job's graph the detail pane draws (q.graph has them all)
DETAIL_LIMIT = 20_000  # characters of a payload, result, error or output the detail pane shows
NO_JOB = "choose a job…"


def _pill(state: State, n: int) -> str:
    return (
        f"<span class='nbqueue-count' data-state='{state.value}' data-count='{n}' "
        f"style='display:inline-block;margin:0 6px 4px 0;padding:2px 10px;border-radius:12px;"
        f"background:{COLOURS[state]};color:white;font-weight:600'>{state.value} {n}</span>"
    )


def _when(job: Job) -> str:
    return job.updated_at.strftime("%Y-%m-%d %H:%M:%S")


def _progress_cell(job: Job) -> str:
    """A small bar and the message a job reported with nbqueue.progress()."""
    progress = job.progress
    if progress is None or job.status is State.COMPLETED:
        return ""
    message = html.escape(progress.message[:60])
    if progress.fraction is None:
        return f"<span class='nbqueue-progress'>{progress.done:g} {message}</span>"
    percent = round(progress.fraction * 100)
    return (
        f"<span class='nbqueue-progress' data-percent='{percent}' style='white-space:nowrap'>"
        f"<span style='display:inline-block;width:80px;height:8px;background:#e9ecef;border-radius:4px;"
        f"vertical-align:middle'><span style='display:block;width:{percent}%;height:8px;"
        f"background:{COLOURS[job.status]};border-radius:4px'></span></span> {percent}% {message}</span>"
    )


def _error_cell(job: Job, note: str | None = None) -> str:
    if note:  # what a blocked or upstream_failed job waits for says more than its error
        colour = COLOURS[job.status]
        return f"<span class='nbqueue-waiting' style='color:{colour}'>{html.escape(note)}</span>"
    error = html.escape((last_line(job.error) or "")[:120])
    if error and job.status is State.COMPLETED:  # kept in history; say it is not current
        return f"<span style='color:#6c757d;font-style:italic'>earlier run: {error}</span>"
    return error


def jobs_table(jobs: list[Job], notes: dict[int, str] | None = None) -> str:
    """An HTML table of jobs (escaped), one row each; `notes` say what waiting jobs wait for."""
    head = "".join(
        f"<th style='text-align:left;padding:2px 8px'>{h}</th>"
        for h in ("id", "task", "queue", "status", "runs", "updated (UTC)", "progress", "last error")
    )
    rows = []
    for job in jobs:
        # Every value is escaped, whatever its column: a row written by hand may hold anything.
        cells = (
            html.escape(str(job.id)),
            html.escape(job.task or "(payload)"),
            html.escape(job.queue),
            f"<span style='color:{COLOURS[job.status]};font-weight:600'>{job.status.value}</span>",
            html.escape(str(job.attempts)),
            html.escape(_when(job)),
            _progress_cell(job),
            _error_cell(job, (notes or {}).get(job.id)),
        )
        rows.append(
            f"<tr data-job-id='{html.escape(str(job.id))}'>"
            + "".join(f"<td style='text-align:left;padding:2px 8px'>{c}</td>" for c in cells)
            + "</tr>"
        )
    body = "".join(rows) or "<tr><td colspan='8' style='padding:2px 8px'><i>no jobs</i></td></tr>"
    return f"<table class='nbqueue-jobs'><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def limits_line(frame: Any) -> str:
    """LIMITS  openai 4/8 in flight · 500/m, next start in 0.2 s · paused by 429 until 14:32:10 UTC."""
    parts = []
    for row in frame.itertuples(index=False):
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
    """A job's durable steps: name, status, attempt, value (clipped), error's last line."""
    frame = queue.steps(job)
    if frame.empty:
        return ""
    rows = []
    for r in frame.itertuples(index=False):
        value = json.dumps(r.value, ensure_ascii=False)[:120] if r.status == "completed" else ""
        error = (last_line(r.error) if isinstance(r.error, str) else None) or ""
        cells = (str(r.step), str(r.status), str(r.attempt), value, error[:120])
        rows.append(
            f"<tr data-step='{html.escape(str(r.step))}'>"
            + "".join(f"<td style='text-align:left;padding:1px 8px'>{html.escape(c)}</td>" for c in cells)
            + "</tr>"
        )
    head = "".join(
        f"<th style='text-align:left;padding:1px 8px'>{h}</th>"
        for h in ("step", "status", "attempt", "value", "error")
    )
    return f"<div><b>steps</b><table class='nbqueue-steps'><tr>{head}</tr>{''.join(rows)}</table></div>"


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
    relative = os.path.relpath(path)
    shown = html.escape(os.path.basename(path))
    link = (
        f"<a href='{html.escape(relative)}' target='_blank' title='{html.escape(path)}'>{shown}</a>"
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


def job_detail(job: Job | None, extra: str = "") -> str:
    """Everything about one job: payload, result, error traceback, attempts, output; `extra`
    (its family and steps) after the facts."""
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
    facts = (
        f"<b>job {job.id}</b> · {html.escape(job.task or '(payload)')} · queue "
        f"{html.escape(job.queue)} · <span style='color:{COLOURS[job.status]}'>{job.status.value}</span>"
        f" · runs {job.attempts} · retries {job.retries}/{job.max_retries} · priority {job.priority}"
        f" · run at {job.run_at:%Y-%m-%d %H:%M:%S} UTC{progress}"
    )
    return (
        f"<div class='nbqueue-detail' data-job-id='{job.id}'>{facts}"
        + notebook_line(job)
        + extra
        + block("payload", _payload(job))
        + block("result", job.result_json)
        + block("error", job.error)
        + block("output", job.output)
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


class JobBoard(_LiveView):
    """Counts per state, progress, a paged table of recent jobs and one job's details."""

    def __init__(
        self,
        queue: Queue,
        *,
        status: str | None = None,
        queue_name: str | None = None,
        interval: float = 1.0,
        page_size: int = 15,
        **kwargs: Any,
    ) -> None:
        super().__init__(queue, interval, **kwargs)
        self.page_size = page_size
        self.page = 0
        self._updating = False
        self._detail_key: tuple[int, object, tuple[int, ...]] | None = None
        self.counts: dict[str, int] = {}
        self.rows: list[Job] = []
        self.title = widgets.HTML(
            f"<b>nbqueue</b> <code>{html.escape(str(queue))}</code>", layout={"margin": "0"}
        )
        self.counts_html = widgets.HTML()
        self.limits_html = widgets.HTML()
        self.schedules_html = widgets.HTML()
        self.progress = widgets.IntProgress(value=0, min=0, max=1, description="done", bar_style="success")
        self.progress_label = widgets.HTML()
        self.status_filter = widgets.Dropdown(
            options=[ALL, *(s.value for s in State)], value=status or ALL, description="status"
        )
        self.queue_filter = widgets.Dropdown(options=[ALL], value=ALL, description="queue")
        if queue_name:  # a queue with no jobs yet is still a valid filter
            self.queue_filter.options = [ALL, queue_name]
            self.queue_filter.value = queue_name
        self.refresh_button = widgets.Button(description="Refresh", icon="refresh")
        self.newer = widgets.Button(description="Newer", icon="arrow-left", disabled=True)
        self.older = widgets.Button(description="Older", icon="arrow-right")
        self.page_label = widgets.HTML()
        self.table = widgets.HTML()
        self.job_select = widgets.Dropdown(options=[(NO_JOB, 0)], value=0, description="job")
        self.cancel_button = widgets.Button(description="Cancel job", icon="stop", disabled=True)
        self.message = widgets.HTML()
        self.detail = widgets.HTML()
        self.children = [
            self.title,
            self.counts_html,
            self.limits_html,
            self.schedules_html,
            widgets.HBox([self.progress, self.progress_label]),
            widgets.HBox([self.status_filter, self.queue_filter, self.refresh_button]),
            self.table,
            widgets.HBox([self.newer, self.page_label, self.older]),
            widgets.HBox([self.job_select, self.cancel_button, self.message]),
            self.detail,
        ]
        self.add_class("nbqueue-board")
        self.status_filter.observe(self._filter_changed, names="value")
        self.queue_filter.observe(self._filter_changed, names="value")
        self.job_select.observe(lambda _change: self._show_detail(), names="value")
        self.refresh_button.on_click(lambda _b: self.refresh())
        self.cancel_button.on_click(lambda _b: self._cancel())
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
            matching = sum(counts.values()) if status is None else counts[status]
            pages = max(1, -(-matching // self.page_size))
            self.page = min(self.page, pages - 1)
            rows = self.queue.jobs(status, queue, self.page_size, self.page * self.page_size, brief=True)
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
            self.counts, self.rows = counts, rows
            self.counts_html.value = "".join(_pill(s, counts[s.value]) for s in State)
            self.limits_html.value = limits_line(self.queue.limits())
            self.schedules_html.value = schedules_line(self.queue.manager.schedule_rows())
            total = sum(counts.values())
            done = sum(counts[s.value] for s in FINISHED)
            self.progress.max = max(total, 1)
            self.progress.value = done
            self.progress_label.value = (
                f"&nbsp;{done} of {total} finished · {counts['running']} running · "
                f"{counts['pending'] + counts['failed']} waiting"
                + (f" · {counts['blocked']} blocked" if counts["blocked"] else "")
            )
            self.table.value = jobs_table(rows, waiting_notes(self.queue, rows))
            self.page_label.value = f"&nbsp;page {self.page + 1} of {pages} ({matching} jobs)&nbsp;"
            self.newer.disabled = self.page == 0
            self.older.disabled = self.page >= pages - 1
            options = [(NO_JOB, 0)] + [
                (f"#{j.id} {j.task or 'payload'} ({j.status.value})", j.id) for j in rows
            ]
            if list(self.job_select.options) != options:
                chosen = self.job_select.value
                self.job_select.options = options
                self.job_select.value = chosen if chosen in [o[1] for o in options] else 0
            self._show_detail()

    def select(self, job_id: int | None) -> None:
        """Show one job's details (it must be on the current page); None clears."""
        self.job_select.value = job_id or 0

    def _show_detail(self) -> None:
        job_id = self.job_select.value
        listed = next((j for j in self.rows if j.id == job_id), None)
        # Its parents and children move too: any change of the counts reads it again.
        key = (job_id, None if listed is None else listed.updated_at, tuple(self.counts.values()))
        if key == self._detail_key:  # unchanged: the whole job is read only when it changes
            return
        self._detail_key = key
        try:
            job = self.queue.get(job_id) if job_id else None
        except NbqueueError:
            job = None
        self.cancel_button.disabled = job is None or job.finished
        extra = "" if job is None else family(self.queue, job) + steps_table(self.queue, job)
        self.detail.value = job_detail(job, extra)

    def _cancel(self) -> None:
        """Cancel the selected job; a running one is told to stop (process mode kills it)."""
        job_id = self.job_select.value
        with self._lock:
            try:
                self.queue.cancel(job_id)
                self.message.value = f"<span class='nbqueue-message'>cancelled job {job_id}</span>"
            except NbqueueError as exc:
                self.message.value = f"<span style='color:#dc3545'>{html.escape(str(exc))}</span>"
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
        self.refresh()
        self._start_timer()

    def refresh(self) -> None:
        with self._lock:
            graph = self.queue.manager.graph(self.of)
            counts: dict[State, int] = {}
            for job, _ in graph:
                counts[job.status] = counts.get(job.status, 0) + 1
            self.counts_html.value = "".join(_pill(s, counts[s]) for s in State if s in counts)
            self.drawing.value = f"<div style='overflow:auto;max-height:40em'>{svg(graph, self.title)}</div>"


class DeadLetterView(_LiveView):
    """The dead jobs, their tracebacks, and buttons that requeue or delete them."""

    def __init__(
        self,
        queue: Queue,
        *,
        queue_name: str | None = None,
        interval: float = 2.0,
        limit: int = 200,
        **kw: Any,
    ) -> None:
        super().__init__(queue, interval, **kw)
        self.queue_name = queue_name
        self.limit = limit
        self.jobs: list[Job] = []
        self._detail_key: tuple[int | None, object] | None = None
        self.header = widgets.HTML()
        self.select = widgets.SelectMultiple(
            options=[], rows=3, description="select", layout={"width": "auto", "min_width": "50%"}
        )
        self.requeue_selected = widgets.Button(description="Requeue selected", button_style="primary")
        self.requeue_all = widgets.Button(description="Requeue all", button_style="warning")
        self.delete_selected = widgets.Button(description="Delete selected", button_style="danger")
        self.refresh_button = widgets.Button(description="Refresh", icon="refresh")
        self.message = widgets.HTML()
        self.table = widgets.HTML()
        self.traceback = widgets.HTML()
        self.children = [
            self.header,
            self.table,
            self.select,
            widgets.HBox(
                [self.requeue_selected, self.requeue_all, self.delete_selected, self.refresh_button]
            ),
            self.message,
            self.traceback,
        ]
        self.add_class("nbqueue-deadletters")
        self.requeue_selected.on_click(lambda _b: self._act("requeue", list(self.select.value)))
        self.requeue_all.on_click(lambda _b: self._act("requeue", None))
        self.delete_selected.on_click(lambda _b: self._act("delete", list(self.select.value)))
        self.refresh_button.on_click(lambda _b: self.refresh())
        self.select.observe(lambda _change: self._show_traceback(), names="value")
        self.refresh()
        self._start_timer()

    def refresh(self) -> None:
        with self._lock:
            jobs = self.queue.jobs(State.DEAD, self.queue_name, self.limit, brief=True)
            total = self.queue.counts(self.queue_name)["dead"]
            self.jobs = jobs
            self.header.value = (
                f"<b>dead letters</b> <span class='nbqueue-dead-count' data-count='{total}'>{total}</span>"
                f" in <code>{html.escape(str(self.queue))}</code>"
                + (f" (showing the newest {len(jobs)})" if total > len(jobs) else "")
            )
            options = [
                (f"#{j.id} {j.task or 'payload'}: {(last_line(j.error) or '')[:70]}", j.id) for j in jobs
            ]
            self.select.rows = min(max(len(jobs), 2), 8)
            if list(self.select.options) != options:
                keep = tuple(v for v in self.select.value if v in {j.id for j in jobs})
                self.select.options = options
                self.select.value = keep
            self.table.value = jobs_table(jobs)
            for button in (self.requeue_selected, self.delete_selected):
                button.disabled = not self.select.value
            self.requeue_all.disabled = not jobs
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
        except NbqueueError:
            job = None
        self.traceback.value = job_detail(job) if job else "<i>select dead jobs to see their tracebacks</i>"

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
