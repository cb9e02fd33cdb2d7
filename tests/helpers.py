"""Helpers shared by every test folder: `from tests.helpers import wait_until`.

A plain module (no fixtures): pytest puts the checkout on sys.path because tests/ is a package.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from nbqueue import Backoff, Job, Queue, cli

T = TypeVar("T")
MakeQueue = Callable[..., Queue]
QUICK_RETRY = Backoff(base=0.1, cap=0.1, jitter=0)  # a retry is due a tenth of a second later
QUICK: dict[str, Any] = {"idle_interval": 0.05}  # a worker that looks for due jobs often


def wait_until(
    condition: Callable[[], T], timeout: float = 10.0, what: str = "condition", every: float = 0.01
) -> T:
    """Poll `condition` every `every` seconds until it returns something truthy, and return that.

    Fails the test after `timeout` seconds with a message naming `what` and the last value seen.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {timeout} s (last value seen: {_short(value)})")
        time.sleep(every)


def status(q: Queue, job: Job | int) -> str:
    """A job's state as stored now."""
    return str(q.get(job if isinstance(job, int) else job.id).status)


def until_status(q: Queue, job: Job | int, state: str, timeout: float = 20.0) -> None:
    """Wait until the job is in `state` (fails the test after `timeout` seconds)."""
    job_id = job if isinstance(job, int) else job.id
    wait_until(lambda: status(q, job_id) == state, timeout, f"job {job_id} {state}")


def _short(value: Any, limit: int = 300) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


# -- processes (process mode, cancelling a child) ---------------------------------------------


def alive(pid: int) -> bool:
    """True while a process with this pid exists and has not ended (a zombie waiting to be reaped
    by whoever adopted it has ended)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"  # the state follows the (command name)


def kill_all(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def read_pids(path: Path) -> list[int]:
    if not path.exists():
        return []
    return [int(line) for line in path.read_text().splitlines() if line.strip()]


def write_pid(path: str) -> None:
    with open(path, "a") as file:
        file.write(f"{os.getpid()}\n")


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    """`nbqueue ARGS` run by nbqueue.cli.main in this process, as `subprocess.run` would report it:
    the exit status (argparse's SystemExit included), stdout and stderr (an exception a real
    process would print as a traceback fails the test here instead).

    The process-wide state the command line sets is put back: the root logger (emptied first, so
    the worker's logging.basicConfig writes to this stderr as in a fresh process), sys.path and
    the SIGINT/SIGTERM handlers. A test about the process itself (signals, the console script, a
    running worker's output) starts a real one instead.
    """
    root = logging.getLogger()
    handlers, level, path = root.handlers[:], root.level, sys.path[:]
    on_signal = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    out, err = io.StringIO(), io.StringIO()
    root.handlers = []
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                status = cli.main(list(args))
            except SystemExit as exc:
                status = 0 if exc.code is None else exc.code if isinstance(exc.code, int) else 1
    finally:
        for added in root.handlers:
            added.close()
        root.handlers[:] = handlers
        root.setLevel(level)
        sys.path[:] = path
        for number, handler in on_signal.items():
            if handler is not None:  # None: set outside Python, nothing the CLI could have changed
                signal.signal(number, handler)
    return subprocess.CompletedProcess(["nbqueue", *args], status, out.getvalue(), err.getvalue())


#: The test profile: NBQUEUE_TEST_PROFILE=fast (`make test-fast`) runs each property test at a few
#: examples (a smoke run); unset or "full" (`make test`) at its full size.
TEST_PROFILE = os.environ.get("NBQUEUE_TEST_PROFILE") or "full"
FAST_EXAMPLES = 15


def examples(full: int) -> int:
    """How many examples a property test runs: `full`, or at most FAST_EXAMPLES in the fast profile."""
    return min(full, FAST_EXAMPLES) if TEST_PROFILE == "fast" else full


def snapshot(path: Path) -> list[tuple[Any, ...]]:
    """Every row of every nbqueue table, straight from the file."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        tables = [
            r[0]
            for r in conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name LIKE 'nbqueue%' ORDER BY name"
            )
        ]
        return [(t, *row) for t in tables for row in conn.execute(f'SELECT * FROM "{t}" ORDER BY 1, 2')]
    finally:
        conn.close()


def raw_rows(target: str, backend: str, sql: str) -> list[tuple[Any, ...]]:
    """Rows read straight from the database, beside nbqueue (a connection of the test's own)."""
    if backend == "sqlite":
        conn = sqlite3.connect(f"file:{target}?mode=ro", uri=True)
        try:
            return list(conn.execute(sql).fetchall())
        finally:
            conn.close()
    server, schema = target.split("?schema=")
    import psycopg

    with psycopg.connect(server, options=f"-c search_path={schema}") as pg:
        return list(pg.execute(sql).fetchall())  # type: ignore[arg-type]


def start_app_worker(target: str, app: Any, marks: Path, log: Path) -> subprocess.Popen[bytes]:
    """`nbqueue worker TARGET --import <app>` with a short lease, in a new process: the app module
    (tests/langgraph_app.py, tests/pydantic_ai_app.py) registers its task on the queue its
    QUEUE_VAR names and marks what ran in the file its MARKS_VAR names."""
    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), env.get("PYTHONPATH")]))
    env[app.QUEUE_VAR] = target
    env[app.MARKS_VAR] = str(marks)
    command = [sys.executable, "-m", "nbqueue", "worker", target, "--import", app.__name__, "--lease", "2"]
    with open(log, "a") as out:  # a file, not a pipe: a killed child's last words are kept
        return subprocess.Popen(command, cwd=root, env=env, stdout=out, stderr=out)


def killed_then_finished(
    q: Queue, job: Any, target: str, app: Any, marks: Path, log: Path, before_kill: list[str]
) -> Any:
    """Run `job` in a worker process that kills itself mid-job (the app's code sends SIGKILL once,
    after marking `before_kill`), then in a second one that recovers and finishes it; the job as it
    ended. Both processes are stopped whatever happens."""
    first = start_app_worker(target, app, marks, log)
    second = None
    try:
        assert first.wait(60) == -signal.SIGKILL, log.read_text()
        assert marks.read_text().splitlines() == before_kill
        assert q.get(job.id).status == "running"  # its lease is held by a dead worker
        second = start_app_worker(target, app, marks, log)
        return q.wait([job], timeout=60, progress=False)[0]
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
