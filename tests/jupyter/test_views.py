"""The widget models (no browser), the DataFrames and the HTML reprs, on a real SQLite file."""

from __future__ import annotations

import contextlib
import html
import itertools
import re
import sqlite3
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

import nbqueue
from nbqueue import Job, JobNotFound, Queue, State
from nbqueue.jupyter.views import DeadLetterView, JobBoard, board_picture
from tests.helpers import wait_until
from tests.test_notebook_jobs import write_notebook

STATES = [s.value for s in State]
_rising = itertools.count(10**9)  # each driven job outranks every earlier one, so claim() takes it


def make(
    q: Queue,
    state: State | str,
    *,
    queue: str = "default",
    payload: Any = None,
    task: Any = None,
    output: str | None = None,
    error: str = "it broke",
) -> Job:
    """One job driven through the real API to `state`."""
    state = State(state)
    if state in (State.BLOCKED, State.UPSTREAM_FAILED):  # behind a parent that waits, or is dead
        parent = make(q, State.PENDING if state is State.BLOCKED else State.DEAD, queue=queue)
        if task is not None:
            return q.get(task.schedule((payload,), queue=queue, after=[parent]).id)
        return q.get(q.enqueue(payload if payload is not None else {"n": 1}, queue=queue, after=[parent]).id)
    priority = 0 if state is State.PENDING else next(_rising)
    if task is not None:
        job = task.schedule((payload,), queue=queue, priority=priority)
    else:
        job = q.enqueue(payload if payload is not None else {"n": 1}, queue=queue, priority=priority)
    if state is State.PENDING:
        return q.get(job.id)
    if state is State.CANCELLED:
        q.cancel(job.id)
        return q.get(job.id)
    claim = q.claim(queues=queue, lease=60)
    assert claim is not None and claim.id == job.id
    if state is State.COMPLETED:
        q.complete(claim, {"ok": job.id}, output=output)
    elif state is State.FAILED:
        q.fail(claim, _raised(error), output=output)
    elif state is State.DEAD:
        q.fail(claim, _raised(error), output=output, retry=False)
    q.manager.notify()
    return q.get(job.id)


def _raised(message: str) -> BaseException:
    try:
        raise RuntimeError(message)
    except RuntimeError as exc:
        return exc


@pytest.fixture
def views() -> Iterator[list[Any]]:
    """Views a test builds; all closed at teardown, and their timers must stop."""
    built: list[Any] = []
    yield built
    for view in built:
        view.close()
    wait_until(lambda: not any(v.live for v in built), 5, "view timers stopped")


@pytest.fixture
def board_of(queue: Queue, views: list[Any]) -> Any:
    def build(**options: Any) -> JobBoard:
        options.setdefault("interval", 3600)  # no refresh by itself unless a test wants it
        # nor a chart: drawing one takes a second, which the teardown would wait for
        options.setdefault("chart", False)
        board = JobBoard(queue, **options)
        views.append(board)
        return board

    return build


@pytest.fixture
def dead_view_of(queue: Queue, views: list[Any]) -> Any:
    def build(**options: Any) -> DeadLetterView:
        options.setdefault("interval", 3600)
        view = DeadLetterView(queue, **options)
        views.append(view)
        return view

    return build


def pills(board: JobBoard) -> dict[str, int]:
    found = re.findall(r"data-state='(\w+)' data-count='(\d+)'", board.counts_html.value)
    return {state: int(n) for state, n in found}


def row_ids(html_table: str) -> list[int]:
    return [int(i) for i in re.findall(r"<tr data-row-id='(\d+)'", html_table)]


# -- the job board ----------------------------------------------------------------


def test_board_counts_match_the_queue(queue: Queue, board_of: Any) -> None:
    for state, n in (("pending", 3), ("running", 1), ("completed", 2), ("failed", 1), ("dead", 2)):
        for _ in range(n):
            make(queue, state)
    make(queue, "cancelled", queue="other")
    board = board_of()
    assert board.counts == queue.counts()
    assert board.counts == dict.fromkeys(STATES, 0) | {
        "pending": 3,
        "running": 1,
        "completed": 2,
        "failed": 1,
        "dead": 2,
        "cancelled": 1,
    }
    assert pills(board) == queue.counts()
    assert "data-done='5' data-total='10'" in board.outcome.value  # completed + dead + cancelled
    assert "5 of 10 finished" in board.outcome.value
    parts = dict(re.findall(r"data-state='(\w+)' data-count='(\d+)'", board.outcome.value))
    assert parts == {"completed": "2", "dead": "2", "cancelled": "1"}  # the bar split by outcome
    assert sorted(board.queue_filter.options) == sorted(["all", "default", "other"])


def test_board_counts_update_on_refresh(queue: Queue, board_of: Any) -> None:
    board = board_of()
    assert pills(board) == dict.fromkeys(STATES, 0)
    assert "no jobs" in board.table.value
    make(queue, "dead")
    board.refresh_button.click()
    assert pills(board)["dead"] == 1
    assert board.counts == queue.counts()


def test_board_pages_with_older_and_newer(queue: Queue, board_of: Any) -> None:
    ids = [queue.enqueue({"i": i}).id for i in range(40)]
    newest_first = ids[::-1]
    board = board_of(page_size=15)
    assert [j.id for j in board.rows] == newest_first[:15]
    assert row_ids(board.table.value) == newest_first[:15]
    assert (board.newer.disabled, board.older.disabled) == (True, False)
    assert "1-15 of 40" in board.page_label.value

    board.older.click()
    assert [j.id for j in board.rows] == newest_first[15:30]
    assert (board.newer.disabled, board.older.disabled) == (False, False)
    assert "16-30 of 40" in board.page_label.value

    board.older.click()
    assert [j.id for j in board.rows] == newest_first[30:]
    assert (board.newer.disabled, board.older.disabled) == (False, True)
    board.older.click()  # past the last page: stays there
    assert [j.id for j in board.rows] == newest_first[30:]
    assert "31-40 of 40" in board.page_label.value

    board.newer.click()
    board.newer.click()
    assert [j.id for j in board.rows] == newest_first[:15]
    assert (board.newer.disabled, board.older.disabled) == (True, False)
    board.newer.click()
    assert board.page == 0


def test_board_status_and_queue_filters(queue: Queue, board_of: Any) -> None:
    dead_a = make(queue, "dead", queue="a")
    done_a = make(queue, "completed", queue="a")
    dead_b = make(queue, "dead", queue="b")
    pending_b = make(queue, "pending", queue="b")
    board = board_of()
    assert {j.id for j in board.rows} == {dead_a.id, done_a.id, dead_b.id, pending_b.id}

    board.status_filter.value = "dead"
    assert [j.id for j in board.rows] == [dead_b.id, dead_a.id]
    assert all(j.status is State.DEAD for j in board.rows)

    board.queue_filter.value = "a"
    assert [j.id for j in board.rows] == [dead_a.id]
    assert board.counts == queue.counts("a")

    board.status_filter.value = "all"
    assert [j.id for j in board.rows] == [done_a.id, dead_a.id]
    board.queue_filter.value = "all"
    assert len(board.rows) == 4
    assert board.counts == queue.counts()


def test_a_filter_change_goes_back_to_the_first_page(queue: Queue, board_of: Any) -> None:
    for _ in range(20):
        queue.enqueue(1)
    dead = make(queue, "dead")
    board = board_of(page_size=5)
    board.older.click()
    board.older.click()
    assert board.page == 2
    board.status_filter.value = "dead"
    assert board.page == 0
    assert [j.id for j in board.rows] == [dead.id]
    assert (board.newer.disabled, board.older.disabled) == (True, True)


def test_board_built_with_filters(queue: Queue, board_of: Any) -> None:
    make(queue, "dead", queue="a")
    wanted = make(queue, "dead", queue="b")
    make(queue, "pending", queue="b")
    board = board_of(status="dead", queue_name="b")
    assert (board.status_filter.value, board.queue_filter.value) == ("dead", "b")
    assert [j.id for j in board.rows] == [wanted.id]


def test_board_for_a_queue_with_no_jobs_yet_is_empty(queue: Queue, board_of: Any) -> None:
    """`%jobs --queue tomorrow` before any job went there: an empty board, not an error."""
    make(queue, "pending", queue="today")
    board = board_of(queue_name="tomorrow")
    assert board.queue_filter.value == "tomorrow"
    assert board.rows == []
    assert "no jobs" in board.table.value


def test_selecting_a_job_shows_its_details(queue: Queue, board_of: Any) -> None:
    done = make(queue, "completed", payload={"url": "<b>x</b>"}, output="fetched 3 pages\n")
    dead = make(queue, "dead", error="boom at row 7", output="partial\n")
    board = board_of()
    assert "select a job" in board.detail.value

    board.select(done.id)
    detail = board.detail.value
    assert f"data-job-id='{done.id}'" in detail
    assert "&lt;b&gt;x&lt;/b&gt;" in detail  # the payload, escaped
    assert "<b>x</b>" not in detail
    assert "fetched 3 pages" in detail
    assert f"{{&quot;ok&quot;:{done.id}}}" in detail  # the result

    board.select(dead.id)
    detail = board.detail.value
    assert f"data-job-id='{dead.id}'" in detail
    assert "Traceback (most recent call last)" in detail
    assert "RuntimeError: boom at row 7" in detail
    assert "partial" in detail
    assert "fetched 3 pages" not in detail

    board.select(None)
    assert "select a job" in board.detail.value


def test_the_table_escapes_what_users_wrote(queue: Queue, board_of: Any) -> None:
    make(queue, "dead", queue="<i>q</i>", error="bad <script>alert(1)</script>")
    board = board_of()
    assert "&lt;i&gt;q&lt;/i&gt;" in board.table.value
    assert "<script>" not in board.table.value
    assert "&lt;script&gt;" in board.table.value


def test_board_refreshes_by_itself_and_stops_when_closed(queue: Queue, board_of: Any) -> None:
    board = board_of(interval=0.1)
    assert board.live
    assert board.counts["pending"] == 0
    queue.enqueue({"a": 1})
    wait_until(lambda: board.counts["pending"] == 1, 5, "the board saw the new job")
    wait_until(lambda: pills(board)["pending"] == 1, 5, "the counts HTML changed")
    board.close()
    wait_until(lambda: not board.live, 5, "the timer stopped")
    queue.enqueue({"a": 2})
    time.sleep(0.5)  # five intervals: a live timer would have refreshed
    assert board.counts["pending"] == 1


def test_running_jobs_are_pinned_above_the_pages(queue: Queue, board_of: Any) -> None:
    """The one job that matters is never on page 3: running jobs come first, whatever the page."""
    runner = make(queue, "running")
    for i in range(30):
        queue.enqueue({"i": i})
    board = board_of(page_size=10)
    assert [j.id for j in board.running] == [runner.id]
    assert runner.id not in [j.id for j in board.rows]  # listed once, in its own section
    html_table = board.table.value
    assert html_table.index("RUNNING NOW") < html_table.index(f"data-row-id='{runner.id}'")
    assert html_table.index(f"data-row-id='{runner.id}'") < html_table.index("RECENT")
    assert row_ids(html_table)[0] == runner.id
    board.older.click()
    board.older.click()
    assert row_ids(board.table.value)[0] == runner.id  # still first on the last page
    assert "21-30 of 30 · 1 running above" in board.page_label.value
    board.status_filter.value = "running"  # asked for: no pinned section, just the rows
    assert [j.id for j in board.rows] == [runner.id] and board.running == []


def test_a_click_on_a_row_opens_it_and_its_attempts(queue: Queue, board_of: Any) -> None:
    job = queue.enqueue({"n": 1}, max_retries=2)
    first = queue.claim(lease=60)
    assert first is not None
    queue.fail(first, _raised("first try broke"))
    board = board_of()
    board.table.selected = job.id  # what a click on its row sends from the browser
    detail = board.detail.value
    assert f"data-job-id='{job.id}'" in detail
    assert "attempt 1 of 3 failed" in detail
    assert "data-attempt='1'" in detail and "first try broke" in detail
    assert not board.cancel_button.disabled and board.requeue_button.disabled


def test_requeue_from_the_detail_pane(queue: Queue, board_of: Any) -> None:
    dead = make(queue, "dead")
    board = board_of()
    board.select(dead.id)
    assert not board.requeue_button.disabled and board.cancel_button.disabled
    board.requeue_button.click()
    assert queue.get(dead.id).status is State.PENDING
    assert f"requeued job {dead.id}" in board.message.value


def test_one_line_per_job_with_relative_times_and_whole_text_on_hover(queue: Queue, board_of: Any) -> None:
    long_error = "ValueError: " + "x" * 400
    dead = make(queue, "dead", error=long_error)
    board = board_of()
    html_table = board.table.value
    assert re.search(r" s ago</span>", html_table)  # relative time...
    assert re.search(r"title='\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC'", html_table)  # ...the full one on hover
    assert f"title='RuntimeError: {long_error}'" in html_table  # the whole error on hover
    assert f"data-row-id='{dead.id}'" in html_table


def test_a_cancelled_job_shows_no_stale_progress(queue: Queue, board_of: Any) -> None:
    job = queue.enqueue({"n": 1})
    claim = queue.claim(lease=60)
    assert claim is not None
    queue.manager.record_progress(claim, 93, 100, "almost")
    board = board_of()
    assert "data-percent='93'" in board.table.value
    queue.cancel(job.id)
    board.refresh()
    assert "data-percent" not in board.table.value


def test_task_names_are_shown_without_main(queue: Queue, board_of: Any) -> None:
    @queue.task(name="__main__.convert")
    def convert(n: int) -> int:
        return n

    convert.enqueue(1)
    board = board_of()
    assert "<span title='__main__.convert'>convert</span>" in board.table.value


def test_the_board_draws_its_chart(queue: Queue, board_of: Any) -> None:
    make(queue, "completed")
    make(queue, "dead")
    board = board_of(chart=False)
    assert board.chart.value == ""
    board.draw_chart()
    assert "<svg" in board.chart.value
    assert "runs per minute" in board.chart.value  # text kept as text in the SVG


def test_the_board_draws_its_chart_by_itself(queue: Queue, board_of: Any) -> None:
    make(queue, "completed")
    board = board_of(chart=True)
    wait_until(lambda: "<svg" in board.chart.value, 20, "the chart drawn on its own thread")
    board.close()
    wait_until(lambda: not board.live, 20, "the chart's thread ended")


def test_a_board_closed_before_its_chart_is_drawn_draws_nothing(queue: Queue) -> None:
    """The drawing (half a second of matplotlib) is skipped once the board is closed: a closed
    board's chart thread ends after reading, and a notebook (or a test) waits for nothing."""
    make(queue, "completed")
    asked: list[bool] = []

    def wanted() -> bool:
        asked.append(True)
        return False

    assert board_picture(queue, wanted) == ""
    assert asked == [True]  # asked once the data is read, before drawing
    assert "<svg" in board_picture(queue)


# -- the dead-letter view -----------------------------------------------------------


def test_requeue_selected(queue: Queue, dead_view_of: Any) -> None:
    first = make(queue, "dead", error="first failure")
    second = make(queue, "dead", error="second failure")
    view = dead_view_of()
    assert {j.id for j in view.jobs} == {first.id, second.id}
    assert "data-count='2'" in view.header.value
    assert view.requeue_selected.disabled and view.delete_selected.disabled
    assert not view.requeue_all.disabled

    view.select.value = (first.id,)
    assert not view.requeue_selected.disabled
    view.requeue_selected.click()
    again = queue.get(first.id)
    assert again.status is State.PENDING
    assert again.retries == 0
    assert queue.get(second.id).status is State.DEAD
    assert [j.id for j in view.jobs] == [second.id]
    assert view.select.value == ()
    assert "requeued 1 job(s)" in view.message.value
    assert "data-count='1'" in view.header.value


def test_requeue_all(queue: Queue, dead_view_of: Any) -> None:
    dead = [make(queue, "dead", queue=name) for name in ("a", "b", "b")]
    done = make(queue, "completed")
    view = dead_view_of()
    view.requeue_all.click()
    for job in dead:
        fresh = queue.get(job.id)
        assert (fresh.status, fresh.retries) == (State.PENDING, 0)
    assert queue.get(done.id).status is State.COMPLETED
    assert view.jobs == []
    assert "requeued 3 job(s)" in view.message.value
    assert view.requeue_all.disabled


def test_requeue_all_in_a_queue_view_touches_only_that_queue(queue: Queue, dead_view_of: Any) -> None:
    mine = make(queue, "dead", queue="mine")
    theirs = make(queue, "dead", queue="theirs")
    view = dead_view_of(queue_name="mine")
    assert [j.id for j in view.jobs] == [mine.id]
    view.requeue_all.click()
    assert queue.get(mine.id).status is State.PENDING
    assert queue.get(theirs.id).status is State.DEAD


def test_delete_selected(queue: Queue, dead_view_of: Any) -> None:
    doomed = make(queue, "dead")
    kept = make(queue, "dead")
    view = dead_view_of()
    view.select.value = (doomed.id,)
    view.delete_selected.click()
    with pytest.raises(JobNotFound):
        queue.get(doomed.id)
    assert queue.get(kept.id).status is State.DEAD
    assert [j.id for j in view.jobs] == [kept.id]
    assert "deleted 1 job(s)" in view.message.value


def test_the_traceback_pane_shows_the_selected_job(queue: Queue, dead_view_of: Any) -> None:
    one = make(queue, "dead", error="first <failure>")
    two = make(queue, "dead", error="second failure")
    view = dead_view_of()
    assert "select dead jobs" in view.traceback.value
    view.select.value = (two.id,)
    assert "RuntimeError: second failure" in view.traceback.value
    assert "Traceback (most recent call last)" in view.traceback.value
    assert "first" not in view.traceback.value
    view.select.value = (one.id,)
    assert "RuntimeError: first &lt;failure&gt;" in view.traceback.value
    view.select.value = ()
    assert "select dead jobs" in view.traceback.value
    assert view.requeue_selected.disabled


def test_an_empty_dead_letter_view_disables_its_buttons(queue: Queue, dead_view_of: Any) -> None:
    make(queue, "completed")
    make(queue, "pending")
    view = dead_view_of()
    assert view.jobs == []
    assert view.select.options == ()
    assert view.requeue_selected.disabled
    assert view.requeue_all.disabled
    assert view.delete_selected.disabled
    assert "data-count='0'" in view.header.value


def test_dead_letter_view_picks_up_new_dead_jobs(queue: Queue, dead_view_of: Any) -> None:
    view = dead_view_of(interval=0.1)
    assert view.requeue_all.disabled
    job = make(queue, "dead")
    wait_until(lambda: [j.id for j in view.jobs] == [job.id], 5, "the view saw the dead job")
    wait_until(lambda: not view.requeue_all.disabled, 5, "requeue all enabled")


# -- DataFrames -------------------------------------------------------------------


def test_history_dtypes(queue: Queue) -> None:
    @queue.task(name="fetch")
    def fetch(x: Any) -> Any:
        return x

    @queue.task(name="parse")
    def parse(x: Any) -> Any:
        return x

    for state in STATES:
        make(queue, state, task=fetch)
    make(queue, "completed", task=parse)
    make(queue, "dead", task=parse)
    frame = queue.history()
    assert (
        len(frame) == sum(queue.counts().values()) == len(STATES) + 2 + 2
    )  # blocked, upstream_failed: a parent each
    assert frame["id"].dtype == "int64"
    assert list(frame["id"]) == sorted(frame["id"], reverse=True)  # newest first
    assert isinstance(frame["status"].dtype, pd.CategoricalDtype)
    assert list(frame["status"].cat.categories) == STATES
    for column in ("created_at", "run_at", "started_at", "finished_at", "updated_at"):
        dtype = frame[column].dtype
        assert isinstance(dtype, pd.DatetimeTZDtype), column
        assert str(dtype.tz) == "UTC", column
    assert pd.api.types.is_timedelta64_dtype(frame["duration"])
    for column in ("attempts", "priority", "retries", "max_retries"):
        assert frame[column].dtype == "int64", column

    completed = frame[frame["status"] == "completed"]
    assert (completed["duration"] >= pd.Timedelta(0)).all()
    assert (completed["duration"] == completed["finished_at"] - completed["started_at"]).all()
    pending = frame[frame["status"] == "pending"]
    assert pending["started_at"].isna().all()
    assert pending["duration"].isna().all()
    assert (frame["created_at"] <= pd.Timestamp.now(tz="UTC")).all()

    by_task = frame.groupby("task", observed=True)["status"].value_counts()
    assert by_task[("fetch", "dead")] == 1
    assert by_task[("parse", "dead")] == 1
    assert by_task[("parse", "completed")] == 1
    assert frame.groupby("task")["status"].count().to_dict() == {"fetch": len(STATES), "parse": 2}


def test_history_filters_and_empty_frames_keep_their_dtypes(queue: Queue) -> None:
    empty = queue.history()
    assert len(empty) == 0
    assert empty["id"].dtype == "int64"
    assert list(empty["status"].cat.categories) == STATES
    assert isinstance(empty["created_at"].dtype, pd.DatetimeTZDtype)
    assert pd.api.types.is_timedelta64_dtype(empty["duration"])

    make(queue, "pending", queue="a")
    make(queue, "pending", queue="b")
    only_pending = queue.history()  # nobody started: the time columns are all missing, still UTC
    assert isinstance(only_pending["finished_at"].dtype, pd.DatetimeTZDtype)
    assert str(only_pending["finished_at"].dtype.tz) == "UTC"
    assert pd.api.types.is_timedelta64_dtype(only_pending["duration"])
    assert list(queue.history(queue="a")["queue"]) == ["a"]
    assert len(queue.history(limit=1)) == 1


def test_dead_letters_frame(queue: Queue) -> None:
    dead = make(queue, "dead", error="bad input", output="tried\n")
    make(queue, "completed")
    make(queue, "dead", queue="other")
    frame = queue.dead_letters(queue="default")
    assert list(frame["id"]) == [dead.id]
    assert frame["id"].dtype == "int64"
    assert frame["attempts"].dtype == "int64"
    assert list(frame["status"].cat.categories) == STATES
    assert isinstance(frame["finished_at"].dtype, pd.DatetimeTZDtype)
    assert pd.api.types.is_timedelta64_dtype(frame["duration"])
    row = frame.loc[dead.id]
    assert row["status"] == "dead"
    assert row["attempts"] == 1
    assert "RuntimeError: bad input" in row["error"]
    assert row["output"] == "tried\n"
    assert len(queue.dead_letters()) == 2


# -- HTML reprs ------------------------------------------------------------------------


def test_job_repr_html(queue: Queue) -> None:
    done = make(queue, "completed", payload={"a": "<tag>"})
    dead = make(queue, "dead", error="exploded here")
    html_done = done._repr_html_()
    assert f"nbqueue job {done.id}" in html_done
    assert "<td style='text-align:left'>completed</td>" in html_done
    assert "&lt;tag&gt;" in html_done
    assert f"{{&quot;ok&quot;:{done.id}}}" in html_done
    html_dead = dead._repr_html_()
    assert "<td style='text-align:left'>dead</td>" in html_dead
    assert "RuntimeError: exploded here" in html_dead


def test_queue_repr_html(queue: Queue) -> None:
    for state, n in (("pending", 2), ("completed", 3), ("dead", 1)):
        for _ in range(n):
            make(queue, state)
    page = queue._repr_html_()
    cells = dict((state, int(n)) for n, state in re.findall(r"<td[^>]*><b>(\d+)</b><br>(\w+)</td>", page))
    assert cells == queue.counts()
    assert cells["completed"] == 3
    assert queue.target in page


def test_the_board_shows_each_limit_with_what_holds_it_and_its_pause(queue: Queue, board_of: Any) -> None:
    queue.limit("openai", concurrency=8, rate="500/m")
    queue.limit("tokens", rate="90000/m")
    queue.enqueue({"n": 1}, limits={"openai": 1, "tokens": 1200})
    claim = queue.claim()
    assert claim is not None
    held = queue.enqueue({"n": 2}, limits=["openai"])
    queue.pause("openai", 60, why="HTTP 429: the server asked to wait 60 s")
    board = board_of()
    line = board.limits_html.value
    assert "LIMITS" in line
    assert "<b>openai</b> · 1/8 in flight · 500/m" in line and "1 waiting" in line
    assert re.search(r"paused \(HTTP 429: the server asked to wait 60 s\), resumes in (59|60) s", line), line
    assert "UTC'>" in line  # the clock time on hover
    # The held-back job says what holds it, in its row.
    row = re.search(rf"<tr data-row-id='{held.id}'.*?</tr>", html.unescape(board.table.value), re.S)
    assert row is not None
    assert re.search(r"waiting on limit openai: paused \(HTTP 429[^)]*\), resumes in (59|60) s", row[0]), row[
        0
    ]
    assert "<b>tokens</b> · 1200 in flight · 1500/s, next start in" in line  # 90000/m, as per second
    assert queue.resume("openai") is True
    assert "paused" not in board_of().limits_html.value


def test_the_board_lists_schedules_with_their_next_run_in_local_time(
    tmp_path: Path, views: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    try:
        friday_noon = datetime(2024, 3, 29, 12, 0, tzinfo=UTC).timestamp()
        q = Queue(tmp_path / "schedules.db", clock=nbqueue.ManualClock(friday_noon))
        report = write_notebook(tmp_path / "report.ipynb", "1")
        q.periodic_notebook(report, cron="0 6 * * MON-FRI", tz="Europe/Berlin", name="eu-daily")
        q.periodic(every=3600, name="hourly")(lambda: None)
        board = JobBoard(q, interval=3600, chart=False)
        views.append(board)
        line = board.schedules_html.value
        assert "SCHEDULES" in line
        # Monday 06:00 in Berlin (CEST) is midnight in New York (EDT); the hourly one comes first
        assert line.index("hourly") < line.index("eu-daily")
        assert (
            "<b>eu-daily</b> cron 0 6 * * MON-FRI (Europe/Berlin) · report.ipynb · next Mon 01 Apr 00:00 EDT"
            " (06:00 Europe/Berlin)" in line
        )
        assert "next Fri 29 Mar 09:00 EDT" in line  # 13:00 UTC, in a zone of its own: UTC
        assert q.unschedule("eu-daily")
        board.refresh()
        assert "eu-daily" not in board.schedules_html.value
        q.close()
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()


# -- dead letters grouped by error, paged; tracebacks with the user's code first -------


def _die(q: Queue, message: str, kind: type[BaseException] = RuntimeError) -> Job:
    job = q.enqueue({"n": 1}, priority=next(_rising))
    claim = q.claim(lease=60)
    assert claim is not None and claim.id == job.id
    try:
        raise kind(message)
    except kind as exc:
        q.fail(claim, exc, retry=False)
    return q.get(job.id)


def test_dead_letters_are_grouped_by_error_and_a_group_requeues_in_one_click(
    queue: Queue, dead_view_of: Any
) -> None:
    refused = [_die(queue, f"doc {i}: 503", ConnectionError) for i in range(40)]
    broken = [_die(queue, f"bad value {i}", ValueError) for i in range(3)]
    view = dead_view_of()
    assert [(g.kind, len(g.ids)) for g in view.groups] == [("ConnectionError", 40), ("ValueError", 3)]
    html_groups = view.groups_table.value
    assert html_groups.count("<tr data-row-id=") == 2  # 43 dead jobs, two lines
    assert "Requeue 40" in html_groups and "ConnectionError: doc 39: 503" in html_groups
    assert "data-count='43'" in view.header.value and "2 group(s)" in view.header.value

    view.groups_table.act("requeue", 1)  # the group's Requeue button, clicked in the browser
    assert all(queue.get(j.id).status is State.PENDING for j in refused)
    assert all(queue.get(j.id).status is State.DEAD for j in broken)
    assert "requeued 40 job(s)" in view.message.value
    assert [(g.kind, len(g.ids)) for g in view.groups] == [("ValueError", 3)]

    view.groups_table.act("delete", 1)
    assert queue.counts()["dead"] == 0
    assert "deleted 3 job(s)" in view.message.value
    assert "no dead jobs" in view.groups_table.value


def test_a_chosen_group_lists_its_jobs_in_pages(queue: Queue, dead_view_of: Any) -> None:
    refused = [_die(queue, f"doc {i}", ConnectionError) for i in range(20)]
    other = _die(queue, "nope", KeyError)
    view = dead_view_of(page_size=8)
    assert len(view.jobs) == 8 and "1-8 of 21" in view.page_label.value  # every dead job, newest first
    view.choose_group(1)  # a click on the ConnectionError line
    newest_first = [j.id for j in reversed(refused)]
    assert [j.id for j in view.jobs] == newest_first[:8]
    assert "1-8 of 20" in view.page_label.value
    view.older.click()
    view.older.click()
    assert [j.id for j in view.jobs] == newest_first[16:]
    assert view.older.disabled and not view.newer.disabled
    view.choose_group(2)
    assert [j.id for j in view.jobs] == [other.id] and view.page == 0
    view.table.selected = other.id  # a click on the job's row opens its traceback
    assert view.select.value == (other.id,)
    assert "KeyError" in view.traceback.value and "data-attempt='1'" in view.traceback.value
    view.requeue_selected.click()
    assert queue.get(other.id).status is State.PENDING


def test_a_worker_run_traceback_shows_the_users_frames_first(queue: Queue, board_of: Any) -> None:
    from nbqueue.tracebacks import user_first

    @queue.task(max_retries=0)
    def parse(text: str) -> int:
        return int(text)

    job = parse.enqueue("seven")
    with queue.worker() as worker:
        worker.run_until_idle()
    error = queue.get(job.id).error or ""
    assert error.index("nbqueue/") < error.index("in parse")  # as Python wrote it: nbqueue's frames first
    shown = user_first(error)
    assert shown.startswith("Traceback (your code first, most recent call last):")
    assert shown.index("in parse") < shown.index("called by nbqueue") < shown.index("nbqueue/")
    assert shown.rstrip().endswith("ValueError: invalid literal for int() with base 10: 'seven'")
    assert sorted(shown.splitlines()) == sorted(
        [*error.splitlines()[1:], shown.splitlines()[0], _called_line(shown)]
    )
    board = board_of()
    board.select(job.id)
    assert "your code first" in board.detail.value


def _called_line(text: str) -> str:
    return next(line for line in text.splitlines() if "called by nbqueue" in line)


def test_the_board_marks_a_running_job_whose_worker_process_is_gone(
    queue: Queue, queue_target: str, board_of: Any
) -> None:
    import subprocess
    import sys

    job = queue.enqueue({"n": 1})
    claimer = (
        "import os, sys, nbqueue\n"
        "q = nbqueue.Queue(sys.argv[1])\n"
        "assert q.claim(lease=600) is not None\n"
        "os._exit(0)  # gone without a word: no release, no failure\n"
    )
    subprocess.run([sys.executable, "-c", claimer, queue_target], check=True, timeout=60)
    board = board_of()
    assert [j.id for j in board.running] == [job.id]
    assert "nbqueue-silent" in board.table.value
    # Filtered to running jobs (nothing pinned: they are the rows), the mark is there too, and
    # no "+1 more running" about the job the table lists.
    filtered = board_of(status="running")
    assert [j.id for j in filtered.rows] == [job.id] and filtered.running == []
    assert "nbqueue-silent" in filtered.table.value
    assert "more running" not in filtered.table.value
    assert filtered.page_label.value == "&nbsp;1-1 of 1&nbsp;"


@pytest.mark.parametrize(
    "said",
    [
        "javascript:alert(document.domain)",
        "http://evil.example/report.ipynb",
        "//evil.example/report.ipynb",
        "data:text/html,<script>alert(1)</script>",
    ],
)
def test_the_detail_pane_links_only_to_a_local_file(
    queue: Queue, board_of: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, said: str
) -> None:
    """A notebook job's row says where its executed notebook is: a URL of any scheme is shown
    as text, never linked; a file here is linked by its relative path, percent-encoded."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "out").mkdir()
    local = tmp_path / "out" / "daily #1?.ipynb"
    local.write_text("{}")
    notebook = write_notebook(tmp_path / "daily.ipynb", "1")
    shown = {}
    for where in (said, str(local)):
        job = queue.enqueue_notebook(notebook, priority=next(_rising))
        claimed = queue.claim()
        assert claimed is not None and claimed.id == job.id
        queue.complete(claimed, {"values": {}, "notebook": where})
        board = board_of()
        board.select(job.id)
        shown[where] = board.detail.value
    assert "<a " not in shown[said] and "href" not in shown[said]
    assert "<code>" in shown[said]
    assert "href='out/daily%20%231%3F.ipynb'" in shown[str(local)]


# -- rows written by hand ---------------------------------------------------------------------


def behind_its_back(target: str, statement: str, *values: Any) -> None:
    """Write to the queue's tables as anyone with write access to the database could."""
    if "://" in target:
        import psycopg

        server, schema = target.split("?schema=")
        with psycopg.connect(server, autocommit=True) as conn:
            conn.execute(f'SET search_path TO "{schema}"')
            conn.execute(statement, values)
    else:
        with contextlib.closing(sqlite3.connect(target)) as conn, conn:
            conn.execute(statement.replace("%s", "?"), values)


def test_every_view_renders_around_rows_written_by_hand(tmp_path: Path, views: list[Any]) -> None:
    """SQLite keeps whatever is written (a BLOB, text where a number belongs): each such row is
    listed as damaged, and the views show every other row as before."""
    path = str(tmp_path / "jobs.db")
    with Queue(path) as q:
        dead = make(q, State.DEAD)
        done = make(q, State.COMPLETED)
        keyed = q.enqueue({"n": 2}, key="k")
        q.limit("bad", concurrency=2)
        q.limit("good", concurrency=3)
        behind_its_back(path, "UPDATE nbqueue_jobs SET error = %s WHERE id = %s", b"\x00\xff", dead.id)
        behind_its_back(path, "UPDATE nbqueue_jobs SET key = %s WHERE id = %s", b"\xffk", keyed.id)
        behind_its_back(path, "UPDATE nbqueue_limits SET concurrency = 'x' WHERE key = 'bad'")
        board = JobBoard(q, interval=3600, chart=False)
        views.append(board)
        assert sorted(row_ids(board.table.value)) == sorted([dead.id, done.id, keyed.id])
        assert board.table.value.count("cannot be read") == 2
        limits = html.unescape(board.limits_html.value)
        assert "bad</b> damaged: its concurrency is 'x', not integer" in limits
        assert "good</b> · 0/3 in flight" in limits
        board.select(dead.id)
        assert f"#{dead.id}" in board.detail.value and "cannot be read" in board.detail.value
        dead_view = DeadLetterView(q, interval=3600)
        views.append(dead_view)
        dead_view.select.value = (dead.id,)
        assert "cannot be read" in dead_view.traceback.value
        frame = q.limits().set_index("key")
        assert frame.loc["bad", "damaged"] == "its concurrency is 'x', not integer"
        assert pd.isna(frame.loc["good", "damaged"]) and frame.loc["good", "concurrency"] == 3


def test_a_job_whose_limits_are_not_json_leaves_the_board_standing(
    queue: Queue, queue_target: str, board_of: Any
) -> None:
    queue.limit("openai", concurrency=4)
    task = queue.task(name="views.limited", limits={"openai": 1})(lambda: None)
    bad, good = task.enqueue(), task.enqueue()
    behind_its_back(queue_target, "UPDATE nbqueue_jobs SET limits = %s WHERE id = %s", "{not json", bad.id)
    board = board_of(chart=False)
    for _ in range(6):  # the timer gave up after 5 failed refreshes
        board.refresh()
    assert pills(board)["pending"] == 2 and sorted(row_ids(board.table.value)) == [bad.id, good.id]
    limits = html.unescape(board.limits_html.value)
    if "://" in queue_target:  # PostgreSQL cannot read it as JSON at all: the line says so
        assert "LIMITS</b>\xa0 cannot be read: StorageError" in limits
    else:  # SQLite skips the column that is not JSON and counts the rest
        assert "openai</b> · 0/4 in flight · 1 waiting" in limits


def test_a_task_name_reaches_the_chart_as_plain_text(queue: Queue, board_of: Any) -> None:
    """Dollar signs in a name are not mathtext (and never TeX): the chart is drawn, the name in it."""
    task = queue.task(name="price $x^{$ total")(lambda n: n)
    make(queue, "completed", task=task, payload=1)
    board = board_of(chart=False)
    board.draw_chart()
    assert "<svg" in board.chart.value
    assert "price $x^{$ total" in html.unescape(board.chart.value)


def test_the_detail_pane_reads_a_preview_of_each_step_value(
    queue: Queue, queue_target: str, board_of: Any
) -> None:
    """Step values may be megabytes (40 of 8 MB took 2.3 s per refresh, each read whole and
    decoded): the pane reads the first characters of each, a finished job's only once."""
    big = "x" * 1_000_000

    @queue.task(name="views.big_steps")
    def big_steps() -> int:
        for i in range(3):
            nbqueue.step(f"part{i}", lambda i=i: {"i": i, "text": big})
        nbqueue.step("small", lambda: {"ünï": "cödé"})
        return 1

    job = big_steps.enqueue()
    with queue.worker():
        job.result(timeout=60)
    previews = queue.manager.journal.step_previews(job.id, 50)
    assert [(row[0], len(row[1])) for row in previews[:3]] == [("part0", 50), ("part1", 50), ("part2", 50)]
    assert previews[3][:2] == ("small", '{"\\u00fcn\\u00ef":"c\\u00f6d\\u00e9"}')  # small: whole
    # Past the preview, the stored text is no longer JSON: a pane that decoded it whole would fail.
    behind_its_back(
        queue_target, "UPDATE nbqueue_steps SET value = value || %s WHERE name = 'part2'", " not json"
    )
    board = board_of(chart=False)
    board.select(job.id)
    detail = html.unescape(board.detail.value)
    assert detail.count('{"i":0,"text":"xxxx') == 1 and detail.count('"text":"xxxx') == 3
    assert detail.count("xxx... (q.steps(job) has it whole)") == 3
    assert '{"ünï": "cödé"}' in detail
    assert len(board.detail.value) < 20_000
    behind_its_back(queue_target, "UPDATE nbqueue_steps SET value = %s WHERE name = 'small'", '"changed"')
    queue.enqueue({"n": 1})  # the counts change: the pane is drawn again, the steps are not read
    board.refresh()
    assert '{"ünï": "cödé"}' in html.unescape(board.detail.value)
    whole = queue.steps(job)  # on request: each value whole, the damaged one as the text stored
    assert whole.loc[0, "value"] == {"i": 0, "text": big} and whole.loc[2, "value"].endswith("} not json")


def test_board_says_which_pending_jobs_no_task_here_runs(queue: Queue, board_of: Any) -> None:
    """A kernel restarted before its functions were defined again: the board names them, and the
    line goes as soon as the function is registered."""

    def slow_work(n: int) -> int:
        return n

    task = queue.task(name="__main__.slow_work")(slow_work)
    for i in range(16):
        task.enqueue(i)
    queue.task(name="reports.build")(slow_work).enqueue(0)
    nbqueue.tasks.unregister("__main__.slow_work")
    nbqueue.tasks.unregister("reports.build")
    board = board_of()
    said = html.unescape(board.missing_html.value)
    assert "no task here for 16 pending jobs of slow_work: define it in this notebook" in said, said
    assert "no task here for 1 pending job of reports.build: import reports here" in said, said
    assert said.index("slow_work") < said.index("reports.build")  # the most waiting first
    queue.task(name="__main__.slow_work")(slow_work)
    queue.task(name="reports.build")(slow_work)
    board.refresh()  # a registration is seen at once, not at the next 10 s read
    assert board.missing_html.value == ""
    assert queue.missing_tasks() == {}


def test_a_notebook_job_is_requeued_with_its_current_file_from_the_board_and_dead_letters(
    queue: Queue, board_of: Any, dead_view_of: Any, tmp_path: Path
) -> None:
    path = write_notebook(tmp_path / "n.ipynb", "raise ValueError('bug')")
    first = queue.enqueue_notebook(path)
    plain = queue.enqueue({"n": 1})
    second = queue.enqueue_notebook(path, max_retries=0)
    for job in (first, plain):
        queue.cancel(job)
    claimed = queue.claim()
    assert claimed is not None and claimed.id == second.id
    assert queue.fail(claimed, "cell 1 raised ValueError: bug") == "dead"
    write_notebook(path, "print('fixed')")

    def last_cell(job: Job) -> str:
        return "".join(queue.get(job.id).kwargs["notebook"]["cells"][-1]["source"])

    board = board_of()
    board.table.selected = plain.id
    board.refresh()
    assert board.reload_button.layout.display == "none"  # not a notebook job
    board.table.selected = first.id
    board.refresh()
    assert board.reload_button.layout.display is None
    board.reload_button.click()
    assert queue.get(first.id).status is State.PENDING and last_cell(first) == "print('fixed')"
    assert "with the notebook file as it is now" in board.message.value

    view = dead_view_of()
    assert view.reload_selected.layout.display == "none"  # nothing chosen yet
    view.select.value = (second.id,)
    assert view.reload_selected.layout.display is None
    view.reload_selected.click()
    assert queue.get(second.id).status is State.PENDING and last_cell(second) == "print('fixed')"
    assert "with the current files" in view.message.value


def test_a_job_held_back_by_a_full_key_says_so(queue: Queue) -> None:
    from nbqueue.jupyter.render import held_back_notes

    queue.limit("gpu", concurrency=1)
    queue.enqueue({"n": 1}, limits=["gpu"])
    running = queue.claim()
    assert running is not None
    waiting = queue.enqueue({"n": 2}, limits=["gpu"])
    free = queue.enqueue({"n": 3})
    notes = held_back_notes(queue.jobs(), queue.limits(), queue.now())
    assert notes == {waiting.id: "waiting on limit gpu: 1/1 in flight"}
    assert free.id not in notes and running.id not in notes


def test_one_attempt_story_for_snoozed_retried_and_requeued_jobs(queue: Queue, board_of: Any) -> None:
    """Header, attempts table and error agree: a snooze is not an attempt, a requeue starts
    again at attempt 1 (the table marks it), a completed job's error is an earlier run's."""
    from nbqueue.jupyter.render import attempt_numbers

    assert attempt_numbers(["snoozed", "completed"]) == [(1, False), (1, False)]
    assert attempt_numbers(["failed", "released", "dead", "completed"]) == [
        (1, False),
        (2, False),
        (2, False),
        (1, True),
    ]
    snoozed = queue.enqueue({"n": 1}, max_retries=3)
    claimed = queue.claim()
    assert claimed is not None and claimed.id == snoozed.id
    queue.fail(claimed, nbqueue.RetryAfter(0.01))
    time.sleep(0.05)
    queue.complete(queue.claim(), "ok")  # type: ignore[arg-type]
    board = board_of()
    board.select(snoozed.id)
    detail = board.detail.value
    assert "attempt 1 of 4" in detail
    assert re.findall(r"<td[^>]*>attempt (\d+)</td>", detail) == ["1", "1"]  # snoozed, then completed
    assert "error of an earlier run" in detail

    dying = queue.enqueue({"n": 2}, max_retries=0)
    run = queue.claim()
    assert run is not None and run.id == dying.id
    assert queue.fail(run, "broke") == "dead"
    assert queue.requeue(dying.id) == 1
    again = queue.claim()
    assert again is not None and again.id == dying.id
    queue.complete(again, "fixed")
    board.select(dying.id)
    detail = board.detail.value
    assert "attempt 1 of 1" in detail
    assert re.findall(r"<td[^>]*>attempt (\d+)</td>", detail) == ["1", "1"]  # dead, then after the requeue
    table = detail[detail.index("nbqueue-attempts") :]
    assert table.index(">dead<") < table.index("requeued: a fresh start") < table.index(">completed<")


# -- search, jump, export, the sign, the graph's click-through -----------------------------------


def test_the_search_box_finds_jobs_over_the_whole_queue_in_pages(queue: Queue, board_of: Any) -> None:
    ids = [queue.enqueue({"url": f"https://example.org/{i}"}).id for i in range(40)]
    hit = make(queue, "dead", payload={"url": "https://example.org/x"}, error="ConnectionError: doc 8: 503")
    board = board_of(page_size=15)
    board.search.value = "doc 8: 503"  # text in an error, on no page the board showed
    assert [j.id for j in board.rows] == [hit.id]
    assert "1-1 of 1 found for “doc 8: 503”" in board.page_label.value
    board.search.value = "example.org/"
    assert [j.id for j in board.rows] == [hit.id, *ids[::-1][:14]]
    assert "1-15 of 41 found" in board.page_label.value and board.jump.max == 3
    board.jump.value = 3  # jump to the last page
    assert [j.id for j in board.rows] == ids[::-1][29:] and "31-41 of 41" in board.page_label.value
    board.status_filter.value = "dead"  # a filter applies to the search, and goes back to page 1
    assert [j.id for j in board.rows] == [hit.id] and board.page == 0
    board.search.value = f"#{ids[0]}"
    board.status_filter.value = "all"
    assert [j.id for j in board.rows] == [ids[0]]
    board.search.value = ""  # no search: every job, newest first
    assert [j.id for j in board.rows] == [hit.id, *ids[::-1][:14]] and "of 41&" in board.page_label.value


def test_export_offers_the_rows_of_the_view_as_csv(queue: Queue, board_of: Any) -> None:
    import base64
    import io

    for i in range(5):
        queue.enqueue({"n": i}, queue="a" if i % 2 else "b")
    make(queue, "dead", queue="a", error="ValueError: bad row 3")
    board = board_of()
    board.queue_filter.value = "a"
    board.export()
    link = board.download.value
    assert "download nbqueue-jobs.csv, 3 rows" in link
    data = re.search(r"href='data:text/csv;base64,([^']+)'", link)
    assert data is not None
    frame = pd.read_csv(io.StringIO(base64.b64decode(data.group(1)).decode()))
    expected = queue.history(queue="a")
    assert frame["id"].tolist() == expected["id"].tolist() and list(frame.columns) == list(expected.columns)
    board.search.value = "bad row"  # a change of the view takes the old link away
    assert board.download.value == ""
    board.export_button.click()
    assert "1 row<" in board.download.value


def test_the_sign_counts_jobs_that_went_dead_since_the_board_was_looked_at(
    queue: Queue, board_of: Any
) -> None:
    make(queue, "dead")  # dead before the board was opened: not news
    board = board_of()
    assert (board.sign.count, board.sign.text) == (0, "")
    make(queue, "dead")
    make(queue, "dead")
    board.refresh()
    assert (board.sign.count, board.sign.text) == (2, "2 new dead")
    board.refresh()  # nothing new: the same count
    assert board.sign.count == 2
    board.sign.looked()  # the browser says the person has seen the board
    assert board.sign.count == 0
    dead = make(queue, "dead")
    board.refresh()
    assert board.sign.count == 1
    queue.requeue([dead.id])  # requeued: nobody needs to look any more
    board.refresh()
    assert board.sign.count == 0


def test_a_click_on_a_job_of_the_graph_opens_it(queue: Queue, board_of: Any) -> None:
    parent = queue.enqueue({"p": 1})
    child = queue.enqueue({"c": 1}, after=[parent])
    board = board_of()
    board.select(child.id)
    assert f"data-job-id='{parent.id}'" in board.detail.value and "nbqueue-legend" in board.detail.value
    assert "pending" in board.detail.value and "blocked" in board.detail.value  # the legend's states
    board.detail.selected = parent.id  # what a click on the parent's node sends
    assert board.table.selected == parent.id
    assert f"<div class='nbqueue-detail' data-job-id='{parent.id}'" in board.detail.value


def test_a_workflow_shown_by_a_cell_is_its_live_graph(ip: Any) -> None:
    from nbqueue.jupyter import session
    from nbqueue.jupyter.views import GraphView

    ip.run_cell("q = %nbqueue wf.db")
    cell = "with q.workflow('w') as wf:\n    a = q.enqueue({'a': 1})\n    q.enqueue({'b': 1}, after=[a])\nwf"
    assert ip.run_cell(cell).success
    [view] = [v for v in session(ip).views if isinstance(v, GraphView)]
    assert "blocked 1" in view.counts_html.value
    ip.user_ns["q"].cancel(ip.user_ns["a"].id)  # the parent cancelled: the child upstream_failed
    view.refresh()  # (its timer does this every second)
    assert "upstream_failed 1" in view.counts_html.value and "cancelled 1" in view.counts_html.value


def test_the_timer_keeps_a_search_read_a_moment_ago_and_refresh_reads_it_again(
    queue: Queue, board_of: Any
) -> None:
    first = queue.enqueue({"word": "needle"})
    board = board_of()
    board.search.value = "needle"
    assert [j.id for j in board.rows] == [first.id]
    second = queue.enqueue({"word": "needle"})
    board.tick()  # the timer: a search scans up to 250,000 jobs, so not every second
    assert [j.id for j in board.rows] == [first.id]
    board.refresh_button.click()  # asked for: read again
    assert [j.id for j in board.rows] == [second.id, first.id]
