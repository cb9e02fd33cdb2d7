"""What a job emits (`nbqueue.emit`), as the views show it: the tail of its stream in the board's
detail pane and in `%jobs --follow ID`, and its last item in a pinned running row.

A view reads a stream with `job.stream(follow=False)` at each refresh (never by following it:
that would hold the timer, or the kernel, until the job ends) and shows its tail, text items
joined as they come and any other value on a line of its own (`nbqueue.streams.joined`).
"""

from __future__ import annotations

import html
import json
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import ipywidgets as widgets

from ..dag import COLOURS
from ..errors import JobNotFound, NbqueueError
from ..jobs import Job, State, shown_task
from ..queue import Queue
from ..streams import Dropped, joined
from .live import LiveView

STREAM_LINES = 200  # lines of a stream a view shows at most (its newest)
STREAM_CHARS = 20_000  # characters of a stream a view shows at most (its newest)
# Items a view keeps while it reads a stream: the tail it can show. The stream's own bound
# (`stream_bytes`, 1 MiB by default) bounds what is read.
STREAM_ITEMS = 5_000
LAST_ITEM_CHARS = 60  # characters of a job's last item its pinned row shows (the rest on hover)
_HOVER_CHARS = 500  # characters of a last item its row's title holds


@dataclass(frozen=True, slots=True)
class Tail:
    """The newest part of a stream, as text a view shows."""

    text: str
    items: int  # items read (a Dropped note not counted)
    dropped: int  # items the stream's bound dropped before the first one read
    cut: bool  # older items or lines were left out of `text`


def tail_of(items: Iterable[Any]) -> Tail:
    """The tail of a stream's items: at most STREAM_LINES lines and STREAM_CHARS characters."""
    kept: deque[Any] = deque(maxlen=STREAM_ITEMS)
    count = dropped = 0
    for item in items:
        if isinstance(item, Dropped):
            dropped += item.count
        else:
            count += 1
        kept.append(item)
    cut = count + (1 if dropped else 0) > len(kept)
    text = joined(list(kept))
    lines = text.splitlines(keepends=True)
    if len(lines) > STREAM_LINES:
        text, cut = "".join(lines[-STREAM_LINES:]), True
    if len(text) > STREAM_CHARS:
        text, cut = text[-STREAM_CHARS:], True
    return Tail(text, count, dropped, cut)


def read_tail(job: Job) -> Tail:
    """What the job has emitted so far (its latest attempt's stream), read now, as its tail."""
    return tail_of(job.stream(follow=False))


def stream_html(job: Job, tail: Tail | None, error: str = "") -> str:
    """A job's stream under a "stream" heading: its tail, newest at the bottom and scrolled to
    it, and what was left out; "" when the job emitted nothing (and nothing went wrong)."""
    if error:
        return (
            f"<div class='nbqueue-stream' data-job-id='{job.id}'><b>stream</b> "
            f"<span style='color:#dc3545'>cannot be read: {html.escape(error)}</span></div>"
        )
    if tail is None or (not tail.items and not tail.dropped):
        return ""
    live = not job.finished
    said = [f"{tail.items:,} item{'s' if tail.items != 1 else ''}"]
    if live:
        said.insert(0, f"<span style='color:{COLOURS[State.RUNNING]};font-weight:600'>live</span>")
    if tail.dropped:
        said.append(f"{tail.dropped:,} earlier dropped by the stream's bound")
    if tail.cut:
        said.append(f"the last {STREAM_LINES} lines or {STREAM_CHARS:,} characters: job.stream() has it all")
    # column-reverse: the box opens scrolled to its end, where the newest text is
    box = (
        "display:flex;flex-direction:column-reverse;max-height:16em;overflow:auto;"
        "background:#f6f8fa;margin:2px 0 6px 0"
    )
    return (
        f"<div class='nbqueue-stream' data-job-id='{job.id}' data-items='{tail.items}' "
        f"data-live='{int(live)}'><b>stream</b> <span style='font-size:12px;color:#495057'>"
        f"{' · '.join(said)}</span><div class='nbqueue-stream-box' style='{box}'>"
        f"<pre style='white-space:pre-wrap;margin:0;padding:6px'>{html.escape(tail.text)}</pre>"
        "</div></div>"
    )


def last_item_text(item: Any) -> str:
    """An item on one line: text as it is (its whitespace runs made one space), any other value
    as JSON."""
    text = item if isinstance(item, str) else str(item) if isinstance(item, Dropped) else json.dumps(item)
    return " ".join(text.split())


def last_item_cell(item: Any) -> str:
    """A running row's last emitted item: short, clipped with an ellipsis, whole on hover."""
    text = last_item_text(item)
    shown = text if len(text) <= LAST_ITEM_CHARS else text[: LAST_ITEM_CHARS - 1] + "…"
    return (
        f"<span class='nbqueue-last-item' title='{html.escape(text[:_HOVER_CHARS])}'>"
        f"<span style='color:#6c757d'>emitted</span> <code>{html.escape(shown)}</code></span>"
    )


class StreamView(LiveView):
    """`%jobs --follow ID`: one job's stream growing while it runs, refreshed by a timer thread
    (the kernel stays free for other cells) until the job finishes."""

    def __init__(self, queue: Queue, job_id: int, *, interval: float = 1.0, **kwargs: Any) -> None:
        super().__init__(interval, **kwargs)
        self.queue = queue
        self.job_id = job_id
        self.job = queue.get(job_id)  # JobNotFound before any widget is shown
        self.head = widgets.HTML()
        self.body = widgets.HTML(layout={"width": "auto"})
        self.children = [self.head, self.body]
        self.layout.width = "auto"
        self.add_class("nbqueue-follow")
        self.refresh()
        if not self.job.finished:
            self._start_timer()

    def refresh(self) -> None:
        """Read the job, then its stream (a job read as finished has all its items stored), and
        stop refreshing once it is finished."""
        with self._lock:
            try:
                self.job = job = self.queue.get(self.job_id)
                tail, error, gone = read_tail(job), "", False
            except NbqueueError as exc:  # gone (deleted, purged: no more to show), or the queue is away
                job, tail, error, gone = self.job, None, str(exc), isinstance(exc, JobNotFound)
            colour = COLOURS[job.status]
            self.head.value = (
                f"<b>#{job.id} {html.escape(shown_task(job.task))}</b> · "
                f"<span style='color:{colour}'>{job.status.value}</span>"
                + ("" if job.finished else " · following")
            )
            nothing = f"<i>nothing emitted{'' if job.finished else ' yet'}</i>"
            self.body.value = stream_html(job, tail, error) or nothing
            if job.finished or gone:
                self.stop()
