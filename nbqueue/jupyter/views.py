"""The live job board and the dead-letter view (ipywidgets).

A timer thread refreshes each view by reading the queue and setting widget
values; it never displays anything, so no output lands in a running cell.
Tables are paged in SQL, so a view of a million-job queue stays fast.
"""

from __future__ import annotations

import html
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import ipywidgets as widgets

from .. import tasks as registry
from ..dag import svg
from ..errors import DamagedJob, NbqueueError
from ..frames import last_line
from ..jobs import Job, State, shown_task
from ..notebooks import NOTEBOOK_TASK
from ..queue import Queue
from ..workflows import Planned, Workflow
from .lab import server_root
from .render import (
    FAMILY_SHOWN,
    STEP_PREVIEW,
    DeadGroup,
    attempts_table,
    dead_groups,
    error_kind,
    family_html,
    groups_table,
    held_back_notes,
    job_detail,
    jobs_table,
    limits_line,
    missing_line,
    or_damage,
    outcome_bar,
    pill,
    schedules_line,
    steps_html,
)
from .table import ClickTable

log = logging.getLogger("nbqueue.views")

ALL = "all"
GRAPH_DRAWN = 300  # jobs of a job's graph the detail pane draws (q.graph has them all)


def family(queue: Queue, job: Job) -> str:
    """A job's parents and children with their states, what it waits for, and its graph drawn."""
    parents, children = queue.relatives(job)
    if not parents and not children:
        return ""
    known = queue.find([*parents[:FAMILY_SHOWN], *children[:FAMILY_SHOWN]])
    note = queue.what_blocks([job]).get(job.id)
    drawing = svg(queue.graph_rows(job, limit=GRAPH_DRAWN))
    return family_html(job, parents, children, known, note, drawing)


def steps_table(queue: Queue, job: Job) -> str:
    """A job's durable steps, each value a preview (the pane reads no more of it, however big)."""
    return steps_html(queue.step_rows(job, preview=STEP_PREVIEW + 1))  # one more: a value that long was cut


def graph_html(queue: Queue, of: Workflow | Planned | Job | int, title: str = "") -> str:
    """A workflow's (or a job's) graph drawn as SVG."""
    return svg(queue.graph_rows(of), title)


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
        self.outcome = widgets.HTML(layout={"width": "auto"})
        self.chart = widgets.HTML(layout={"width": "auto"})
        self.limits_html = widgets.HTML()
        self.schedules_html = widgets.HTML()
        self.missing_html = widgets.HTML()  # pending jobs no task of this kernel runs
        self._missing_at, self._missing_version, self._missing_took = -CHART_EVERY, -1, 0.0
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
        self.table = ClickTable(layout={"width": "auto"})
        self.cancel_button = widgets.Button(
            description="Cancel job", icon="stop", disabled=True, layout=small
        )
        self.requeue_button = widgets.Button(
            description="Requeue job", icon="redo", disabled=True, layout=small
        )
        # A notebook job fixed in its file: requeue it to run the file as it is now.
        self.reload_button = widgets.Button(
            description="Requeue with current file", icon="file", layout={"width": "auto", "display": "none"}
        )
        self.message = widgets.HTML()
        self.detail = widgets.HTML(layout={"width": "auto"})
        self.children = [
            widgets.HBox([self.title, self.refresh_button], layout={"justify_content": "space-between"}),
            self.counts_html,
            self.outcome,
            self.chart,
            self.missing_html,
            self.limits_html,
            self.schedules_html,
            widgets.HBox([self.status_filter, self.queue_filter, self.newer, self.page_label, self.older]),
            self.table,
            widgets.HBox([self.cancel_button, self.requeue_button, self.reload_button, self.message]),
            self.detail,
        ]
        self.layout.width = "auto"
        self.add_class("nbqueue-board")
        self.status_filter.observe(self._filter_changed, names="value")
        self.queue_filter.observe(self._filter_changed, names="value")
        self.table.observe(lambda _change: self._show_detail(), names="selected")
        self.refresh_button.on_click(lambda _b: self.refresh())
        self.cancel_button.on_click(lambda _b: self._act("cancel"))
        self.requeue_button.on_click(lambda _b: self._act("requeue"))
        self.reload_button.on_click(lambda _b: self._act("reload"))
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
            running = self.queue.jobs(State.RUNNING, queue, RUNNING_SHOWN, brief=True) if pinned else []
            if status is not None:
                matching = counts[status]
            else:
                matching = sum(counts.values()) - (counts["running"] if pinned else 0)
            pages = max(1, -(-matching // self.page_size))
            self.page = min(self.page, pages - 1)
            offset = self.page * self.page_size
            rows = self.queue.jobs(shown or status, queue, self.page_size, offset, brief=True)
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
            self.counts_html.value = "".join(pill(s, counts[s.value]) for s in State)
            self.outcome.value = outcome_bar(counts)
            self._draw_chart()
            now = self.queue.now()
            limits: list[Any] = []  # the frame, once read: held-back jobs say which key holds them

            def limits_now() -> str:
                limits.append(self.queue.limits())
                return limits_line(limits[0], now)

            self.limits_html.value = or_damage("LIMITS", limits_now)
            self.schedules_html.value = or_damage(
                "SCHEDULES", lambda: schedules_line(self.queue.schedule_rows())
            )
            self._show_missing(counts["pending"], counts["running"])
            more = counts["running"] - len(running) if pinned else 0  # filtered: they are the rows
            notes = self.queue.what_blocks(rows) | (held_back_notes(rows, limits[0], now) if limits else {})
            shown_running = [*running, *(row for row in rows if row.status is State.RUNNING)]
            self.table.value = jobs_table(
                rows,
                notes,
                running=running,
                silent=self.queue.silent_jobs(shown_running) if shown_running else set(),
                selected=self.table.selected,
            ) + (
                f"<div style='font-size:12px'>+{more} more running: status filter 'running'</div>"
                if more > 0
                else ""
            )
            first = offset + 1 if rows else 0
            above = f" · {len(running)} running above" if pinned else ""
            self.page_label.value = f"&nbsp;{first}-{offset + len(rows)} of {matching:,}{above}&nbsp;"
            self.newer.disabled = self.page == 0
            self.older.disabled = self.page >= pages - 1
            self._show_detail()

    def _show_missing(self, pending: int, running: int) -> None:
        """Say which pending jobs no task of this kernel runs. It counts the pending jobs per task
        (0.15 s at 300,000 of them), so it is read at once when a task was registered here, and
        otherwise only while nothing runs (the queue looks stuck), at most every CHART_EVERY
        seconds or fifty times the last read's time."""
        version = registry.version()
        every = max(CHART_EVERY, 50 * self._missing_took)
        stuck = not running and time.monotonic() - self._missing_at >= every
        if not pending:
            self.missing_html.value = ""
        elif stuck or version != self._missing_version:
            started = time.monotonic()
            self.missing_html.value = or_damage(
                "NO TASK HERE", lambda: missing_line(self.queue.missing_tasks())
            )
            self._missing_at, self._missing_version = time.monotonic(), version
            self._missing_took = self._missing_at - started

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
        reloadable = not self.requeue_button.disabled and job is not None and job.task == NOTEBOOK_TASK
        self.reload_button.layout.display = None if reloadable else "none"
        if job is None:
            self.detail.value = job_detail(None)
            return
        # A finished job's steps change only with its row (a replay or requeue moves it): read
        # once, not at each change of the counts; an unfinished job's are read each time.
        mark = (job.id, job.updated_at)
        if not job.finished or self._steps[0] != mark:
            self._steps = (mark, steps_table(self.queue, job))
        extra = family(self.queue, job) + self._steps[1]
        self.detail.value = job_detail(job, extra, attempts_table(self.queue.attempts(job)), server_root())

    def _act(self, action: str) -> None:
        """Cancel (a running job is told to stop; process mode kills it) or requeue the job shown."""
        job_id = self.table.selected
        with self._lock:
            try:
                if action == "cancel":
                    self.queue.cancel(job_id)
                    text = f"cancelled job {job_id}"
                else:
                    self.queue.requeue([job_id], reload=action == "reload")
                    text = f"requeued job {job_id}" + (
                        " with the notebook file as it is now" if action == "reload" else ""
                    )
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
            graph = self.queue.graph_rows(self.of)
            counts: dict[State, int] = {}
            for job, _ in graph:
                counts[job.status] = counts.get(job.status, 0) + 1
            self.counts_html.value = "".join(pill(s, counts[s]) for s in State if s in counts)
            # Everything the drawing shows of each job: states that have not moved redraw nothing.
            shown = [(job.id, job.task, job.status, job.error, tuple(parents)) for job, parents in graph]
            if shown != self._drawn:
                self._drawn = shown
                self.drawing.value = (
                    f"<div style='overflow:auto;max-height:40em'>{svg(graph, self.title)}</div>"
                )


DEAD_SCANNED = 5_000  # the newest dead jobs the view groups (the header says when there are more)


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
        self.reload_selected = widgets.Button(  # shown when a chosen job is a notebook job
            description="Requeue with current file",
            button_style="primary",
            layout={"width": "auto", "display": "none"},
        )
        self.delete_selected = widgets.Button(
            description="Delete selected", button_style="danger", layout=small
        )
        self.refresh_button = widgets.Button(description="Refresh", icon="refresh", layout=small)
        self.message = widgets.HTML()
        self.groups_table = ClickTable(layout={"width": "auto"})
        self.table = ClickTable(layout={"width": "auto"})
        self.newer = widgets.Button(description="Newer", icon="arrow-left", disabled=True, layout=small)
        self.older = widgets.Button(description="Older", icon="arrow-right", layout=small)
        self.page_label = widgets.HTML()
        self.traceback = widgets.HTML(layout={"width": "auto"})
        # The jobs chosen for "Requeue/Delete selected": a click on a row chooses it; code may
        # set several (view.select.value = (3, 4)). Kept as a widget, not shown.
        self.select = widgets.SelectMultiple(options=[])
        self.children = [
            self.header,
            widgets.HBox(
                [
                    self.requeue_selected,
                    self.reload_selected,
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
        self.layout.width = "auto"
        self.add_class("nbqueue-deadletters")
        self.requeue_selected.on_click(lambda _b: self._act("requeue", list(self.select.value)))
        self.requeue_all.on_click(lambda _b: self._act("requeue", None))
        self.reload_selected.on_click(lambda _b: self._act("reload", list(self.select.value)))
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
        notebook_jobs = {j.id for j in self.jobs if j.task == NOTEBOOK_TASK}
        self.reload_selected.layout.display = None if notebook_jobs & set(chosen) else "none"
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
        self.traceback.value = job_detail(
            job, attempts=attempts_table(self.queue.attempts(job)), lab_root=server_root()
        )

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
                elif action in ("requeue", "reload"):
                    n = self.queue.requeue(ids, reload=action == "reload")
                    text = f"requeued {n} job(s)" + (" with the current files" if action == "reload" else "")
                else:
                    text = f"deleted {self.queue.delete(ids)} job(s)"
                self.message.value = f"<span class='nbqueue-message'>{html.escape(text)}</span>"
            except NbqueueError as exc:
                self.message.value = f"<span style='color:#dc3545'>{html.escape(str(exc))}</span>"
            self.select.value = ()
            self.refresh()
