"""The magics through a real IPython shell: %nbqueue, %enqueue, %%enqueue, %worker, %jobs, %deadletters,
%send.

Every test runs in a fresh directory with `%load_ext nbqueue` done by the `ip`
fixture, which also checks that no worker thread outlives the test.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sqlite3
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import ipywidgets
import pytest
from IPython.core.error import UsageError
from jupyter_helpers import nbqueue_threads, run, stop_orphans, worker_threads

import nbqueue
from nbqueue import Job, Queue, State, tasks
from nbqueue.cells import CELL_TASK
from nbqueue.jupyter.views import DeadLetterView, JobBoard
from nbqueue.tracebacks import user_first
from tests import templates
from tests.helpers import wait_until


def current(ip: Any) -> Queue:
    q: Queue = ip.run_line_magic("nbqueue", "")
    return q


def total(q: Queue) -> int:
    return sum(q.counts().values())


@pytest.fixture
def made(tmp_path: Path, sqlite_template: Path) -> None:
    """nbqueue.db in the cwd made already (a copy): for the many tests that are not of its making."""
    templates.copy_sqlite_template(sqlite_template, tmp_path / "nbqueue.db")


def finished(q: Queue, job_id: int, timeout: float = 15) -> Job:
    wait_until(lambda: q.get(job_id).finished, timeout, f"job {job_id} finished")
    return q.get(job_id)


@pytest.fixture
def reader(tmp_path: Path) -> Iterator[Any]:
    """Open a second Queue on a file, as another process would, to read what was stored."""
    opened: list[Queue] = []

    def open_(path: str | Path) -> Queue:
        q = Queue(str(path))
        opened.append(q)
        return q

    yield open_
    for q in opened:
        q.close()


@pytest.fixture
def double(ip: Any) -> None:
    """A plain function defined in the notebook."""
    run(ip, "def double(x=1):\n    return 2 * x")


# -- %nbqueue ---------------------------------------------------------------------


def test_nbqueue_path_creates_the_queue_and_returns_it(ip: Any, tmp_path: Path) -> None:
    path = tmp_path / "jobs.db"
    assert not path.exists()
    q = ip.run_line_magic("nbqueue", str(path))
    assert isinstance(q, Queue)
    assert path.exists()
    assert os.path.samefile(q.target, path)
    assert ip.user_ns["nbqueue_queue"] is q
    # no argument: the current queue; the same path (even relative) is the same object
    assert ip.run_line_magic("nbqueue", "") is q
    assert ip.run_line_magic("nbqueue", str(path)) is q
    assert ip.run_line_magic("nbqueue", "jobs.db") is q


def test_nbqueue_without_path_opens_nbqueue_db_in_the_cwd(ip: Any, tmp_path: Path) -> None:
    assert not (tmp_path / "nbqueue.db").exists()
    q = ip.run_line_magic("nbqueue", "")
    assert (tmp_path / "nbqueue.db").exists()
    assert os.path.samefile(q.target, tmp_path / "nbqueue.db")
    assert ip.run_line_magic("nbqueue", "") is q


def test_first_enqueue_opens_nbqueue_db_in_the_cwd(
    ip: Any, tmp_path: Path, double: None, reader: Any
) -> None:
    assert not (tmp_path / "nbqueue.db").exists()
    job = ip.run_line_magic("enqueue", "double(4)")
    assert (tmp_path / "nbqueue.db").exists()
    stored = reader(tmp_path / "nbqueue.db").get(job.id)
    assert stored.task == "__main__.double"
    assert stored.args == [4]
    assert os.path.samefile(current(ip).target, tmp_path / "nbqueue.db")


def test_nbqueue_accepts_a_quoted_path_with_spaces(ip: Any, tmp_path: Path) -> None:
    (tmp_path / "my queues").mkdir()
    q = ip.run_line_magic("nbqueue", '"my queues/a b.db"')
    assert (tmp_path / "my queues" / "a b.db").exists()
    assert os.path.samefile(q.target, tmp_path / "my queues" / "a b.db")


def test_opening_another_queue_stops_the_worker_and_switches(ip: Any, double: None, reader: Any) -> None:
    a = ip.run_line_magic("nbqueue", "a.db")
    assert ip.run_line_magic("worker", "start")["running"] is True
    assert len(worker_threads()) == 1
    b = ip.run_line_magic("nbqueue", "b.db")
    assert b is not a
    assert b.target.endswith("b.db")
    assert ip.run_line_magic("worker", "status") == {"running": False}
    assert worker_threads() == []
    ip.run_line_magic("enqueue", "double(1)")
    assert reader(b.target).counts()["pending"] == 1
    assert total(reader(a.target)) == 0


def test_nbqueue_errors_are_usage_errors(ip: Any, tmp_path: Path) -> None:
    q = ip.run_line_magic("nbqueue", "good.db")
    with pytest.raises(UsageError, match="one path"):
        ip.run_line_magic("nbqueue", "a.db b.db")
    (tmp_path / "garbage.db").write_text("this is not an SQLite database\n" * 200)
    with pytest.raises(UsageError, match=r"garbage\.db"):
        ip.run_line_magic("nbqueue", "garbage.db")
    assert ip.run_line_magic("nbqueue", "") is q
    assert not (tmp_path / "a.db").exists()


def test_a_failed_nbqueue_leaves_the_running_worker_alone(ip: Any, tmp_path: Path) -> None:
    """A %nbqueue that cannot open its file should change nothing, like every failed magic."""
    q = ip.run_line_magic("nbqueue", "good.db")
    ip.run_line_magic("worker", "start")
    (tmp_path / "garbage.db").write_text("this is not an SQLite database\n" * 200)
    with pytest.raises(UsageError):
        ip.run_line_magic("nbqueue", "garbage.db")
    assert ip.run_line_magic("nbqueue", "") is q
    assert ip.run_line_magic("worker", "status")["running"] is True
    assert len(worker_threads()) == 1


# -- %enqueue ---------------------------------------------------------------------


def test_enqueue_registers_a_plain_function_under_its_module_qualified_name(
    ip: Any, double: None, reader: Any
) -> None:
    job = ip.run_line_magic("enqueue", "double(21)")
    assert isinstance(job, Job)
    assert job.task == "__main__.double"  # what @q.task would name it: one rule for both
    assert job.status is State.PENDING
    assert (job.args, job.kwargs) == ([21], {})
    assert tasks.lookup("__main__.double").fn(21) == ip.user_ns["double"](21)
    ip.run_cell("def double(x):\n    return 3 * x")  # redefined: the task follows the notebook
    assert tasks.lookup("__main__.double").fn(21) == 63
    stored = reader(current(ip).target).get(job.id)
    assert (stored.task, stored.args, stored.queue, stored.max_retries) == (
        "__main__.double",
        [21],
        "default",
        3,
    )
    assert repr(job) == f"<Job {job.id} pending double queue='default' next: attempt 1 of 4>"


def test_enqueue_evaluates_arguments_in_the_notebook_namespace(ip: Any, double: None) -> None:
    run(ip, "n = 7\nalias = double")
    job = ip.run_line_magic("enqueue", "double(n * 2)")
    assert job.args == [14]
    job = ip.run_line_magic("enqueue", "alias(x=n)")
    assert job.task == "__main__.double"  # the function's own name, not the variable's
    assert job.kwargs == {"x": 7}


@pytest.mark.parametrize(
    ("source", "args", "kwargs"),
    [
        ('echo("https://example.org")', ["https://example.org"], {}),
        ("echo({'a': [1, 2]}, flag=True)", [{"a": [1, 2]}], {"flag": True}),
        ('echo("--queue")', ["--queue"], {}),
        ("echo(-1)", [-1], {}),
        ('echo("a  b")', ["a  b"], {}),
        ("echo(1, -2)", [1, -2], {}),
        ("echo('x -p 3')", ["x -p 3"], {}),
        ('echo("{n}")', ["{n}"], {}),
        ('echo("$n costs $$5")', ["$n costs $$5"], {}),
        ("echo({'k': n})", [{"k": 7}], {}),
    ],
)
def test_enqueue_takes_the_call_verbatim(
    made: None, ip: Any, source: str, args: list[Any], kwargs: dict[str, Any]
) -> None:
    run(ip, "def echo(*args, **kwargs):\n    return args\nn = 7")
    q = current(ip)
    job = ip.run_line_magic("enqueue", source)
    assert (job.args, job.kwargs) == (args, kwargs)
    assert total(q) == 1


def test_enqueue_stores_every_option(ip: Any, double: None, reader: Any) -> None:
    job = ip.run_line_magic(
        "enqueue", "--queue reports --delay 30 --priority 5 --retries 7 --key daily-1 double(3)"
    )
    short = ip.run_line_magic("enqueue", "-q nightly -d 0.5 -p -2 -r 0 -k k2 double(x=4)")
    db = reader(current(ip).target)
    for j in (job, db.get(job.id)):
        assert (j.task, j.args, j.status) == ("__main__.double", [3], State.PENDING)
        assert (j.queue, j.priority, j.max_retries, j.key) == ("reports", 5, 7, "daily-1")
        assert j.run_at - j.created_at == timedelta(seconds=30)
    for j in (short, db.get(short.id)):
        assert (j.queue, j.priority, j.max_retries, j.key) == ("nightly", -2, 0, "k2")
        assert j.run_at - j.created_at == timedelta(milliseconds=500)
        assert j.kwargs == {"x": 4}
    # the idempotency key: the same key while unfinished is the same job
    again = ip.run_line_magic("enqueue", "--key daily-1 double(99)")
    assert again.id == job.id
    assert total(db) == 2


def test_enqueue_quoted_option_values_lose_their_quotes(ip: Any, double: None) -> None:
    """`%nbqueue "a b.db"` unquotes its path; the options of %enqueue should too."""
    job = ip.run_line_magic("enqueue", "--key \"daily report\" --queue 'reports' double(1)")
    assert job.key == "daily report"
    assert job.queue == "reports"


def test_enqueue_wait_blocks_until_the_job_is_done(ip: Any, double: None) -> None:
    ip.run_line_magic("worker", "start")
    job = ip.run_line_magic("enqueue", "--wait double(21)")
    assert job.status is State.COMPLETED
    assert job.value == 42
    job = ip.run_line_magic("enqueue", "-w double(x=5)")
    assert (job.status, job.value) == (State.COMPLETED, 10)


def test_enqueue_wait_without_a_worker_says_so(ip: Any, double: None) -> None:
    q = current(ip)
    with pytest.raises(UsageError, match=r"no worker runs \(%worker start\)") as raised:
        ip.run_line_magic("enqueue", "--wait double(1)")
    [job] = q.jobs()
    assert f"job {job.id} is queued" in str(raised.value)  # the message tells the truth
    assert job.status is State.PENDING


def test_enqueue_a_task_object(ip: Any) -> None:
    q = current(ip)
    run(
        ip,
        "q = nbqueue_queue\n"
        "@q.task(name='shout', queue='loud', max_retries=5, priority=2)\n"
        "def shout(word):\n"
        "    return word.upper() + '!'\n",
    )
    job = ip.run_line_magic("enqueue", "shout('hi')")
    assert (job.task, job.queue, job.max_retries, job.priority) == ("shout", "loud", 5, 2)
    assert tasks.lookup("shout") is ip.user_ns["shout"]  # the Task itself, not a wrapper
    other = ip.run_line_magic("enqueue", "--queue quiet --retries 1 --priority 9 shout('ho')")
    assert (other.queue, other.max_retries, other.priority) == ("quiet", 1, 9)
    ip.run_line_magic("worker", "start")
    assert finished(q, job.id).value == "HI!"
    assert finished(q, other.id).value == "HO!"


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("double", "function call"),
        ("1 + 2", "function call"),
        ("double(", "not a call"),
        ("nosuch(1)", "'nosuch' is not defined"),
        ("math.nope(1)", "nope"),
        ("number(1)", "not a function"),
        ("double(object())", "args[0]"),
        ("double(x=frozenset([1]))", "kwargs['x']"),
        ("double({1, 2})", "args[0]"),
        ("double(*[1])", "*args"),
        ("double(**{'x': 1})", "**kwargs"),
        ("double(1 / 0)", "ZeroDivisionError"),
        ("", "needs a call"),
        ("   ", "needs a call"),
        ("--priority high double(1)", "priority"),
        ("--delay soon double(1)", "delay"),
        ("--retries -1 double(1)", "max_retries"),
        ("--bogus double(1)", "--bogus"),
        ("--priority 1", "needs a call"),
    ],
)
def test_enqueue_errors_are_usage_errors_and_enqueue_nothing(
    made: None, ip: Any, double: None, line: str, message: str
) -> None:
    run(ip, "import math\nnumber = 5")
    q = current(ip)
    ip.run_line_magic("enqueue", "double(0)")  # one job, so "unchanged" is not just "empty"
    before = q.counts()
    with pytest.raises(UsageError, match=re.escape(message)):
        ip.run_line_magic("enqueue", line)
    assert q.counts() == before
    assert q.queues() == ["default"]


# -- %%enqueue --------------------------------------------------------------------


def test_cell_runs_in_the_notebook_namespace(ip: Any) -> None:
    q = current(ip)
    run(ip, "base = 40")
    cell = "from_cell = base + 2\nprint('hello from the cell')\nfrom_cell * 10\n"
    ip.run_line_magic("worker", "start")
    job = ip.run_cell_magic("enqueue", "--name setx", cell)
    assert isinstance(job, Job)
    assert job.task == CELL_TASK
    assert job.args == [cell, "setx"]
    done = finished(q, job.id)
    assert done.status is State.COMPLETED
    assert done.value == 420  # the last expression is the result
    assert ip.user_ns["from_cell"] == 42
    assert done.output == "hello from the cell\n"


def test_cell_results_that_json_cannot_hold_become_their_repr(ip: Any) -> None:
    q = current(ip)
    ip.run_line_magic("worker", "start")
    as_repr = ip.run_cell_magic("enqueue", "", "{1, 2}")
    no_value = ip.run_cell_magic("enqueue", "", "y = 1")
    assert finished(q, as_repr.id).value == "{1, 2}"
    done = finished(q, no_value.id)
    assert (done.status, done.value) == (State.COMPLETED, None)
    assert as_repr.args[1] == "cell"  # the default name


def test_cell_options_are_stored(ip: Any, reader: Any) -> None:
    job = ip.run_cell_magic(
        "enqueue", "--queue nightly --priority 3 --retries 5 --delay 60 --key k9 --name nightly-job", "1"
    )
    for j in (job, reader(current(ip).target).get(job.id)):
        assert (j.queue, j.priority, j.max_retries, j.key) == ("nightly", 3, 5, "k9")
        assert j.run_at - j.created_at == timedelta(seconds=60)
        assert j.args == ["1", "nightly-job"]


def test_cell_wait_returns_the_finished_job(ip: Any) -> None:
    ip.run_line_magic("worker", "start")
    job = ip.run_cell_magic("enqueue", "--wait", "6 * 7")
    assert (job.status, job.value) == (State.COMPLETED, 42)


@pytest.mark.slow  # real seconds: the default backoff (about 2 s)
def test_a_raising_cell_is_retried_then_dead_with_its_traceback(ip: Any) -> None:
    q = current(ip)
    run(ip, "runs = []")
    ip.run_line_magic("worker", "start")
    job = ip.run_cell_magic(
        "enqueue", "--retries 1 --name boom", "runs.append(1)\nraise ValueError('cell exploded')"
    )
    done = finished(q, job.id, timeout=20)  # one retry after about 2 s
    assert done.status is State.DEAD
    assert (done.attempts, done.retries) == (2, 1)
    assert ip.user_ns["runs"] == [1, 1]
    assert done.error is not None
    assert "Traceback (most recent call last)" in done.error
    assert "<nbqueue cell boom>" in done.error
    assert done.error.rstrip().endswith("ValueError: cell exploded")


@pytest.mark.parametrize(
    ("line", "cell", "message"),
    [
        ("", "x = (", "does not parse"),
        ("--name broken", "def f(:\n    pass", "does not parse"),
        ("", "", "empty"),
        ("", "\n   \n", "needs code"),
        ("--priority high", "1", "priority"),
        ("--retries -3", "1", "max_retries"),
    ],
)
def test_cell_errors_are_usage_errors_and_enqueue_nothing(
    made: None, ip: Any, line: str, cell: str, message: str
) -> None:
    q = current(ip)
    ip.run_cell_magic("enqueue", "", "1")
    before = q.counts()
    with pytest.raises(UsageError, match=re.escape(message)):
        ip.run_cell_magic("enqueue", line, cell)
    assert q.counts() == before


def test_cell_jobs_run_only_in_workers_that_allow_code(ip: Any, double: None) -> None:
    q = current(ip)
    job = ip.run_cell_magic("enqueue", "", "ran_it = True")
    plain_job = ip.run_line_magic("enqueue", "double(4)")
    plain = q.worker(lease=5)  # like `nbqueue worker` without --allow-code
    plain.run_until_idle(timeout=10)
    assert q.get(plain_job.id).value == 8
    assert q.get(job.id).status is State.PENDING
    assert "ran_it" not in ip.user_ns
    ip.run_line_magic("worker", "start")
    assert finished(q, job.id).status is State.COMPLETED
    assert ip.user_ns["ran_it"] is True


def test_a_worker_that_may_run_no_task_just_idles(ip: Any) -> None:
    """Only the opt-in cell task is registered: a plain worker has nothing to run, and must not fail."""
    q = current(ip)
    job = ip.run_cell_magic("enqueue", "", "ran_it = True")
    q.worker(lease=5).run_until_idle(timeout=10)
    assert q.get(job.id).status is State.PENDING
    assert "ran_it" not in ip.user_ns


# -- %worker ----------------------------------------------------------------------


def test_worker_start_status_stop(ip: Any) -> None:
    assert ip.run_line_magic("worker", "") == {"running": False}
    assert ip.run_line_magic("worker", "status") == {"running": False}
    started = ip.run_line_magic("worker", "start")
    assert isinstance(started, dict)
    assert started["running"] is True
    assert (started["concurrency"], started["in_flight"], started["queues"]) == (1, [], None)
    assert worker_threads() == ["nbqueue-worker-0"]
    again = ip.run_line_magic("worker", "start --concurrency 3")
    assert again["worker_id"] == started["worker_id"]
    assert len(worker_threads()) == 1
    status = ip.run_line_magic("worker", "status")
    assert (status["running"], status["worker_id"]) == (True, started["worker_id"])
    assert ip.run_line_magic("worker", "stop") == {"running": False}
    assert nbqueue_threads() == []
    assert ip.run_line_magic("worker", "stop") == {"running": False}
    assert ip.run_line_magic("worker", "start")["worker_id"] != started["worker_id"]
    assert len(worker_threads()) == 1


def test_worker_concurrency_and_queues(ip: Any, double: None) -> None:
    q = current(ip)
    status = ip.run_line_magic("worker", "start --concurrency 2 --queues a,b")
    assert (status["concurrency"], status["queues"]) == (2, ["a", "b"])
    assert sorted(worker_threads()) == ["nbqueue-worker-0", "nbqueue-worker-1"]
    elsewhere = ip.run_line_magic("enqueue", "--queue c double(1)")
    mine = [ip.run_line_magic("enqueue", f"--queue {name} double({i})") for i, name in enumerate("abab")]
    assert [finished(q, j.id).value for j in mine] == [0, 2, 4, 6]
    assert q.get(elsewhere.id).status is State.PENDING
    assert ip.run_line_magic("worker", "status")["completed"] == 4


@pytest.mark.parametrize(
    "line", ["start --concurrency 0", "start --lease 0", "start --concurrency two", "launch"]
)
def test_worker_bad_arguments_are_usage_errors(ip: Any, line: str) -> None:
    with pytest.raises(UsageError):
        ip.run_line_magic("worker", line)
    assert worker_threads() == []
    assert ip.run_line_magic("worker", "status") == {"running": False}


# -- %jobs and %deadletters -------------------------------------------------------


def test_jobs_and_deadletters_return_widgets(ip: Any, double: None) -> None:
    q = current(ip)
    ip.run_line_magic("enqueue", "double(1)")
    ip.run_line_magic("enqueue", "--queue beta double(2)")
    board = ip.run_line_magic("jobs", "")
    assert isinstance(board, JobBoard)
    assert isinstance(board, ipywidgets.VBox)
    assert board.counts == q.counts()
    filtered = ip.run_line_magic("jobs", "--status dead --queue beta --interval 0.1")
    assert (filtered.status_filter.value, filtered.queue_filter.value) == ("dead", "beta")
    assert filtered.rows == []
    assert filtered.live
    dead = ip.run_line_magic("deadletters", "--queue beta")
    assert isinstance(dead, DeadLetterView)
    assert isinstance(dead, ipywidgets.VBox)
    assert dead.queue_name == "beta"
    for bad in ("--interval 0", "--status sleeping"):
        with pytest.raises(UsageError):
            ip.run_line_magic("jobs", bad)
    ip.run_line_magic("unload_ext", "nbqueue")  # unloading stops the views' timers
    wait_until(lambda: not (board.live or filtered.live or dead.live), 5, "the views' timers stopped")


# -- %send ----------------------------------------------------------------------


def test_send_answers_a_waiting_job_and_keeps_a_value_for_a_later_wait(
    made: None, ip: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    q = current(ip)
    review = q.task(name="mg.review")(
        lambda: nbqueue.wait_for("review", prompt="ok?", choices=["approve", "reject"])
    )
    config = q.task(name="mg.config")(lambda: nbqueue.wait_for("config"))
    asked = review.enqueue()
    q.worker().run_until_idle(timeout=20)
    assert q.get(asked.id).status == "waiting"
    ahead = config.enqueue()  # pending: what is sent now waits for its wait
    for bad, said in [
        (f"{asked.id} review maybe", 'waits for one of "approve", "reject"'),
        ("999 review approve", "no job with id 999"),
        (f"{asked.id} review", "the following arguments are required: value"),
    ]:
        with pytest.raises(UsageError, match=re.escape(said)):
            ip.run_line_magic("send", bad)
    assert q.get(asked.id).status == "waiting"  # nothing sent
    assert ip.run_line_magic("send", f"{asked.id} review approve --by ada") is None
    assert capsys.readouterr().out == f'job {asked.id}: sent review = "approve"; it runs again\n'
    ip.run_line_magic("send", f"""{ahead.id} config '{{"n": 3, "on": true}}'""")  # braces as written
    assert (
        capsys.readouterr().out
        == f'job {ahead.id}: sent config = {{"n": 3, "on": true}}; kept for its wait\n'
    )
    [sent] = [w for w in q.waits(asked) if w.name == "review"]
    assert sent.sent_by == "ada"
    q.worker().run_until_idle(timeout=20)
    assert (finished(q, asked.id).value, finished(q, ahead.id).value) == ("approve", {"n": 3, "on": True})
    with pytest.raises(UsageError, match=f"%send: job {asked.id} is completed"):
        ip.run_line_magic("send", f"{asked.id} review approve")


# -- loading and unloading --------------------------------------------------------


def test_load_ext_twice_keeps_one_session(ip: Any) -> None:
    ip.run_line_magic("worker", "start")
    ip.run_line_magic("load_ext", "nbqueue")
    ip.run_line_magic("worker", "start")
    assert len(worker_threads()) == 1
    assert ip.run_line_magic("worker", "status")["running"] is True


def test_reload_ext_leaves_at_most_one_worker(ip: Any) -> None:
    ip.run_line_magic("worker", "start")
    assert len(worker_threads()) == 1
    ip.run_line_magic("reload_ext", "nbqueue")
    assert len(worker_threads()) <= 1
    ip.run_line_magic("worker", "start")
    assert len(worker_threads()) == 1
    ip.run_line_magic("reload_ext", "nbqueue")
    ip.run_line_magic("reload_ext", "nbqueue")
    ip.run_line_magic("worker", "start")
    assert len(worker_threads()) == 1
    assert isinstance(ip.run_line_magic("nbqueue", ""), nbqueue.Queue)


def test_unload_ext_stops_the_worker(ip: Any) -> None:
    ip.run_line_magic("worker", "start --concurrency 2")
    assert len(worker_threads()) == 2
    ip.run_line_magic("unload_ext", "nbqueue")
    assert nbqueue_threads() == []


def test_magics_after_unload_start_no_worker(ip: Any) -> None:
    """After %unload_ext nothing may start a worker that no later unload can stop."""
    ip.run_line_magic("unload_ext", "nbqueue")
    try:
        with contextlib.suppress(UsageError):
            ip.run_line_magic("worker", "start")
        assert worker_threads() == []
    finally:
        stop_orphans()


def test_the_magic_opens_nbqueue_url_when_no_path_is_given(
    ip: Any, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A notebook names its queue without holding a password: %nbqueue reads NBQUEUE_URL."""
    monkeypatch.setenv("NBQUEUE_URL", pg_url)
    q = ip.run_line_magic("nbqueue", "")
    assert q.target == pg_url
    assert q.counts()["pending"] == 0


# -- only this user's jobs run in the kernel ------------------------------------------------


@pytest.mark.slow  # real seconds: a second in which nothing may happen
def test_the_worker_never_adopts_a_function_for_a_row_another_process_wrote(ip: Any, tmp_path: Path) -> None:
    """A hand-written row naming a notebook function (`remove_it`) must not make the kernel call it."""
    precious = tmp_path / "precious.txt"
    precious.write_text("keep me")
    run(ip, "import os\ndef remove_it(path):\n    os.remove(path)\n    return 'removed'")
    q = ip.run_line_magic("nbqueue", "jobs.db")
    with sqlite3.connect(tmp_path / "jobs.db") as conn:  # anyone who can write the file
        forged = conn.execute(
            "INSERT INTO nbqueue_jobs (status, queue, task, payload, max_retries, run_at, created_at, "
            "updated_at) VALUES ('pending', 'default', 'remove_it', ?, 3, 0, 0, 0)",
            (json.dumps({"args": [str(precious)], "kwargs": {}}),),
        ).lastrowid
    run(ip, "def harmless():\n    return 'fine'")
    ip.run_line_magic("worker", "start")
    try:
        mine = ip.run_line_magic("enqueue", "harmless()")
        assert finished(q, mine.id).value == "fine"  # the worker runs what this notebook queued ...
        time.sleep(1.0)  # ... and has had ample time to take the other one, if it would
    finally:
        ip.run_line_magic("worker", "stop")
    assert precious.read_text() == "keep me"
    job = q.get(int(forged or 0))
    assert job.status == "pending" and job.attempts == 0


def test_enqueue_runs_an_async_notebook_function_with_limits(ip: Any) -> None:
    run(
        ip, "import asyncio\nasync def ask(prompt):\n    await asyncio.sleep(0.01)\n    return prompt.upper()"
    )
    q = ip.run_line_magic("nbqueue", "jobs.db")
    q.limit("llm", concurrency=2)
    job = ip.run_line_magic("enqueue", "--limits llm ask('hi')")
    assert job.limits == {"llm": 1}
    ip.run_line_magic("worker", "start")
    try:
        assert finished(q, job.id).value == "HI"
    finally:
        ip.run_line_magic("worker", "stop")


def _notebook(path: Path) -> Path:
    import nbformat

    notebook = nbformat.v4.new_notebook(
        metadata={"kernelspec": {"name": "python3", "display_name": "Python 3"}}
    )
    notebook.cells = [
        nbformat.v4.new_code_cell('region = "nowhere"', metadata={"tags": ["parameters"]}),
        nbformat.v4.new_code_cell("import nbqueue\nnbqueue.output('region', region)"),
    ]
    nbformat.write(notebook, path)
    return path


def test_enqueue_notebook_takes_papermill_style_parameters_and_the_job_options(
    ip: Any, tmp_path: Path
) -> None:
    _notebook(tmp_path / "report.ipynb")
    job = ip.run_line_magic(
        "enqueue", "--notebook report.ipynb -p region=eu -p n=3 --priority 7 --timeout 60"
    )
    assert job.task == "nbqueue.notebook"
    assert job.kwargs["parameters"] == {"region": "eu", "n": 3}
    assert (job.priority, job.timeout) == (7, 60)
    assert job.kwargs["source"] == str(tmp_path / "report.ipynb")
    quoted = ip.run_line_magic("enqueue", "--notebook 'report.ipynb' -p 'title=a b'")
    assert quoted.kwargs["parameters"] == {"title": "a b"}


def test_enqueue_notebook_refusals_queue_nothing(ip: Any, tmp_path: Path) -> None:
    _notebook(tmp_path / "report.ipynb")
    ip.run_line_magic("nbqueue", "jobs.db")
    for line, said in [
        ("--notebook missing.ipynb", "no notebook at"),
        ("--notebook report.ipynb f(1)", "takes no call"),
        ("--notebook report.ipynb -p 1x=2", "Python identifier"),
        ("--parameter a=1 f(1)", "use it with --notebook"),
    ]:
        with pytest.raises(UsageError, match=said):
            ip.run_line_magic("enqueue", line)
    assert sum(Queue(str(tmp_path / "jobs.db")).counts().values()) == 0


@pytest.mark.slow
def test_the_kernel_worker_runs_the_notebook_jobs_it_queued(ip: Any, tmp_path: Path) -> None:
    _notebook(tmp_path / "report.ipynb")
    job = ip.run_line_magic("enqueue", "--notebook report.ipynb -p region=eu")
    ip.run_line_magic("worker", "start")
    try:
        assert job.result(timeout=120)["values"] == {"region": "eu"}
    finally:
        ip.run_line_magic("worker", "stop")
    assert (tmp_path / "nbqueue-notebooks" / f"report-{job.id}.ipynb").exists()


# -- one rule for task names, and the kernel taking its jobs back ------------------------------


def test_enqueue_names_a_task_as_q_task_does(ip: Any) -> None:
    run(ip, "def twice(x):\n    return 2 * x")
    job = ip.run_line_magic("enqueue", "twice(2)")
    run(ip, "named = nbqueue_queue.task(twice).name")  # the decorator's default name
    assert job.task == ip.user_ns["named"] == "__main__.twice"


def test_enqueue_of_an_imported_function_names_its_module(ip: Any) -> None:
    q = current(ip)
    run(ip, "import textwrap\nfrom textwrap import indent")
    dotted = ip.run_line_magic("enqueue", "textwrap.dedent('   x')")
    imported = ip.run_line_magic("enqueue", "indent('y', '> ')")
    assert (dotted.task, imported.task) == ("textwrap.dedent", "textwrap.indent")
    ip.run_line_magic("worker", "start")
    try:
        assert finished(q, dotted.id).value == "x"
        assert finished(q, imported.id).value == "> y"
    finally:
        ip.run_line_magic("worker", "stop")


def forget(*names: str) -> None:
    """What a kernel restart does to the registry: the notebook's tasks are gone."""
    for name in names:
        tasks.unregister(name)


def test_a_restarted_kernel_adopts_notebook_functions_under_their_qualified_name(
    ip: Any, double: None
) -> None:
    q = current(ip)
    job = ip.run_line_magic("enqueue", "double(5)")
    forget("__main__.double")
    run(ip, "def double(x=1):\n    return 10 * x")  # the cell run again (fixed, even)
    ip.run_line_magic("worker", "start")
    try:
        assert finished(q, job.id).value == 50
    finally:
        ip.run_line_magic("worker", "stop")
    assert ip.user_ns["nbqueue_queue"].get(job.id).task == "__main__.double"


def test_jobs_queued_under_the_old_bare_name_are_still_adopted(ip: Any, double: None) -> None:
    """An older nbqueue named a %enqueue task by the function's bare name."""
    q = current(ip)
    old = q.task(name="double", signed=True)(lambda x=1: 0).enqueue(4)  # signed, as the magic did
    forget("double")
    ip.run_line_magic("worker", "start")
    try:
        assert finished(q, old.id).value == 8  # the notebook's double
    finally:
        ip.run_line_magic("worker", "stop")


def test_an_imported_function_is_adopted_only_if_it_is_the_one_named(ip: Any) -> None:
    q = current(ip)
    run(ip, "from textwrap import dedent")
    job = ip.run_line_magic("enqueue", "dedent('  z')")
    forget("textwrap.dedent")
    run(ip, "def dedent(text):\n    return 'not textwrap'")  # the name now holds another function
    assert ip.run_line_magic("worker", "start")["running"] is True
    ip.run_line_magic("worker", "stop")
    assert "textwrap.dedent" not in tasks.names()
    assert q.get(job.id).status is State.PENDING
    run(ip, "from textwrap import dedent")
    ip.run_line_magic("worker", "start")
    try:
        assert finished(q, job.id).value == "z"
    finally:
        ip.run_line_magic("worker", "stop")


def test_a_restarted_kernel_leaves_unsigned_rows_alone_whatever_they_are_named(ip: Any, double: None) -> None:
    q = current(ip)
    forged = q.enqueue({"args": [1], "kwargs": {}})  # a raw row; then rename its task by hand
    with contextlib.closing(sqlite3.connect(q.target)) as conn, conn:
        conn.execute("UPDATE nbqueue_jobs SET task = '__main__.double' WHERE id = ?", (forged.id,))
    ip.run_line_magic("worker", "start")
    try:
        time.sleep(0.5)
    finally:
        ip.run_line_magic("worker", "stop")
    assert "__main__.double" not in tasks.names()
    assert q.get(forged.id).status is State.PENDING


def test_two_lambdas_are_two_tasks(ip: Any) -> None:
    """Every lambda's own name is <lambda>: the variable names the task, or one would run the other."""
    q = current(ip)
    run(ip, "inc = lambda x: x + 1\nneg = lambda x: -x")
    a = ip.run_line_magic("enqueue", "inc(1)")
    b = ip.run_line_magic("enqueue", "neg(1)")
    assert (a.task, b.task) == ("__main__.inc", "__main__.neg")
    ip.run_line_magic("worker", "start")
    try:
        assert (finished(q, a.id).value, finished(q, b.id).value) == (2, -1)
    finally:
        ip.run_line_magic("worker", "stop")


def test_worker_magic_reads_as_a_sentence_and_takes_async_concurrency(ip: Any, double: None) -> None:
    ip.run_line_magic("nbqueue", "a.db")
    status = ip.run_line_magic("worker", "start --concurrency 2 --async-concurrency 8")
    assert status["running"] is True and status["concurrency"] == 2  # still the status dict
    assert nbqueue.jupyter.session(ip).worker.async_concurrency == 8
    text = ip.display_formatter.format(status)[0]
    assert text["text/plain"].startswith("worker running · 2 threads · idle · 0 completed, 0 failed")
    assert "worker running" in status._repr_html_()
    with pytest.raises(UsageError, match="--async-concurrency must be at least 1"):
        ip.run_line_magic("worker", "start --async-concurrency 0")
    ip.run_line_magic("worker", "stop")
    stopped = ip.display_formatter.format(ip.run_line_magic("worker", "status"))[0]["text/plain"]
    assert stopped == "worker stopped"


def test_a_job_s_traceback_names_the_cell_as_ipython_does(ip: Any) -> None:
    """Not the kernel's temporary file (ipykernel_…/3459433877.py): "Cell In[n]", as the cell's
    own traceback would, with the user's frames first."""
    q = ip.run_line_magic("nbqueue", "cells.db")
    run(ip, "def broken(x):\n    return 1 / x")
    job = ip.run_line_magic("enqueue", "--retries 0 broken(0)")
    ip.run_line_magic("worker", "start")
    wait_until(lambda: q.get(job.id).finished, 10, "the job dead")
    error = q.get(job.id).error or ""
    assert re.search(r"^  Cell In\[\d+\], line 2, in broken$", error, re.M), error
    assert '.py", line 2, in broken' not in error
    shown = user_first(error)  # as the board shows it: the cell's frame first
    assert shown.splitlines()[1].startswith("  Cell In["), shown
    assert error.rstrip().endswith("ZeroDivisionError: division by zero")
