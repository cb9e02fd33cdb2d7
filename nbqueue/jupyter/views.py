"""The live job board and the dead-letter view (ipywidgets).

A timer thread refreshes each view by reading the queue and setting widget
values; it never displays anything, so no output lands in a running cell.
Tables are paged in SQL, so a view of a million-job queue stays fast.
"""

from __future__ import annotations

import base64
import functools
import html
import logging
import threading
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

import ipywidgets as widgets

from .. import tasks as registry
from ..clock import to_us
from ..dag import svg
from ..errors import DamagedJob, NbqueueError
from ..inbox import open_wait
from ..jobs import Job, State
from ..notebooks import NOTEBOOK_TASK
from ..queue import Queue
from ..workflows import Planned, Workflow
from .deadletters import DeadLetterView
from .lab import server_root
from .live import LiveView
from .needs import NeedsYou, Waiting
from .render import (
    FAMILY_SHOWN,
    STEP_PREVIEW,
    attempts_table,
    family_html,
    held_back_notes,
    job_detail,
    jobs_table,
    legend,
    limits_line,
    missing_line,
    or_damage,
    outcome_bar,
    pill,
    schedules_line,
    steps_html,
)
from .sign import Sign
from .stream_view import last_item_cell, read_tail, stream_html
from .table import PANE, ClickTable
from .waits import for_a_person, waits_html
from .waits import note as wait_note

log = logging.getLogger("nbqueue.views")
__all__ = ["DeadLetterView", "GraphView", "JobBoard", "board_picture", "graph_html"]

ALL = "all"
GRAPH_DRAWN = 300  # jobs of a job's graph the detail pane draws (q.graph has them all)


def family(queue: Queue, job: Job) -> str:
    """A job's parents and children with their states, what it waits for, and its graph drawn."""
    parents, children = queue.relatives(job)
    if not parents and not children:
        return ""
    known = queue.find([*parents[:FAMILY_SHOWN], *children[:FAMILY_SHOWN]])
    note = queue.what_blocks([job]).get(job.id) or job.waits_for  # (a job it waits for is a parent)
    rows = queue.graph_rows(job, limit=GRAPH_DRAWN)
    drawing = svg(rows) + legend(j.status for j, _ in rows)
    return family_html(job, parents, children, known, note, drawing)


def steps_table(queue: Queue, job: Job) -> str:
    """A job's durable steps, each value a preview (the pane reads no more of it, however big)."""
    return steps_html(queue.step_rows(job, preview=STEP_PREVIEW + 1))  # one more: a value that long was cut


def graph_html(queue: Queue, of: Workflow | Planned | Job | int, title: str = "") -> str:
    """A workflow's (or a job's) graph drawn as SVG."""
    return svg(queue.graph_rows(of), title)


RUNNING_SHOWN = 10  # running jobs pinned at the top of the board (the count says how many more)
CHART_EVERY = 10.0  # seconds between redraws of the board's chart (it reads the last hour)
CHART_JOBS = 300  # the newest finished jobs the time-in-queue panel reads
EXPORT_ROWS = 10_000  # rows the board's CSV export holds at most (q.history(limit=) has the rest)
SEARCH_EVERY = 5.0  # seconds between re-reads of a search while nothing else changes
WAITING_READ = 1_000  # the oldest waiting jobs the board reads for "needs you" (q.waiting() has all)
# The count chips' order: waiting jobs beside the running ones, then State's order.
_FIRST = (State.PENDING, State.RUNNING, State.WAITING)
CHIPS = (*_FIRST, *(s for s in State if s not in _FIRST))


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


class JobBoard(LiveView):
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
        super().__init__(interval, **kwargs)
        self.queue = queue
        self.page_size = page_size
        self.page = 0
        self.chart_wanted = chart
        self._chart_at = 0.0
        self._chart_thread: threading.Thread | None = None
        self._updating = False
        self._detail_key: tuple[int, object, tuple[int, ...]] | None = None
        self._steps: tuple[object, str] = (None, "")  # a finished job's steps table, read once
        self._shown: Job | None = None  # the job the detail pane shows, as last read whole
        self._stream_mark: object = None  # the finished job whose stream is shown (read once)
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
            layout={"width": "200px"},
            style={"description_width": "44px"},
        )
        self.queue_filter = widgets.Dropdown(
            options=[ALL],
            value=ALL,
            description="queue",
            layout={"width": "200px"},
            style={"description_width": "44px"},
        )
        if queue_name:  # a queue with no jobs yet is still a valid filter
            self.queue_filter.options = [ALL, queue_name]
            self.queue_filter.value = queue_name
        self.refresh_button = widgets.Button(description="Refresh", icon="refresh", layout=small)
        self.newer = widgets.Button(description="Newer", icon="arrow-left", disabled=True, layout=small)
        self.older = widgets.Button(description="Older", icon="arrow-right", layout=small)
        self.page_label = widgets.HTML()
        self.search = widgets.Text(
            placeholder="find: id, task, key, error, output…",
            continuous_update=False,
            layout={"width": "260px"},
        )
        self.jump = widgets.BoundedIntText(
            value=1,
            min=1,
            max=1,
            description="page",
            layout={"width": "130px"},
            style={"description_width": "34px"},
        )
        self.export_button = widgets.Button(description="Export CSV", icon="download", layout=small)
        self.download = widgets.HTML()  # the export's link, once made
        self.sign = Sign()  # jobs that need a person: a badge, the tab title's count
        self.needs = NeedsYou(queue, self.refresh)  # pinned first: the questions asked of a person
        self.waiting: list[Waiting] = []  # q.waiting_rows(), read again when the count moves
        self._waiting_key: object = None
        self._waiting_at, self._waiting_took = 0.0, 0.0
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
        self.detail = ClickTable(**PANE, layout={"width": "auto"})  # a click on a graph's job opens it
        # The stream has a widget of its own: read at each refresh while its job runs, it changes
        # without the rest of the pane being read and drawn again.
        self.stream_pane = widgets.HTML(layout={"width": "auto"})
        self.stream_pane.add_class("nbqueue-stream-pane")
        self.children = [
            widgets.HBox(
                [widgets.HBox([self.title, self.sign]), self.refresh_button],
                layout={"justify_content": "space-between"},
            ),
            self.needs,
            self.counts_html,
            self.outcome,
            self.chart,
            self.missing_html,
            self.limits_html,
            self.schedules_html,
            widgets.HBox(
                [self.status_filter, self.queue_filter, self.search, self.export_button, self.download]
            ),
            widgets.HBox([self.newer, self.page_label, self.older, self.jump]),
            self.table,
            widgets.HBox([self.cancel_button, self.requeue_button, self.reload_button, self.message]),
            self.detail,
            self.stream_pane,
        ]
        self.layout.width = "auto"
        self.add_class("nbqueue-board")
        self.status_filter.observe(self._filter_changed, names="value")
        self.queue_filter.observe(self._filter_changed, names="value")
        self.table.observe(lambda _change: self._show_detail(), names="selected")
        self.detail.observe(lambda change: self.select(change["new"]), names="selected")
        self.search.observe(self._filter_changed, names="value")
        self.jump.observe(self._jumped, names="value")
        self.export_button.on_click(lambda _b: self.export())
        self.sign.on_looked(self.looked)
        self._seen_at = queue.now()  # the sign counts what went dead after the person last looked
        self._sign_key: tuple[int, int, datetime] | None = None
        self._search_key: tuple[object, ...] | None = None
        self._searched_at, self._search_took = 0.0, 0.0
        self._found: tuple[int, list[Job]] = (0, [])  # the last search's count and page
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
        self.download.value = ""  # an export of the old view would mislead
        self.refresh()

    def _turn(self, step: int) -> None:
        self.page = max(0, self.page + step)
        self.refresh()

    def _jumped(self, change: Any) -> None:
        if not self._updating and change["new"] - 1 != self.page:
            self.page = max(0, change["new"] - 1)
            self.refresh()

    def looked(self) -> None:
        """The person has seen the board: what went dead before now no longer counts as news."""
        self._seen_at = self.queue.now()
        self._sign_key = None
        self.refresh()

    def _listing(self) -> tuple[str | None, str | None, str | None]:
        status = None if self.status_filter.value == ALL else self.status_filter.value
        queue = None if self.queue_filter.value == ALL else self.queue_filter.value
        return status, queue, self.search.value.strip() or None

    def export(self) -> None:
        """Offer the rows the board lists now (filters and search applied, running jobs too) as a
        CSV file: `q.history()`'s columns, the newest EXPORT_ROWS at most."""
        status, queue, search = self._listing()
        try:
            frame = self.queue.history(status, queue, EXPORT_ROWS, search=search)
        except NbqueueError as exc:
            self.download.value = f"<span style='color:#dc3545'>{html.escape(str(exc))}</span>"
            return
        data = base64.b64encode(frame.to_csv(index=False).encode()).decode()
        cut = (
            f" (the newest {EXPORT_ROWS:,}: q.history(limit=) for more)" if len(frame) == EXPORT_ROWS else ""
        )
        self.download.value = (
            f"<a class='nbqueue-download' download='nbqueue-jobs.csv' data-rows='{len(frame)}' "
            f"href='data:text/csv;base64,{data}'>download nbqueue-jobs.csv, {len(frame):,} row"
            f"{'' if len(frame) == 1 else 's'}</a>{cut}"
        )

    def _pages(self, matching: int) -> int:
        return max(1, -(-matching // self.page_size))

    def _page_of(
        self,
        status: str | None,
        queue: str | None,
        search: str | None,
        counts: dict[str, int],
        pinned: bool,
        reuse: bool,
    ) -> tuple[int, list[Job]]:
        """How many jobs the table lists, and the rows of its page. With `reuse` (the timer's
        refresh), a search shown a moment ago is not read again: it scans up to a quarter million
        jobs; it is read again when it changed, now and then, and on any refresh asked for."""
        shown = [s for s in State if s is not State.RUNNING] if pinned else None
        if search is None:
            if status is not None:
                matching = counts[status]
            else:
                matching = sum(counts.values()) - (counts["running"] if pinned else 0)
        else:
            key = (status, queue, search, self.page)
            every = max(SEARCH_EVERY, 20 * self._search_took)
            if reuse and key == self._search_key and time.monotonic() - self._searched_at < every:
                return self._found
            started = time.monotonic()
            matching = self.queue.count(status, queue, search)
            self._search_key, self._searched_at = key, time.monotonic()
            self._search_took = self._searched_at - started
        self.page = min(self.page, self._pages(matching) - 1)
        offset = self.page * self.page_size
        rows = self.queue.jobs(shown or status, queue, self.page_size, offset, brief=True, search=search)
        if search is not None:
            self._found = (matching, rows)
        return matching, rows

    def _show_sign(self, dead: int, asked: int) -> None:
        """The badge and the tab's title count the jobs waiting for a person (in every queue)
        and those that went dead since the person last looked (read again only when the dead
        count moves)."""
        key = (dead, asked, self._seen_at)
        if key == self._sign_key:
            return
        self._sign_key = key
        new = self.queue.dead_since(self._seen_at) if dead else 0
        said = [f"{asked} need{'s' if asked == 1 else ''} you" if asked else ""]
        said.append(f"{new} new dead" if new else "")
        self.sign.show(asked + new, " · ".join(s for s in said if s))

    def _read_waiting(self, waiting: int, reuse: bool) -> list[Waiting]:
        """The waiting jobs and their waits, read again when their count moves, on a refresh
        asked for, and now and then (a deadline comes closer; one answered as another began)."""
        every = max(SEARCH_EVERY, 20 * self._waiting_took)
        fresh = time.monotonic() - self._waiting_at < every
        if reuse and fresh and waiting == self._waiting_key:
            return self.waiting
        started = time.monotonic()
        self.waiting = self.queue.waiting_rows(limit=WAITING_READ) if waiting else []
        self._waiting_key, self._waiting_at = waiting, time.monotonic()
        self._waiting_took = self._waiting_at - started
        return self.waiting

    def _waiting_notes(self, jobs: list[Job], now_us: int) -> dict[int, str]:
        """What each waiting job listed waits for: a question, a wake-up time, jobs (named with
        their states, as blocked jobs name their parents)."""
        read = {job.id: row for job, row, _ in self.waiting}
        notes: dict[int, str] = {}
        waiting = [job for job in jobs if job.status is State.WAITING]
        for job in waiting:
            if job.id not in read:  # beyond the oldest read: its own wait, read now
                read[job.id] = open_wait(self.queue.waits(job))
        parents = {
            job.id: self.queue.relatives(job)[0]
            for job in waiting
            if (row := read.get(job.id)) is not None and row.kind == "jobs"
        }
        known = self.queue.find({p for ps in parents.values() for p in ps}) if parents else {}
        for job in waiting:
            notes[job.id] = wait_note(job, read.get(job.id), now_us, known, parents.get(job.id, []))
        return notes

    def tick(self) -> None:
        self.refresh(reuse_search=True)

    def refresh(self, reuse_search: bool = False) -> None:
        """Re-read the queue and update the widgets (`reuse_search`: keep a search's rows read a
        moment ago, as the timer does)."""
        with self._lock:
            status, queue, search = self._listing()
            everywhere = self.queue.counts()
            counts = everywhere if queue is None else self.queue.counts(queue)
            now_us = to_us(self.queue.now().timestamp())
            waiting = self._read_waiting(everywhere["waiting"], reuse_search)
            self._show_sign(everywhere["dead"], sum(1 for _, row, _ in waiting if for_a_person(row)))
            mine = [w for w in waiting if queue is None or w[0].queue == queue]
            self.needs.update(mine, now_us, more_read=len(waiting) == WAITING_READ)
            # Running jobs are pinned above the table when it lists every state; the pages
            # then hold the rest, newest first.
            pinned = status is None and search is None and counts["running"] > 0
            running = self.queue.jobs(State.RUNNING, queue, RUNNING_SHOWN, brief=True) if pinned else []
            try:
                matching, rows = self._page_of(status, queue, search, counts, pinned, reuse_search)
            except NbqueueError as exc:
                matching, rows = 0, []
                self.message.value = f"<span style='color:#dc3545'>{html.escape(str(exc))}</span>"
            offset = self.page * self.page_size
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
            self.counts_html.value = "".join(pill(s, counts[s.value]) for s in CHIPS)
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
            notes |= self._waiting_notes(rows, now_us)
            held = self.queue.held_in_batches() & {job.id for job in running} if running else set()
            notes |= dict.fromkeys(held, "in this kernel's worker's batch: not running now")
            shown_running = [*running, *(row for row in rows if row.status is State.RUNNING)]
            emitted = self.queue.last_items(shown_running) if shown_running else {}  # one read
            self.table.value = jobs_table(
                rows,
                notes,
                running=running,
                silent=self.queue.silent_jobs(shown_running) if shown_running else set(),
                selected=self.table.selected,
                last={i: last_item_cell(item) for i, item in emitted.items()},
            ) + (
                f"<div style='font-size:12px'>+{more} more running: status filter 'running'</div>"
                if more > 0
                else ""
            )
            first = offset + 1 if rows else 0
            started = f" ({len(held)} of them in a batch, not running now)" if held else ""
            above = f" · {len(running)} running above{started}" if pinned else ""
            found = f" found for “{html.escape(search)}”" if search else ""
            self.page_label.value = f"&nbsp;{first}-{offset + len(rows)} of {matching:,}{found}{above}&nbsp;"
            pages = self._pages(matching)
            self.newer.disabled = self.page == 0
            self.older.disabled = self.page >= pages - 1
            self._updating = True
            try:
                self.jump.max, self.jump.value = pages, self.page + 1
            finally:
                self._updating = False
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
        self.detail.selected = job_id  # a click in the pane on this job again is no change
        listed = next((j for j in [*self.running, *self.rows] if j.id == job_id), None)
        # Its parents and children move too: any change of the counts reads it again.
        key = (job_id, None if listed is None else listed.updated_at, tuple(self.counts.values()))
        if key == self._detail_key:  # unchanged: the whole job is read only when it changes
            self._show_stream(listed if listed is not None else self._shown)
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
        self._shown = job
        self._show_stream(job)
        if job is None:
            self.detail.value = job_detail(None)
            return
        # A finished job's steps change only with its row (a replay or requeue moves it): read
        # once, not at each change of the counts; an unfinished job's are read each time.
        mark = (job.id, job.updated_at)
        if not job.finished or self._steps[0] != mark:
            self._steps = (mark, steps_table(self.queue, job))
        # What it waited for, and who answered and when, beside its family and steps.
        waits = waits_html(self.queue.waits(job), to_us(self.queue.now().timestamp()))
        extra = family(self.queue, job) + waits + self._steps[1]
        self.detail.value = job_detail(job, extra, attempts_table(self.queue.attempts(job)), server_root())

    def _show_stream(self, job: Job | None) -> None:
        """The shown job's stream: read again at each refresh while the job is unfinished (it
        grows), once when it is finished (it changes only with the row: a requeue, a replay)."""
        if job is None:
            self.stream_pane.value, self._stream_mark = "", None
            return
        mark = (job.id, job.updated_at, job.status)
        if job.finished and mark == self._stream_mark:
            return
        try:
            self.stream_pane.value = stream_html(job, read_tail(job))
        except NbqueueError as exc:  # deleted meanwhile, or the queue is away: the pane says so
            self.stream_pane.value = stream_html(job, None, str(exc))
        self._stream_mark = mark if job.finished else None

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


class GraphView(LiveView):
    """A workflow's graph (or the graph a job belongs to), drawn live: nodes coloured by state."""

    def __init__(
        self,
        queue: Queue | None,
        of: Workflow | Planned | Job | int,
        *,
        interval: float = 1.0,
        rows: Callable[[], list[tuple[Job, list[int]]]] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(interval, **kwargs)
        if rows is None:
            if queue is None:
                raise NbqueueError("a graph view needs its queue, or rows to draw")
            rows = functools.partial(queue.graph_rows, of)
        self.of = of
        self.rows = rows  # reads the graph: (job, parent ids) pairs
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
            graph = self.rows()
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
