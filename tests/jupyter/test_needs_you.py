"""The board's "needs you": jobs waiting for a person pinned first, answered from the board (a
button per choice, a JSON box, one click for a group); sleeping jobs and jobs waiting for jobs
say so; the sign, the counts and the detail pane know the state. Widgets driven without a
browser, on both backends."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from datetime import timedelta
from typing import Any, NamedTuple

import pytest

import nbqueue
from nbqueue import Job, Queue, State
from nbqueue.jupyter.needs import NEEDS_SHOWN
from nbqueue.jupyter.views import JobBoard
from tests.helpers import wait_until


class Tasks(NamedTuple):
    publish: Any  # asks a person "Publish <title>?" (approve or reject), after a step
    ask: Any  # asks a person for any JSON value
    cool: Any  # sleeps 52 minutes
    parent: Any  # waits for two jobs in the queue "later"
    kid: Any


def define(queue: Queue) -> Tasks:
    @queue.task
    def publish(n: int) -> str:
        draft = nbqueue.step("draft", lambda: {"title": f"Draft {n}"})
        answer = nbqueue.wait_for(
            "review",
            timeout=timedelta(days=14),
            prompt=f"Publish {draft['title']}?",
            choices=["approve", "reject"],
        )
        return f"{answer}d {draft['title']}"

    @queue.task
    def ask() -> Any:
        return nbqueue.wait_for("settings", prompt="Which settings should the run use?")

    @queue.task
    def cool() -> str:
        nbqueue.sleep("cool-off", timedelta(minutes=52))
        return "cooled"

    @queue.task
    def kid(n: int) -> int:
        return n

    @queue.task
    def parent() -> list[int]:
        return list(nbqueue.wait_for_jobs([kid.schedule((n,), queue="later") for n in (1, 2)]))

    return Tasks(publish, ask, cool, parent, kid)


def run(queue: Queue, queues: str = "default") -> None:
    """Run what is due in `queues` until only waiting (or other queues') jobs are left."""
    queue.worker(queues=queues, lease=10).run_until_idle(timeout=30)


@pytest.fixture
def boards(queue: Queue) -> Iterator[list[JobBoard]]:
    built: list[JobBoard] = []
    yield built
    for board in built:
        board.close()
    wait_until(lambda: not any(b.live for b in built), 5, "board timers stopped")


@pytest.fixture
def board_of(queue: Queue, boards: list[JobBoard]) -> Any:
    def build(**options: Any) -> JobBoard:
        board = JobBoard(queue, interval=3600, chart=False, **options)
        boards.append(board)
        return board

    return build


def waiting_for_review(queue: Queue, tasks: Tasks, n: int = 1) -> list[Job]:
    jobs = [tasks.publish.enqueue(i) for i in range(1, n + 1)]
    run(queue)
    assert {queue.get(j.id).status for j in jobs} == {State.WAITING}
    return jobs


def test_a_job_waiting_for_a_person_leads_the_board(queue: Queue, board_of: Any) -> None:
    tasks = define(queue)
    [job] = waiting_for_review(queue, tasks)
    queue.enqueue({"n": 1}, queue="other")  # a job of another kind, listed below
    board = board_of()
    needs = board.needs
    assert needs.layout.display is None  # shown
    assert board.children.index(needs) < board.children.index(board.table)  # above the running jobs
    assert "NEEDS YOU" in needs.head.value and "1 job waits for a person" in needs.head.value
    entry = needs.entries[job.id]
    assert "Publish Draft 1?" in entry.info.value
    assert "answer within 14 d" in entry.info.value
    assert "draft = <code>{&quot;title&quot;: &quot;Draft 1&quot;}</code>" in entry.info.value  # context
    assert [b.description for b in entry.choices] == ["approve", "reject"]
    assert needs.group_buttons == []  # one job: no "all alike"
    # The counts, the outcome bar, the table's note and the status filter know the state.
    assert "data-state='waiting' data-count='1'" in board.counts_html.value
    assert "1 waiting" in board.outcome.value
    assert "needs you: Publish Draft 1? (answer within 14 d)" in board.table.value
    assert "waiting" in board.status_filter.options
    board.status_filter.value = "waiting"
    assert [j.id for j in board.rows] == [job.id]
    assert (board.sign.count, board.sign.text) == (1, "1 needs you")


def test_a_choice_button_sends_it_and_the_job_completes(queue: Queue, board_of: Any) -> None:
    tasks = define(queue)
    [job] = waiting_for_review(queue, tasks)
    board = board_of()
    board.needs.entries[job.id].choices[0].click()  # "approve"
    assert queue.get(job.id).status is State.PENDING
    assert "sent &quot;approve&quot; to job" in board.needs.message.value
    assert job.id not in board.needs.entries  # the board refreshed: answered, gone from the section
    assert board.sign.count == 0
    run(queue)
    done = queue.get(job.id)
    assert (done.status, done.value) == (State.COMPLETED, "approved Draft 1")
    # Who sent what and when shows with the job; the suspended run is not an attempt.
    board.select(job.id)
    detail = board.detail.value
    [wait] = queue.waits(job)
    assert wait.value == '"approve"' and wait.sent_by
    waits = re.search(r"<table class='nbqueue-waits'.*?</table>", detail)
    assert waits is not None
    assert "a person: Publish Draft 1? (approve or reject)" in waits.group(0)
    assert "<code>&quot;approve&quot;</code>" in waits.group(0) and wait.sent_by in waits.group(0)
    attempts = re.findall(r"<tr data-attempt='(\d+)' data-run='(\d+)'>(.*?)</tr>", detail)
    assert [(a, r) for a, r, _ in attempts] == [("1", "1"), ("1", "2")]  # one attempt, two runs
    assert "suspended" in attempts[0][2] and "the next run resumes it" in attempts[0][2]
    assert "completed" in attempts[1][2]


def test_the_json_box_sends_a_value_and_refuses_text_that_is_not_json(queue: Queue, board_of: Any) -> None:
    tasks = define(queue)
    job = tasks.ask.enqueue()
    run(queue)
    board = board_of()
    entry = board.needs.entries[job.id]
    assert entry.choices == [] and "Which settings should the run use?" in entry.info.value
    assert "no deadline" in entry.info.value
    entry.text.value = "fast"  # not JSON: said, nothing sent
    entry.send.click()
    assert "is not JSON" in board.needs.message.value and "color:#dc3545" in board.needs.message.value
    assert queue.get(job.id).status is State.WAITING
    assert [w.value for w in queue.waits(job)] == [None]
    assert board.needs.entries[job.id] is entry and entry.text.value == "fast"  # kept to fix
    entry.text.value = '{"speed": "fast", "n": 3}'
    entry.send.click()
    assert queue.get(job.id).status is State.PENDING
    run(queue)
    assert queue.get(job.id).value == {"speed": "fast", "n": 3}


def test_a_typed_value_survives_the_board_s_refreshes(queue: Queue, board_of: Any) -> None:
    tasks = define(queue)
    job = tasks.ask.enqueue()
    run(queue)
    board = board_of()
    board.needs.entries[job.id].text.value = '{"half": '
    tasks.ask.enqueue()
    run(queue)  # another question comes: the section is built again around the box
    board.refresh()
    assert len(board.needs.entries) == 2
    assert board.needs.entries[job.id].text.value == '{"half": '


def test_approve_all_like_this_answers_a_group_in_one_click(queue: Queue, board_of: Any) -> None:
    tasks = define(queue)
    jobs = waiting_for_review(queue, tasks, 3)
    other = tasks.ask.enqueue()
    run(queue)
    board = board_of()
    assert "4 jobs wait for a person" in board.needs.head.value
    groups = {
        button.description: (ids, name, value) for ids, name, value, button in board.needs.group_buttons
    }
    assert groups == {
        "approve all 3": ([j.id for j in jobs], "review", "approve"),
        "reject all 3": ([j.id for j in jobs], "review", "reject"),
    }
    [approve_all] = [b for _, _, value, b in board.needs.group_buttons if value == "approve"]
    approve_all.click()
    assert "sent &quot;approve&quot; to 3 jobs" in board.needs.message.value
    assert [queue.get(j.id).status for j in jobs] == [State.PENDING] * 3
    assert list(board.needs.entries) == [other.id] and board.needs.group_buttons == []
    run(queue)
    assert [queue.get(j.id).value for j in jobs] == [f"approved Draft {n}" for n in (1, 2, 3)]


def test_a_send_refused_says_so_and_never_raises(queue: Queue, board_of: Any) -> None:
    tasks = define(queue)
    first, second = waiting_for_review(queue, tasks, 2)
    board = board_of()
    queue.send(first, "review", "reject", by="someone else")  # answered elsewhere meanwhile
    board.needs.entries[first.id].choices[0].click()
    said = board.needs.message.value
    assert "not sent to job" in said and "already" in said and "Traceback" not in said
    assert [w.value for w in queue.waits(first)] == ['"reject"']
    assert first.id not in board.needs.entries  # the refresh dropped it
    queue.cancel(second)  # finished meanwhile: the group's send is refused as a whole
    board.needs.answer_all([second.id], "review", "approve")
    assert "not sent to 1 jobs" in board.needs.message.value


def test_sleeping_jobs_say_when_they_wake_and_jobs_waiting_for_jobs_name_them(
    queue: Queue, board_of: Any
) -> None:
    tasks = define(queue)
    sleeper = tasks.cool.enqueue()
    waiter = tasks.parent.enqueue()
    run(queue)  # the kids are in "later": nobody runs them yet
    [kid_a, kid_b] = queue.relatives(waiter)[0]
    board = board_of()
    assert board.needs.layout.display == "none"  # no person is asked anything
    assert re.search(r"sleep cool-off, wakes in 5[12] min", board.table.value)
    assert f"waiting for jobs #{kid_a} (pending), #{kid_b} (pending)" in board.table.value
    assert (board.sign.count, board.sign.text) == (0, "")
    board.select(waiter.id)
    detail = board.detail.value
    for kid in (kid_a, kid_b):  # its graph draws the jobs it waits for, as its parents
        assert f"class='nbqueue-node' data-job-id='{kid}' data-state='pending'" in detail
    assert f"<b>jobs {kid_a}, {kid_b}</b>" in detail  # what it waits for, beside its family
    assert "<tr data-wait='" in detail  # and in its record of waits
    board.select(sleeper.id)
    assert "<tr data-wait='cool-off'>" in board.detail.value
    run(queue, "later")
    wait_until(lambda: queue.get(waiter.id).status is not State.WAITING, 10, "the waiter woken")
    run(queue)
    assert queue.get(waiter.id).value == [1, 2]


def test_the_sign_counts_jobs_waiting_for_a_person_and_new_dead_ones(queue: Queue, board_of: Any) -> None:
    tasks = define(queue)
    board = board_of()
    assert (board.sign.count, board.sign.text) == (0, "")
    jobs = waiting_for_review(queue, tasks, 2)
    tasks.cool.enqueue()  # a sleeper asks nobody
    run(queue)
    board.refresh()
    assert (board.sign.count, board.sign.text) == (2, "2 need you")

    @queue.task(max_retries=0)
    def broken() -> None:
        raise RuntimeError("boom")

    broken.enqueue()
    run(queue)
    board.refresh()
    assert (board.sign.count, board.sign.text) == (3, "2 need you · 1 new dead")
    board.sign.looked()  # seen: the dead job is no longer news; the questions still wait
    assert (board.sign.count, board.sign.text) == (2, "2 need you")
    queue.send_many(jobs, "review", "approve")
    board.refresh()
    assert (board.sign.count, board.sign.text) == (0, "")
    assert board.needs.layout.display == "none"  # answered elsewhere: nothing to say here


def test_a_queue_filter_shows_its_questions_and_the_sign_counts_every_queue(
    queue: Queue, board_of: Any
) -> None:
    tasks = define(queue)
    [job] = waiting_for_review(queue, tasks)
    queue.enqueue({"n": 1}, queue="other")
    board = board_of(queue_name="other")
    assert board.needs.entries == {} and board.needs.layout.display == "none"
    assert board.sign.count == 1
    board.queue_filter.value = "all"
    assert list(board.needs.entries) == [job.id]


def test_what_a_choice_button_sends_is_the_json_value_of_the_choice(queue: Queue, board_of: Any) -> None:
    @queue.task
    def rate() -> Any:
        return nbqueue.wait_for("score", prompt="How good is it?", choices=[1, 2, 3, None])

    job = rate.enqueue()
    run(queue)
    board = board_of()
    buttons = board.needs.entries[job.id].choices
    assert [b.description for b in buttons] == ["1", "2", "3", "null"]
    buttons[2].click()
    assert json.loads(queue.waits(job)[0].value or "") == 3


def test_many_questions_show_the_oldest_and_a_group_answers_them_all(queue: Queue, board_of: Any) -> None:
    tasks = define(queue)
    jobs = waiting_for_review(queue, tasks, NEEDS_SHOWN + 2)
    board = board_of()
    assert list(board.needs.entries) == [j.id for j in jobs[:NEEDS_SHOWN]]  # the oldest first
    said = f"{NEEDS_SHOWN + 2} jobs wait for a person · the first {NEEDS_SHOWN} shown"
    assert said in board.needs.head.value
    [reject_all] = [b for _, _, value, b in board.needs.group_buttons if value == "reject"]
    assert reject_all.description == f"reject all {NEEDS_SHOWN + 2}"
    reject_all.click()
    assert board.needs.entries == {} and board.sign.count == 0
    assert {queue.get(j.id).status for j in jobs} == {State.PENDING}
