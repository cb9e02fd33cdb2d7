"""Bad input to the magics: each refusal is IPython's UsageError naming what was wrong, and the
queue is left exactly as it was (the API's and CLI's refusals: tests/reliability/test_bad_input.py).

Here, not beside those, so that the one test process that imports IPython runs them
(tests/conftest.py HEAVY_IMPORTS)."""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests import templates
from tests.helpers import snapshot


def magic_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("nbqueue-") and t.is_alive()]


@pytest.fixture
def ip(ip: Any, tmp_path: Path, sqlite_template: Path) -> Any:
    """The shell of tests/jupyter/conftest.py (extension loaded, no worker thread may outlive
    the test), with a notebook function `double`, values no job can hold, and a queue holding
    one job."""
    templates.copy_sqlite_template(sqlite_template, tmp_path / "nb.db")
    ip.run_cell(
        "def double(x=1):\n    return 2 * x\n"
        "big = 'x' * (17 * 1024 * 1024)\na_set = {1, 2}\nnan = float('nan')\n"
    ).raise_error()
    ip.run_line_magic("nbqueue", str(tmp_path / "nb.db"))
    ip.run_line_magic("enqueue", "double(21)")
    return ip


def assert_usage_error(shell: Any, run: Callable[[], Any], match: str) -> None:
    from IPython.core.error import UsageError

    path = Path(shell.user_ns["nbqueue_queue"].target)
    before = snapshot(path)
    try:
        run()
    except UsageError as exc:
        assert re.search(match, str(exc), re.IGNORECASE), f"{str(exc)!r} does not mention {match!r}"
    except Exception as exc:
        pytest.fail(f"raw {type(exc).__module__}.{type(exc).__qualname__} escaped the magic: {exc}")
    else:
        pytest.fail(f"accepted; expected a UsageError mentioning {match!r}")
    assert snapshot(path) == before, "the refused magic changed the queue"
    assert not [t for t in magic_threads() if t.startswith("nbqueue-worker")]


ENQUEUE_LINES = [
    ("--delay -5 double(1)", "delay"),
    ("--delay nan double(1)", "delay"),
    ("--delay inf double(1)", "delay"),
    ("--delay 1e15 double(1)", "delay"),
    ("--retries 1001 double(1)", "max_retries"),
    ("--retries 1.5 double(1)", "retries"),
    ("--priority 99999999999999999999 double(1)", "priority"),
    ("--key '' double(1)", "key"),
    ("double(big)", "limit"),
    ("double(a_set)", r"args\[0\]"),
    ("double(x=nan)", r"kwargs\['x'\]"),
    ("double(1)(2)", "double"),
    ("import os", "call"),
]


@pytest.mark.parametrize(("line", "match"), ENQUEUE_LINES, ids=[line for line, _ in ENQUEUE_LINES])
def test_enqueue_magic_refuses_bad_lines(ip: Any, line: str, match: str) -> None:
    assert_usage_error(ip, lambda: ip.run_line_magic("enqueue", line), match)


ENQUEUE_CELLS = [
    ("--delay -1", "1", "delay"),
    ("--delay nan", "1", "delay"),
    ("--key ''", "1", "key"),
    ("--retries 1.5", "1", "retries"),
    ("--priority 2", "x = 'a\x00b'", "null|NUL"),
    ('--name "unterminated', "1", "quotation|quote"),
    ("", "blob = '" + "b" * (17 * 1024 * 1024) + "'", "limit"),
]


@pytest.mark.parametrize(
    ("line", "cell", "match"), ENQUEUE_CELLS, ids=[f"{line} {cell[:20]!r}" for line, cell, _ in ENQUEUE_CELLS]
)
def test_enqueue_cell_magic_refuses_bad_input(ip: Any, line: str, cell: str, match: str) -> None:
    assert_usage_error(ip, lambda: ip.run_cell_magic("enqueue", line, cell), match)


def test_enqueue_magic_with_a_lone_surrogate_is_refused_or_round_trips(ip: Any) -> None:
    from IPython.core.error import UsageError

    q = ip.user_ns["nbqueue_queue"]
    try:
        job = ip.run_line_magic("enqueue", "double('a\\ud800')")
    except UsageError as exc:  # a raw UnicodeEncodeError fails the test
        assert "args" in str(exc)
        return
    assert q.get(job.id).args == ["a\ud800"]


WORKER_LINES = [
    ("start --lease nan", "lease"),
    ("start --lease inf", "lease"),
    ("start --lease 0.001", "lease"),
    ("start --lease 1e300", "lease"),
    ("start --concurrency -1", "concurrency"),
    ("start --concurrency 1.5", "concurrency"),
    ("restart", "restart|choice"),
]


@pytest.mark.parametrize(("line", "match"), WORKER_LINES, ids=[line for line, _ in WORKER_LINES])
def test_worker_magic_refuses_bad_lines(ip: Any, line: str, match: str) -> None:
    try:
        assert_usage_error(ip, lambda: ip.run_line_magic("worker", line), match)
    finally:
        ip.run_line_magic("worker", "stop")
    assert ip.run_line_magic("worker", "status") == {"running": False}


def test_worker_magic_with_only_commas_for_queues_does_not_spin(ip: Any) -> None:
    """`--queues ,` names no queue: refused, or taken as every queue; either way the job runs
    or nothing starts, and the worker never loops on a broken claim."""
    from IPython.core.error import UsageError

    q = ip.user_ns["nbqueue_queue"]
    try:
        ip.run_line_magic("worker", "start --queues ,")
    except UsageError:
        assert ip.run_line_magic("worker", "status") == {"running": False}
        return
    try:
        [job] = q.jobs()
        assert job.result(timeout=5) == 42
    finally:
        ip.run_line_magic("worker", "stop")


JOBS_LINES = [
    ("--status done", "done|choice"),
    ("--status ''", "status|choice"),
    ("--interval 0", "interval"),
    ("--interval -1", "interval"),
    ("--interval nan", "interval"),
]


@pytest.mark.parametrize(("line", "match"), JOBS_LINES, ids=[line for line, _ in JOBS_LINES])
def test_jobs_magic_refuses_bad_lines(ip: Any, line: str, match: str) -> None:
    assert_usage_error(ip, lambda: ip.run_line_magic("jobs", line), match)


@pytest.mark.parametrize(
    ("line", "match"),
    [("a b", "one path"), ("FOLDER", "cannot|folder|directory|open"), ("'x\x00.db'", "NUL|null|path")],
    ids=["two paths", "a folder", "NUL"],
)
def test_nbqueue_magic_refuses_bad_paths(ip: Any, tmp_path: Path, line: str, match: str) -> None:
    line = line.replace("FOLDER", str(tmp_path))
    assert_usage_error(ip, lambda: ip.run_line_magic("nbqueue", line), match)
    assert Path(ip.user_ns["nbqueue_queue"].target) == tmp_path / "nb.db"  # still the same queue


def test_magics_accept_odd_but_valid_names(ip: Any) -> None:
    """A queue name with quotes, spaces and SQL in it, quoted the shell way, in every magic."""
    q = ip.user_ns["nbqueue_queue"]
    sql = "'; DROP TABLE nbqueue_jobs; --"
    job = ip.run_line_magic("enqueue", f'--queue "{sql}" --key "😀 key" double(2)')
    assert (q.get(job.id).queue, q.get(job.id).key) == (sql, "😀 key")
    cell = ip.run_cell_magic("enqueue", f'--queue "{sql}" --name "it\'s"', "'\u202e' * 2")
    assert q.get(cell.id).queue == sql
    try:
        status = ip.run_line_magic("worker", f'start --queues "{sql}"')
        assert status["queues"] == [sql], "the shell's quotes must not become part of the name"
        assert job.result(timeout=10) == 4
        assert cell.result(timeout=10) == "\u202e" * 2
    finally:
        ip.run_line_magic("worker", "stop")
    assert q.counts()["pending"] == 1  # double(21) in "default" was not in the worker's queues
    board = ip.run_line_magic("jobs", f'--queue "{sql}"')
    assert board.queue_filter.value == sql
