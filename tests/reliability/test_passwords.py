"""A PostgreSQL password never shows, and a notebook need not hold one (NBQUEUE_URL).

The review found the full URL, password included, in repr(Queue), the Queue's
HTML (so in saved notebooks), repr(Worker), the board and dead-letter headers
and the CLI's stderr. The server here trusts every local connection, so any
password in the URL still connects: that lets a real queue carry one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import nbqueue
from nbqueue.targets import redact
from tests.helpers import run_cli

SECRET = "s3cret-Pa55"


@pytest.fixture
def secret_url(pg_url: str) -> str:
    """The test queue's URL with a password in it."""
    return pg_url.replace("postgresql://postgres@", f"postgresql://postgres:{SECRET}@")


def test_reprs_html_and_workers_never_show_the_password(secret_url: str) -> None:
    with nbqueue.Queue(secret_url) as q:
        worker = q.worker(lease=5)
        shown = [repr(q), str(q), q._repr_html_(), repr(worker)]
        for text in shown:
            assert SECRET not in text, text
        assert "***" in repr(q) and "127.0.0.1" in repr(q)
        assert q.counts()["pending"] == 0  # the queue itself works with the password


def test_the_board_and_dead_letter_headers_never_show_the_password(secret_url: str) -> None:
    from nbqueue.jupyter.views import DeadLetterView, JobBoard

    with nbqueue.Queue(secret_url) as q:
        board, dead = JobBoard(q, interval=0), DeadLetterView(q, interval=0)
        try:
            for view in (board, dead):
                html = "".join(str(getattr(child, "value", "")) for child in walk(view))
                assert SECRET not in html
        finally:
            board.close()
            dead.close()


def walk(widget: Any) -> list[Any]:
    children = list(getattr(widget, "children", ()))
    return [widget, *(w for child in children for w in walk(child))]


def test_the_cli_never_prints_the_password(secret_url: str, pg_server: str, tmp_path: Path) -> None:
    bad = secret_url.replace("/test?", "/no_such_database_here?")
    for url in (bad, secret_url):
        done = run_cli("stats", url)
        assert SECRET not in done.stderr + done.stdout, done.stderr
    assert "no_such_database_here" in run_cli("stats", bad).stderr


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql://app:pw@db:5432/x", "postgresql://app:***@db:5432/x"),
        ("postgresql://app:p%40w@db/x?schema=s", "postgresql://app:***@db/x?schema=s"),
        ("postgresql://app@db/x", "postgresql://app@db/x"),
        ("postgresql://db/x?password=pw&schema=s", "postgresql://db/x?password=***&schema=s"),
        ("/tmp/jobs.db", "/tmp/jobs.db"),
    ],
)
def test_redact(url: str, shown: str) -> None:
    assert redact(url) == shown


def test_nbqueue_url_names_the_queue_when_none_is_given(
    pg_url: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("NBQUEUE_URL", pg_url)
    with nbqueue.Queue() as q:
        job = q.enqueue({"from": "the environment"})
    with nbqueue.Queue(pg_url) as q:
        assert q.get(job.id).payload == {"from": "the environment"}
    monkeypatch.delenv("NBQUEUE_URL")
    with pytest.raises(nbqueue.InvalidArgument, match="NBQUEUE_URL"):
        nbqueue.Queue()
    monkeypatch.setenv("NBQUEUE_URL", pg_url)
    done = run_cli("stats", "--json")
    assert done.returncode == 0, done.stderr
    assert '"pending": 1' in done.stdout
