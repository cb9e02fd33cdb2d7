"""Process mode: one job in a child process, killed at its timeout or when cancelled.

The child is forked, so notebook functions work too. It never touches the
database (SQLite state inherited across a fork must not be used): its
`nbqueue.progress()` reports go up the pipe and the parent records them; it
captures what it prints and sends back the result as JSON text or the traceback.
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
from enum import StrEnum
from typing import Any, NamedTuple

from . import payload as payload_json
from .context import JobContext, running
from .jobs import Job


class Ending(StrEnum):
    """How one run of a handler ended."""

    RETURNED = "returned"
    RAISED = "raised"
    TIMED_OUT = "timed out"
    CANCELLED = "cancelled"


class Outcome(NamedTuple):
    """A handler's run: how it ended, its value (result, or error text) and what it printed."""

    ending: Ending
    value: Any = None
    output: str | None = None


def run_in_child(
    job: Job,
    fn: Callable[..., Any],
    cancel: threading.Event,
    timeout: float | None,
    on_progress: Callable[[float, float | None, str], bool],
) -> Outcome:
    """Run `fn(*job.args, **job.kwargs)` in a child process and wait for its outcome."""
    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    context: Any = multiprocessing.get_context(method)
    receive, send = context.Pipe(duplex=False)
    child = context.Process(target=_child, args=(send, job, fn), daemon=True)
    child.start()
    send.close()
    deadline = None if timeout is None else time.monotonic() + timeout
    try:
        while True:
            if receive.poll(0.05):
                try:
                    message = receive.recv()
                except EOFError:
                    return Outcome(Ending.RAISED, _died(child))
                if message[0] == "progress":  # recorded here; False means the claim is gone
                    if not on_progress(*message[1:]):
                        cancel.set()
                    continue
                return Outcome(Ending(message[0]), *message[1:])
            if not child.is_alive():
                child.join()
                if receive.poll(0):
                    continue
                return Outcome(Ending.RAISED, _died(child))
            if cancel.is_set():
                _kill(child)
                return Outcome(Ending.CANCELLED)
            if deadline is not None and time.monotonic() > deadline:
                _kill(child)
                return Outcome(Ending.TIMED_OUT, f"timed out after {timeout:g} s; its process was killed")
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


def _child(send: Any, job: Job, fn: Callable[..., Any]) -> None:
    """In the child: run the handler, progress going up the pipe; report; exit at once."""
    buffer = io.StringIO()
    sys.stdout = sys.stderr = buffer

    def report(done: float, total: float | None, message: str) -> bool:
        send.send(("progress", done, total, message))
        return True  # a cancelled job's child is killed by the parent

    try:
        with running(JobContext(job, report)):
            value = fn(*job.args, **job.kwargs)
        send.send((Ending.RETURNED.value, payload_json.dumps(value, "result"), buffer.getvalue() or None))
    except BaseException as exc:  # the job's failure, reported to the parent
        text = "".join(traceback.format_exception(exc)).rstrip()
        with contextlib.suppress(Exception):  # the pipe is gone: the parent sees the exit
            send.send((Ending.RAISED.value, text, buffer.getvalue() or None))
    finally:
        send.close()
        os._exit(0)  # no atexit handlers, no parent's threads' cleanup in the child
