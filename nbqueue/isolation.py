"""Process mode: one job in a child process, killed at its timeout or when cancelled.

The child is forked, so notebook functions work too; it opens its own
connection to the queue (a forked connection must never be used) for
`nbqueue.progress()`, captures what it prints, and sends back the result as
JSON text or the traceback.
"""

from __future__ import annotations

import contextlib
import io
import multiprocessing
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

from . import payload as payload_json
from .context import JobContext, running
from .jobs import Job

Outcome = tuple[str, Any, str | None]  # (kind, value, output): ok | error | timeout | cancelled


def run_in_child(
    target: str,
    job: Job,
    fn: Callable[..., Any],
    cancel: threading.Event,
    timeout: float | None,
    on_start: Callable[[int], None] = lambda pid: None,
) -> Outcome:
    """Run `fn(*job.args, **job.kwargs)` in a child process and wait for its outcome."""
    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    context: Any = multiprocessing.get_context(method)
    receive, send = context.Pipe(duplex=False)
    child = context.Process(target=_child, args=(send, target, job, fn), daemon=True)
    child.start()
    send.close()
    on_start(child.pid or 0)
    deadline = None if timeout is None else time.monotonic() + timeout
    try:
        while True:
            if receive.poll(0.05):
                try:
                    outcome: Outcome = receive.recv()
                except EOFError:
                    outcome = ("error", _died(child), None)
                return outcome
            if not child.is_alive():
                child.join()
                if receive.poll(0):
                    continue
                return ("error", _died(child), None)
            if cancel.is_set():
                _kill(child)
                return ("cancelled", None, None)
            if deadline is not None and time.monotonic() > deadline:
                _kill(child)
                return ("timeout", f"timed out after {timeout:g} s; its process was killed", None)
    finally:
        receive.close()
        if child.is_alive():
            _kill(child)


def _died(child: Any) -> str:
    code = child.exitcode
    how = f"signal {-code}" if code is not None and code < 0 else f"exit code {code}"
    return f"the job's process ended without a result ({how})"


def _kill(child: Any) -> None:
    if child.pid is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child.pid, signal.SIGKILL)
    child.join(5)


def _child(send: Any, target: str, job: Job, fn: Callable[..., Any]) -> None:
    """In the child: run the handler with its own queue connection; report; exit at once."""
    buffer = io.StringIO()
    sys.stdout = sys.stderr = buffer
    try:
        from .queue import Queue  # noqa: PLC0415 - a fresh Queue: the parent's connections stay untouched

        queue = Queue(target)
        with running(JobContext(queue, job)):
            value = fn(*job.args, **job.kwargs)
        send.send(("ok", payload_json.dumps(value, "result"), buffer.getvalue() or None))
    except BaseException as exc:  # the job's failure, reported to the parent
        text = "".join(traceback.format_exception(exc)).rstrip()
        with contextlib.suppress(Exception):  # the pipe is gone: the parent sees the exit
            send.send(("error", text, buffer.getvalue() or None))
    finally:
        send.close()
        os._exit(0)  # no atexit handlers, no parent's threads' cleanup in the child
