"""The board's "needs you" section: the jobs waiting for a person, each with its question, its
deadline, a button per choice (or a JSON box and Send), and its last steps; a row of buttons
answers every job of a group alike ("approve all like this").

Widgets are built only when the set of questions changes, so a value half typed in a JSON
box survives the board's refreshes; the text around them is set again on each one.
"""

from __future__ import annotations

import html
import json
import time
from collections.abc import Callable, Sequence
from typing import Any

import ipywidgets as widgets

from ..errors import NbqueueError
from ..jobs import Job
from ..queue import Queue
from ..records import WaitRow
from .render import STEP_PREVIEW
from .waits import COLOUR, choices_of, entry_html, for_a_person, group_html, heading, label

NEEDS_SHOWN = 10  # jobs the section shows (the heading says how many more)
SAID_FOR = 10.0  # seconds a message stays once nothing is left to answer
JSON_HINT = 'a JSON value: "yes", 3, true, {"k": 1}'

Waiting = tuple[Job, WaitRow | None, str]  # a row of q.waiting_rows()


class Entry(widgets.HBox):  # type: ignore[misc]
    """One job a person is asked about: its question and context, and the buttons that answer."""

    def __init__(
        self,
        job: Job,
        row: WaitRow,
        answer: Callable[[int, str, Any], None],
        typed: Callable[[int, str, str], None],
    ) -> None:
        self.job, self.row = job, row
        self.info = widgets.HTML(layout={"width": "auto", "flex": "1 1 auto", "min_width": "0"})
        self.choices = [
            widgets.Button(
                description=label(value),
                tooltip=f"send {json.dumps(value, ensure_ascii=False)} to job {job.id} as {row.name!r}",
                button_style="primary" if i == 0 else "",
                layout={"width": "auto", "min_width": "80px"},
            )
            for i, value in enumerate(choices_of(row))
        ]
        for button, value in zip(self.choices, choices_of(row), strict=True):
            button.on_click(lambda _b, value=value: answer(job.id, row.name, value))
        parts: list[Any] = list(self.choices)
        self.text = widgets.Text(placeholder=JSON_HINT, layout={"width": "240px"})
        self.send = widgets.Button(description="Send", icon="paper-plane", layout={"width": "auto"})
        if not self.choices:  # any JSON value: typed, then sent
            self.send.on_click(lambda _b: typed(job.id, row.name, self.text.value))
            parts = [self.text, self.send]
        buttons = widgets.HBox(parts, layout={"flex": "0 0 auto", "align_items": "center"})
        super().__init__(
            [self.info, buttons],
            layout={
                "border_left": f"4px solid {COLOUR}",
                "padding": "2px 8px",
                "margin": "0 0 4px 0",
                "align_items": "center",
                "width": "auto",
            },
        )
        self.add_class("nbqueue-need-entry")

    def close(self) -> None:
        """Close the entry and every widget in it (a container leaves its children open)."""
        for part in [self.info, *self.choices, self.text, self.send, *self.children]:
            part.close()
        super().close()


class NeedsYou(widgets.VBox):  # type: ignore[misc]
    """The jobs that wait for a person, pinned at the top of the board (hidden when none)."""

    def __init__(self, queue: Queue, answered: Callable[[], None]) -> None:
        super().__init__(layout={"width": "auto", "display": "none"})
        self.queue = queue
        self.answered = answered  # the board refreshes once a value is sent
        self.head = widgets.HTML()
        self.groups = widgets.VBox()
        self.list = widgets.VBox(layout={"width": "auto"})
        self.message = widgets.HTML()
        self.entries: dict[int, Entry] = {}
        self.group_buttons: list[tuple[list[int], str, Any, widgets.Button]] = []
        self._shown: tuple[object, ...] = ()
        self._steps: dict[tuple[int, object], list[Any]] = {}  # a waiting job's steps do not move
        self._said_at = 0.0
        self.children = [self.head, self.groups, self.list, self.message]
        self.add_class("nbqueue-needs")

    def people(self, waiting: Sequence[Waiting]) -> list[tuple[Job, WaitRow]]:
        """The waiting jobs asked something by a person, oldest first."""
        return [(job, row) for job, row, _ in waiting if row is not None and for_a_person(row)]

    def update(self, waiting: Sequence[Waiting], now_us: int, more_read: bool = False) -> None:
        """Show these waiting jobs' questions (`waiting`: q.waiting_rows(), any kind of wait)."""
        asked = self.people(waiting)
        shown = asked[:NEEDS_SHOWN]
        # Every question counts, shown or not: the groups' buttons answer them all.
        keys = tuple((job.id, row.name, row.choices, row.reached_at) for job, row in asked)
        if keys != self._shown:
            self._rebuild(shown, asked)
            self._shown = keys
        for job, row in shown:
            entry = self.entries[job.id]
            entry.info.value = entry_html(job, row, self._steps_of(job), now_us)
        quiet = time.monotonic() - self._said_at > SAID_FOR
        if not asked and quiet:
            self.message.value = ""
        self.head.value = heading(len(asked), len(shown), more_read) if asked else ""
        self.layout.display = None if asked or self.message.value else "none"

    def _steps_of(self, job: Job) -> list[Any]:
        key = (job.id, job.updated_at)
        if key not in self._steps:
            try:
                self._steps[key] = self.queue.step_rows(job, preview=STEP_PREVIEW + 1)
            except NbqueueError:  # gone meanwhile: the next refresh drops it
                self._steps[key] = []
        return self._steps[key]

    def _rebuild(self, shown: list[tuple[Job, WaitRow]], asked: list[tuple[Job, WaitRow]]) -> None:
        old = self.entries
        self.entries = {}
        for job, row in shown:
            kept = old.get(job.id)
            same = kept is not None and (kept.row.name, kept.row.choices) == (row.name, row.choices)
            self.entries[job.id] = (
                kept if same and kept is not None else Entry(job, row, self.answer, self.answer_typed)
            )
        for job_id, entry in old.items():
            if self.entries.get(job_id) is not entry:
                entry.close()
        self._steps = {key: rows for key, rows in self._steps.items() if key[0] in self.entries}
        self.list.children = [self.entries[job.id] for job, _ in shown]
        self._group(asked)

    def _group(self, asked: list[tuple[Job, WaitRow]]) -> None:
        """A row of buttons for each group of jobs that ask alike (task, wait, choices)."""
        alike: dict[tuple[str | None, str, str], list[int]] = {}
        for job, row in asked:
            if row.choices and choices_of(row):
                alike.setdefault((job.task, row.name, row.choices), []).append(job.id)
        for old in self.groups.children:
            for part in old.children:
                part.close()
            old.close()
        self.group_buttons, lines = [], []
        for (task, name, choices), ids in alike.items():
            if len(ids) < 2:
                continue
            row_buttons = []
            for value in json.loads(choices):
                button = widgets.Button(
                    description=f"{label(value)} all {len(ids)}",
                    tooltip=f"send {json.dumps(value, ensure_ascii=False)} as {name!r} to jobs "
                    + ", ".join(map(str, ids)),
                    layout={"width": "auto"},
                )
                button.on_click(lambda _b, ids=ids, name=name, value=value: self.answer_all(ids, name, value))
                self.group_buttons.append((ids, name, value, button))
                row_buttons.append(button)
            lines.append(
                widgets.HBox(
                    [widgets.HTML(group_html(task, name, len(ids))), *row_buttons],
                    layout={"align_items": "center"},
                )
            )
        self.groups.children = lines

    def answer_typed(self, job_id: int, name: str, text: str) -> None:
        """Send the value a JSON box holds; text that is not JSON is said so, and nothing is sent."""
        try:
            value = json.loads(text)
        except ValueError:
            shown = text.strip()[:80]
            self._say(f'not sent to job {job_id}: {shown!r} is not JSON (a text needs quotes: "yes")', True)
            return
        self.answer(job_id, name, value)

    def answer(self, job_id: int, name: str, value: Any) -> None:
        """Send `value` (any JSON value) to one job under `name`."""
        self._deliver(lambda: self.queue.send(job_id, name, value), f"job {job_id}", name, value)

    def answer_all(self, job_ids: list[int], name: str, value: Any) -> None:
        """Send `value` to every job of a group in one transaction (all, or none if one refuses)."""
        self._deliver(
            lambda: self.queue.send_many(job_ids, name, value),
            f"{len(job_ids)} jobs ({', '.join(f'#{i}' for i in job_ids[:5])}"
            f"{', …' if len(job_ids) > 5 else ''})",
            name,
            value,
        )

    def _deliver(self, send: Callable[[], object], to: str, name: str, value: Any) -> None:
        shown = json.dumps(value, ensure_ascii=False)[:80]
        try:
            send()
        except NbqueueError as exc:  # answered elsewhere, expired, finished: said, never raised
            self._say(f"not sent to {to}: {exc}", error=True)
        else:
            self._say(f"sent {shown} to {to} as {name!r}")
        self.answered()

    def _say(self, text: str, error: bool = False) -> None:
        self._said_at = time.monotonic()
        style = "color:#dc3545" if error else "color:#198754"
        self.message.value = f"<span class='nbqueue-needs-message' style='{style}'>{html.escape(text)}</span>"
        self.layout.display = None
