"""Progress: nbqueue.progress() inside a handler, job.progress, its throttling, and q.wait's bar.

Real worker threads, real files and the real PostgreSQL server.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qs, urlsplit, urlunsplit

import pytest

import nbqueue
from nbqueue import Progress, Queue
from nbqueue import context as job_context
from tests.helpers import wait_until


def test_progress_moves_while_the_job_runs(queue: Queue) -> None:
    seen = [threading.Event() for _ in range(4)]  # seen[i]: the test has read step i

    @queue.task(name="lr.crawl")
    def crawl(pages: int) -> int:
        for i in range(1, pages + 1):
            while not seen[i].wait(0.02):  # a real loop reports often; throttling keeps a few
                nbqueue.progress(i, pages, f"page {i} of {pages}")
        return pages

    job = crawl.enqueue(3)
    observed: list[Progress | None] = [job.progress]
    try:
        with queue.worker(lease=5):
            for step in range(1, 4):
                wait_until(
                    lambda step=step: job.refresh().progress is not None and job.progress.done == step,
                    what=f"progress step {step}",
                )
                observed.append(job.progress)
                seen[step].set()
            assert job.result(timeout=10) == 3
    finally:
        for event in seen:
            event.set()
    assert observed == [None] + [Progress(i, 3, f"page {i} of 3") for i in range(1, 4)]
    assert [p.fraction for p in observed[1:] if p is not None] == [1 / 3, 2 / 3, 1.0]
    assert job.refresh().progress == Progress(3, 3, "page 3 of 3")  # the last report stays readable


def _count_progress_writes(queue: Queue) -> Callable[[], list[float]]:
    """A real trigger on the jobs table records every write of progress; returns a reader.

    The trigger names the storage's own table and columns (nbqueue_jobs.progress_done).
    """
    target = str(queue.target)
    if "://" not in target:
        with sqlite3.connect(target) as conn:
            conn.executescript(
                "CREATE TABLE lr_progress_writes (done REAL);"
                "CREATE TRIGGER lr_count_progress AFTER UPDATE OF progress_done ON nbqueue_jobs "
                "BEGIN INSERT INTO lr_progress_writes VALUES (NEW.progress_done); END;"
            )

        def read_sqlite() -> list[float]:
            with sqlite3.connect(target) as conn:
                return [row[0] for row in conn.execute("SELECT done FROM lr_progress_writes ORDER BY rowid")]

        return read_sqlite

    import psycopg

    parts = urlsplit(target)
    schema = parse_qs(parts.query)["schema"][0]
    server = urlunsplit(parts._replace(query=""))
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(f'CREATE TABLE "{schema}".lr_progress_writes (n serial, done double precision)')
        conn.execute(
            f'CREATE FUNCTION "{schema}".lr_count_progress() RETURNS trigger LANGUAGE plpgsql AS '
            f'$$ BEGIN INSERT INTO "{schema}".lr_progress_writes (done) VALUES (NEW.progress_done); '
            "RETURN NEW; END $$"
        )
        conn.execute(
            f'CREATE TRIGGER lr_count_progress AFTER UPDATE OF progress_done ON "{schema}".nbqueue_jobs '
            f'FOR EACH ROW EXECUTE FUNCTION "{schema}".lr_count_progress()'
        )

    def read_postgres() -> list[float]:
        with psycopg.connect(server) as conn:
            rows = conn.execute(f'SELECT done FROM "{schema}".lr_progress_writes ORDER BY n').fetchall()
        return [row[0] for row in rows]

    return read_postgres


def test_progress_in_a_tight_loop_is_throttled(queue: Queue) -> None:
    writes = _count_progress_writes(queue)

    @queue.task(name="lr.tight")
    def tight(n: int) -> float:
        started = time.monotonic()
        for i in range(1, n + 1):
            nbqueue.progress(i, n, "tight loop")
        return time.monotonic() - started

    job = tight.enqueue(10_000)
    queue.worker(lease=5).run_until_idle(timeout=60)
    elapsed = job.result(timeout=5)
    done = [d for d in writes() if d is not None]  # None: the claim clearing an earlier attempt's
    # The first report is written, then at most one per THROTTLE seconds, and the last one always.
    assert 2 <= len(done) <= 2 + elapsed / job_context.THROTTLE
    assert done[0] == 1 and done[-1] == 10_000
    assert done == sorted(done)
    assert job.refresh().progress == Progress(10_000, 10_000, "tight loop")


def test_progress_and_cancelled_outside_a_job_do_nothing() -> None:
    assert nbqueue.progress(1, 2, "not in a job") is None
    assert nbqueue.progress(5) is None
    assert nbqueue.cancelled() is False

    def handler(n: int) -> int:
        for i in range(n):
            nbqueue.progress(i, n)
            assert not nbqueue.cancelled()
        return n

    assert handler(3) == 3  # a plain call of a task's function works as before


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [
        (("1",), {}),
        ((None,), {}),
        ((True,), {}),
        ((float("nan"),), {}),
        ((float("inf"),), {}),
        ((1, "10"), {}),
        ((1, float("nan")), {}),
        ((1, False), {}),
        ((1, 2), {"message": 3}),
        ((1, 2), {"message": None}),
    ],
)
def test_bad_progress_arguments_are_refused(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    with pytest.raises(nbqueue.InvalidArgument):
        nbqueue.progress(*args, **kwargs)


@pytest.mark.parametrize(
    ("done", "total", "fraction"),
    [
        (3, 0, None),  # no total to divide by
        (0, 0, None),
        (3, None, None),
        (0, None, None),
        (0, 4, 0.0),
        (1, 4, 0.25),
        (2.5, 10, 0.25),
        (4, 4, 1.0),
        (5, 4, 1.0),  # clamped: past the total is done
        (-1, 4, 0.0),  # clamped: below zero is not started
    ],
)
def test_progress_fraction(done: float, total: float | None, fraction: float | None) -> None:
    progress = nbqueue.Progress(done=done, total=total)
    if fraction is None:
        assert progress.fraction is None
    else:
        assert progress.fraction == fraction


def test_wait_with_a_progress_bar_follows_a_reporting_job(queue: Queue) -> None:
    @queue.task(name="lr.steps")
    def steps(n: int) -> int:
        for i in range(n):
            nbqueue.progress(i, n, f"step {i}")
            time.sleep(0.1)
        nbqueue.progress(n, n, "all done")
        return n

    job = steps.enqueue(6)
    with queue.worker(lease=5):
        [done] = queue.wait([job], timeout=30, progress=True)
    assert done.status == "completed"
    assert done.value == 6
    assert done.progress == Progress(6, 6, "all done")
