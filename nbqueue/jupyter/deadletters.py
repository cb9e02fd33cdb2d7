"""The dead-letter view: dead jobs grouped by error, requeued or deleted a group at a time."""

from __future__ import annotations

import html
from typing import Any

import ipywidgets as widgets

from ..errors import DamagedJob, NbqueueError
from ..frames import last_line
from ..jobs import Job, State, shown_task
from ..notebooks import NOTEBOOK_TASK
from ..queue import Queue
from .lab import server_root
from .live import LiveView
from .render import DeadGroup, attempts_table, dead_groups, error_kind, groups_table, job_detail, jobs_table
from .table import ClickTable

DEAD_SCANNED = 5_000  # the newest dead jobs the view groups (the header says when there are more)


class DeadLetterView(LiveView):
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
        super().__init__(interval, **kw)
        self.queue = queue
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
