"""The widget models (no browser), the DataFrames and the HTML reprs, on a real SQLite file."""

from __future__ import annotations

import itertools
import re
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

import nbqueue
from nbqueue import Job, JobNotFound, Queue, State
from nbqueue.jupyter.views import DeadLetterView, JobBoard
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
    return [int(i) for i in re.findall(r"<tr data-job-id='(\d+)'>", html_table)]


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
    assert (board.progress.value, board.progress.max) == (5, 10)  # completed + dead + cancelled
    assert "5 of 10 finished" in board.progress_label.value
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
    assert "page 1 of 3 (40 jobs)" in board.page_label.value

    board.older.click()
    assert [j.id for j in board.rows] == newest_first[15:30]
    assert (board.newer.disabled, board.older.disabled) == (False, False)
    assert "page 2 of 3" in board.page_label.value

    board.older.click()
    assert [j.id for j in board.rows] == newest_first[30:]
    assert (board.newer.disabled, board.older.disabled) == (False, True)
    board.older.click()  # past the last page: stays there
    assert [j.id for j in board.rows] == newest_first[30:]
    assert "page 3 of 3" in board.page_label.value

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
    queue.enqueue({"n": 2}, limits=["openai"])
    queue.pause("openai", 60, why="HTTP 429: the server asked to wait 60 s")
    line = board_of().limits_html.value
    assert "LIMITS" in line
    assert "<b>openai</b> · 1/8 in flight · 500/m" in line and "1 waiting" in line
    assert "paused until" in line and "HTTP 429" in line
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
        board = JobBoard(q, interval=3600)
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
