"""What a running job emits, as the views show it (no browser): the board's detail pane, the
pinned running row's last item and `%jobs --follow ID`, on both backends."""

from __future__ import annotations

import html
import queue as python_queue
import re
from collections.abc import Iterator
from typing import Any

import pytest
from IPython.core.error import UsageError

import nbqueue
from nbqueue import Queue, State
from nbqueue.jupyter.stream_view import (
    LAST_ITEM_CHARS,
    STREAM_CHARS,
    STREAM_LINES,
    Tail,
    last_item_cell,
    stream_html,
    tail_of,
)
from nbqueue.jupyter.views import JobBoard
from nbqueue.streams import Dropped
from tests.helpers import wait_until

STOP = object()  # put in a feed: the job returns


class Feed:
    """What a fed job emits, one item at a time, when the test says."""

    def __init__(self) -> None:
        self.items: python_queue.Queue[Any] = python_queue.Queue()

    def __call__(self, *items: Any) -> None:
        for item in items:
            self.items.put(item)

    def task(self, q: Queue, name: str) -> Any:
        """A task that emits what the feed is given, until STOP."""

        @q.task(name=name, max_retries=0)
        def talk() -> str:
            while (item := self.items.get(timeout=60)) is not STOP:
                nbqueue.emit(item)
            return "done"

        return talk


@pytest.fixture
def feed() -> Iterator[Feed]:
    """A feed that is always stopped at teardown, so no worker thread stays in a job."""
    made = Feed()
    yield made
    made(STOP)


@pytest.fixture
def board_of(queue: Queue) -> Iterator[Any]:
    built: list[JobBoard] = []

    def build(**options: Any) -> JobBoard:
        board = JobBoard(queue, interval=3600, chart=False, **options)
        built.append(board)
        return board

    yield build
    for board in built:
        board.close()
    wait_until(lambda: not any(b.live for b in built), 5, "board timers stopped")


def shown(board: JobBoard, want: str) -> str:
    """The stream pane once a refresh shows `want` (items are written every 50 ms)."""

    def showing() -> str:
        board.refresh()
        return board.stream_pane.value if want in board.stream_pane.value else ""

    return wait_until(showing, 10, f"the stream pane showing {want!r}", every=0.05)


def pane_text(value: str) -> str:
    """The stream's text as the pane's <pre> holds it."""
    match = re.search(r"<pre[^>]*>(.*?)</pre>", value, re.S)
    assert match is not None, value
    return html.unescape(match.group(1))


def items_of(value: str) -> int:
    match = re.search(r"data-items='(\d+)'", value)
    assert match is not None, value
    return int(match.group(1))


def test_the_detail_pane_shows_a_running_jobs_stream_growing(queue: Queue, board_of: Any, feed: Feed) -> None:
    job = feed.task(queue, "stream_views.grow").enqueue()
    with queue.worker():
        wait_until(lambda: queue.get(job.id).status is State.RUNNING, 10, "the job running")
        board = board_of()
        board.select(job.id)
        assert board.stream_pane.value == ""  # nothing emitted yet: no stream heading
        feed("Hello", ", world")
        first = shown(board, "Hello, world")
        assert "<b>stream</b>" in first and "data-live='1'" in first and ">live<" in first
        assert items_of(first) == 2
        # Each refresh reads it again (the board's timer does): the pane grows.
        feed({"score": 0.9}, [1, 2], " and more", 7, "end")
        grown = shown(board, "end")
        assert items_of(grown) == 7
        assert pane_text(grown) == 'Hello, world\n{"score": 0.9}\n[1, 2]\n and more\n7\nend'
        assert "Hello" in board.detail.value or f"data-job-id='{job.id}'" in board.detail.value
        feed(STOP)
        wait_until(lambda: queue.get(job.id).finished, 10, "the job finished")
    board.refresh()
    done = board.stream_pane.value
    assert "data-live='0'" in done and ">live<" not in done and "<b>stream</b>" in done
    assert pane_text(done).endswith("7\nend") and items_of(done) == 7


def test_a_finished_job_shows_its_stream_or_nothing(queue: Queue, board_of: Any) -> None:
    @queue.task(name="stream_views.said")
    def said(n: int) -> int:
        for i in range(n):
            nbqueue.emit(f"line {i}\n")
        return n

    talked, quiet = said.enqueue(3), said.enqueue(0)
    with queue.worker() as worker:
        worker.run_until_idle(timeout=20)
    board = board_of()
    board.select(talked.id)
    assert pane_text(board.stream_pane.value) == "line 0\nline 1\nline 2\n"
    assert "data-live='0'" in board.stream_pane.value
    board.select(quiet.id)
    assert board.stream_pane.value == ""
    board.select(None)
    assert board.stream_pane.value == ""


def test_the_pinned_running_row_shows_the_last_item(queue: Queue, board_of: Any, feed: Feed) -> None:
    job = feed.task(queue, "stream_views.last").enqueue()
    with queue.worker():
        wait_until(lambda: queue.get(job.id).status is State.RUNNING, 10, "the job running")
        long = "a long line " * 20 + "\nand a second line"
        feed("first", long)
        board = board_of()

        def row() -> str:
            board.refresh()
            found = re.search(rf"<tr data-row-id='{job.id}'.*?</tr>", board.table.value, re.S)
            assert found is not None
            cell = found.group(0)
            return cell if "nbqueue-last-item" in cell and "long" in cell else ""

        cell = wait_until(row, 10, "the last item in the running row", every=0.05)
        assert [j.id for j in board.running] == [job.id]
        assert "\n" not in cell  # one line: the item's newlines are spaces
        code = re.search(r"<code>(.*?)</code>", cell)
        assert code is not None and code.group(1).endswith("…")
        assert len(html.unescape(code.group(1))) == LAST_ITEM_CHARS
        assert "title='a long line a long line" in cell  # the rest on hover
        feed({"tokens": 12})
        wait_until(
            lambda: (board.refresh(), "{&quot;tokens&quot;: 12}" in board.table.value)[1],
            10,
            "a JSON item in the row",
            every=0.05,
        )
        feed(STOP)


def test_a_dropped_note_is_shown(queue: Queue, board_of: Any) -> None:
    @queue.task(name="stream_views.bounded", stream_bytes=60)
    def bounded() -> None:
        for i in range(40):
            nbqueue.emit(f"item {i:02} ")

    job = bounded.enqueue()
    with queue.worker() as worker:
        worker.run_until_idle(timeout=20)
    board = board_of()
    board.select(job.id)
    value = board.stream_pane.value
    assert "earlier dropped by the stream's bound" in value
    text = pane_text(value)
    assert re.match(r"\[\d+ earlier items dropped\]\n", text), text
    assert text.endswith("item 39 ")


def test_non_text_items_one_per_line_and_the_tail_cut() -> None:
    tail = tail_of(["a", "b", {"x": 1}, [2], 3, None, "c"])
    assert tail == Tail('ab\n{"x": 1}\n[2]\n3\nnull\nc', 7, 0, False)
    many = tail_of([f"line {i}\n" for i in range(1000)])
    assert many.cut and many.items == 1000
    assert many.text.splitlines() == [f"line {i}" for i in range(1000 - STREAM_LINES, 1000)]
    wide = tail_of(["x" * (STREAM_CHARS + 5), "!"])
    assert wide.cut and len(wide.text) == STREAM_CHARS and wide.text.endswith("x!")
    noted = tail_of([Dropped(3), "kept"])
    assert noted == Tail("[3 earlier items dropped]\nkept", 1, 3, False)


def test_what_a_job_emitted_is_escaped(queue: Queue) -> None:
    job = queue.enqueue({"n": 1})
    value = stream_html(job, tail_of(["<script>alert(1)</script>"]))
    assert "<script>" not in value and "&lt;script&gt;" in value
    cell = last_item_cell("<b>'x'</b>")
    assert "<b>'x'" not in cell and "&lt;b&gt;" in cell


# -- %jobs --follow ID ---------------------------------------------------------------


def test_jobs_follow_shows_the_stream_and_stops_when_the_job_finishes(
    ip: Any, queue_target: str, feed: Feed
) -> None:
    q = ip.run_line_magic("nbqueue", queue_target)
    job = feed.task(q, "stream_views.follow").enqueue()
    ip.run_line_magic("worker", "start")
    wait_until(lambda: q.get(job.id).status is State.RUNNING, 10, "the job running")
    view = ip.run_line_magic("jobs", f"--follow {job.id} --interval 0.05")
    # The magic returned at once with the job still running: the kernel is free for other cells.
    assert view.live and q.get(job.id).status is State.RUNNING
    assert "following" in view.head.value and "nothing emitted yet" in view.body.value
    feed("one ", "two ")
    wait_until(lambda: "one two " in view.body.value, 10, "the view showing the first items")
    feed({"step": 3}, "four")
    wait_until(lambda: "four" in view.body.value, 10, "the view growing by itself")
    assert pane_text(view.body.value) == 'one two \n{"step": 3}\nfour'
    feed(STOP)
    wait_until(lambda: not view.live, 10, "the view's timer stopped with the job")
    assert "completed" in view.head.value and "following" not in view.head.value
    assert "data-live='0'" in view.body.value and items_of(view.body.value) == 4


def test_jobs_follow_of_a_finished_job_shows_it_once(ip: Any, queue_target: str) -> None:
    q = ip.run_line_magic("nbqueue", queue_target)

    @q.task(name="stream_views.once")
    def once() -> None:
        nbqueue.emit("all there is")

    job = once.enqueue()
    q.worker().run_until_idle(timeout=20)
    view = ip.run_line_magic("jobs", f"--follow {job.id}")
    assert not view.live  # nothing will change: no timer
    assert "all there is" in view.body.value
    quiet = q.enqueue({"n": 1})
    assert "nothing emitted yet" in ip.run_line_magic("jobs", f"--follow {quiet.id}").body.value


def test_jobs_follow_refuses_what_it_cannot_show(ip: Any) -> None:
    ip.run_line_magic("nbqueue", "jobs.db")
    with pytest.raises(UsageError, match=r"--follow.*999"):
        ip.run_line_magic("jobs", "--follow 999")
    with pytest.raises(UsageError, match="one of them"):
        ip.run_line_magic("jobs", "--follow 1 --graph 1")
