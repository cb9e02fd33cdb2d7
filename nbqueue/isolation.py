"""Process mode: one job in a child process, killed at its timeout, on cancel or at stop.

Which handlers each mode can run:

- thread mode (the default) runs any callable: it is called in the worker's thread.
- process mode sends the handler to the child *by value* with cloudpickle (as Dask,
  Ray and joblib do): module functions, functions defined in a notebook or in
  `__main__`, and closures over picklable values all work. A handler that holds
  something no other process can use (it closes over, or reads as a global, an open
  socket, a lock, a database connection, a Queue...) cannot be sent: its job fails
  at once with an error that says so, and goes dead (a retry could not succeed).
  Run such a handler in thread mode, or have it open what it needs itself.

Children come from multiprocessing's fork server, a single-threaded process started
once with nbqueue preloaded that forks each child ("spawn" where there is no fork
server). The worker's own process is never forked: it has threads (a Jupyter kernel
always does), and a fork copies locks that another thread may hold, so the child
could deadlock (Python 3.12+ warns about it). As with any multiprocessing start
method but fork, a script that starts a process-mode worker does so under
`if __name__ == "__main__":`.

Trust runs one way. The parent pickles the job and the handler (it trusts itself);
the child answers in JSON only, as bytes over a pipe: progress reports, the result
as JSON text, the error's traceback text, what it printed. The parent never
unpickles anything the child sends, so a handler cannot run code in the worker;
a message that is not nbqueue's JSON fails the job.

The child starts a session of its own: a timeout, a cancel or stop kills its whole
process group, so subprocesses the handler started die with it. The child never
touches the database: `nbqueue.progress()` reports go up the pipe and the parent
records them. Durable steps (`nbqueue.step`) too: the child starts with the values
recorded before, sends each new one up, and waits until the parent has recorded it
under the lease (its answer, also JSON, comes down a second pipe) before it goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import inspect
import io
import json
import logging
import math
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from enum import StrEnum
from multiprocessing import forkserver
from typing import Any, NamedTuple

import cloudpickle

from . import errors
from . import payload as payload_json
from .capture import tail
from .context import JobContext, StepBook, running
from .errors import InvalidArgument, LeaseLost, NbqueueError
from .jobs import Job
from .policy import Errors, gives_up
from .records import Reached, WaitSpec
from .retry import RetryAfter, retry_after
from .streams import Emitter
from .suspend import note_suspension

log = logging.getLogger("nbqueue.worker")

POLL = 0.05  # seconds between looks at the cancel flag while the child runs
MAX_MESSAGE = 64 * 1024 * 1024  # a result is at most 16 MiB of JSON, plus the output's tail
EXIT_GRACE = 1.0  # seconds a child that has answered gets to exit before it is killed


class Ending(StrEnum):
    """How one run of a handler ended."""

    RETURNED = "returned"
    RAISED = "raised"
    TIMED_OUT = "timed out"
    CANCELLED = "cancelled"
    SUSPENDED = "suspended"  # it reached a wait: the job is `waiting` (nbqueue.suspend)


class Outcome(NamedTuple):
    """A handler's run: how it ended, its value (result, or error), what it printed, whether to retry."""

    ending: Ending
    value: Any = None
    output: str | None = None
    retry: bool = True  # False: a retry could not succeed (the handler cannot be sent to a child)


class _BadMessage(Exception):
    """The child sent something other than one of nbqueue's JSON messages."""


_context: Any = None
_context_lock = threading.Lock()


def _start_context() -> Any:
    """The fork server's context, its server running with nbqueue preloaded; else spawn's."""
    global _context
    with _context_lock:
        if _context is None:
            _context = multiprocessing.get_context("spawn")
            if "forkserver" in multiprocessing.get_all_start_methods():
                server = multiprocessing.get_context("forkserver")
                # "__main__" is multiprocessing's own default: a script's module is imported once
                # in the server, not again in every child.
                server.set_forkserver_preload(["__main__", "nbqueue.isolation"])
                try:
                    forkserver.ensure_running()
                    _context = server
                except OSError as exc:  # e.g. its socket's path under a deep TMPDIR is too long
                    log.warning("process mode: the fork server did not start (%s); spawning children", exc)
        return _context


def run_in_child(
    job: Job,
    fn: Callable[..., Any],
    context: JobContext,
    timeout: float | None,
    retry_on: Errors | None = None,
    give_up_on: Errors = (),
) -> Outcome:
    """Run `fn(*job.args, **job.kwargs)` in a child process and wait for its outcome; `context` is
    the parent's for the job: its cancel flag, its progress reports and its steps. The child
    decides by `retry_on` and `give_up_on` (the task's) whether its error may be retried."""
    detached = dataclasses.replace(job, _source=None)  # the child gets the job's fields, not its Queue
    cancel, steps = context.cancel, context.steps
    try:
        recorded = None if steps is None else steps.recorded()
        shipped = cloudpickle.dumps((detached, fn, recorded, retry_on, give_up_on))
    except Exception as exc:  # what cannot be pickled now never can be: no retry
        return Outcome(Ending.RAISED, _unshippable(job, f"{type(exc).__name__}: {exc}"), retry=False)
    starter = _start_context()
    receive, send = starter.Pipe(duplex=False)
    answers, answer = starter.Pipe(duplex=False)  # the parent's replies to the child's steps
    child = starter.Process(
        target=_child, args=(send, answers, shipped), name=f"nbqueue-job-{job.id}", daemon=True
    )
    outcome: Outcome | None = None
    try:
        child.start()
        send.close()
        answers.close()
        deadline = None if timeout is None else time.monotonic() + timeout  # from the child's start
        while True:
            wait = POLL if deadline is None else max(0.0, min(POLL, deadline - time.monotonic()))
            if receive.poll(wait):
                try:
                    kind, body = _decode(receive.recv_bytes(MAX_MESSAGE))
                except EOFError:
                    child.join(EXIT_GRACE)
                    return Outcome(Ending.RAISED, _died(child))
                except (OSError, _BadMessage) as exc:
                    return Outcome(Ending.RAISED, f"the job's process broke nbqueue's protocol: {exc}")
                if kind == "progress":  # recorded here; False means the claim is gone
                    if not context.report(body["done"], body["total"], body["message"]):
                        cancel.set()
                    continue
                if kind == "step":  # recorded here, under the lease, before the child goes on
                    stored = None
                    if steps is not None:
                        stored = steps.write(body["name"], body["value"], body["error"], int(body["started"]))
                    answer.send_bytes(json.dumps({"value": stored}).encode())
                    continue
                if kind == "emit":  # written here, under the lease, in order; the child learns a refusal
                    answer.send_bytes(json.dumps({"ok": _emitted(context, body["texts"])}).encode())
                    continue
                if kind == "wait":  # reached here, under the lease; the child suspends if told to
                    answer.send_bytes(json.dumps(_reach(context, body)).encode())
                    continue
                outcome = _ended(job, kind, body)
                if context.suspended:
                    return Outcome(Ending.SUSPENDED, output=outcome.output)
                return outcome
            if not child.is_alive():
                child.join()
                if receive.poll(0):
                    continue
                return Outcome(Ending.RAISED, _died(child))
            if cancel.is_set():
                return Outcome(Ending.CANCELLED)
            if deadline is not None and time.monotonic() >= deadline:
                return Outcome(Ending.TIMED_OUT, f"timed out after {timeout:g} s; its process was killed")
    finally:
        send.close()  # (already closed once the child started; a second close does nothing)
        answers.close()
        receive.close()
        answer.close()
        if outcome is not None:  # it answered: it exits at once
            child.join(EXIT_GRACE)
        if child.pid is not None and child.exitcode is None:
            kill_group(child.pid)
            child.join(5)


def kill_group(pid: int) -> None:
    """SIGKILL a child's process group (the child and what it started), or the child alone."""
    try:
        os.killpg(pid, signal.SIGKILL)  # the child leads a session of its own, so its group id is its pid
    except ProcessLookupError:  # killed before its setsid(): it has started nothing yet
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _emitted(context: JobContext, texts: list[str]) -> bool:
    """A child's items, written at once through the parent's stream; False if refused."""
    if context.emitter is None:
        return True
    try:
        for text in texts:
            context.emitter.add(text)
        context.emitter.flush()
    except LeaseLost:
        return False
    return not context.emitter.refused


def _reach(context: JobContext, body: dict[str, Any]) -> dict[str, Any]:
    """A child's wait, reached by the parent: {"outcome", "value"}, or {"error", "type"} for the
    child to raise (the same NbqueueError, by name)."""
    if context.reach is None:
        return {"error": "waits are not supported here", "type": "NbqueueError"}
    try:
        spec = WaitSpec(**{**body["wait"], "jobs": tuple(body["wait"]["jobs"])})
        reached = context.reach(spec)
    except NbqueueError as exc:
        return {"error": str(exc), "type": type(exc).__name__}
    note_suspension(context, spec, reached)
    return reached._asdict()


def _reached(answer: dict[str, Any]) -> Reached:
    """The parent's answer to a child's wait (an NbqueueError it met is raised here)."""
    if "error" in answer:
        kind = getattr(errors, str(answer["type"]), NbqueueError)
        raise (kind if isinstance(kind, type) and issubclass(kind, NbqueueError) else NbqueueError)(
            answer["error"]
        )
    return Reached(str(answer["outcome"]), answer["value"], answer["wake"])


def _ended(job: Job, kind: str, body: dict[str, Any]) -> Outcome:
    if kind == "returned":
        return Outcome(Ending.RETURNED, body["result"], body["output"])
    if kind == "raised":
        snooze = body["snooze"]
        if snooze is not None:  # a RetryAfter or an HTTP 429/503 in the child: a snooze here too
            return Outcome(Ending.RAISED, snooze, body["output"])
        return Outcome(Ending.RAISED, body["error"], body["output"], retry=not body["final"])
    return Outcome(Ending.RAISED, _unshippable(job, body["error"]), retry=False)


def _unshippable(job: Job, why: str) -> str:
    return (
        f"process mode cannot send the handler of task {job.task!r} to a child process: {why}. "
        "A process-mode handler must be picklable by cloudpickle (a module function, a notebook "
        "function, a closure over picklable values); one that holds an open socket, a lock or a "
        "database connection cannot be sent: run it in thread mode. Not retried: a retry could not succeed."
    )


def _died(child: Any) -> str:
    code = child.exitcode
    how = f"signal {-code}" if code is not None and code < 0 else f"exit code {code}"
    return f"the job's process ended without a result ({how})"


def _reject_constant(name: str) -> None:
    raise _BadMessage(f"{name} is not a number JSON allows")


def _decode(data: bytes) -> tuple[str, dict[str, Any]]:
    """One message from the child, checked field by field; never anything but JSON."""
    try:
        message = json.loads(data.decode("utf-8"), parse_constant=_reject_constant)
    except (UnicodeDecodeError, ValueError) as exc:
        raise _BadMessage(f"it sent {data[:40]!r}..., not JSON (nothing it sends is unpickled)") from exc
    kind = message.get("kind") if isinstance(message, dict) else None
    fields = {
        "progress": {"done": _number, "total": _number_or_none, "message": _text},
        "step": {"name": _text, "value": _json_or_none, "error": _text_or_none, "started": _number},
        "returned": {"result": _result, "output": _text_or_none},
        "raised": {"error": _text, "output": _text_or_none, "final": _flag, "snooze": _snooze},
        "unloadable": {"error": _text},
        "wait": {"wait": _wait},
        "emit": {"texts": _texts},
    }.get(kind)  # type: ignore[arg-type]
    if fields is None or set(message) != {"kind", *fields}:
        raise _BadMessage(f"it sent a JSON message that is not one of nbqueue's: {str(message)[:200]}")
    return str(kind), {name: check(message[name], name) for name, check in fields.items()}


def _texts(value: Any, name: str) -> list[str]:
    """A child's emitted items: a list of JSON texts, each checked."""
    if not isinstance(value, list):
        raise _BadMessage(f"{name} is not a list of items")
    return [str(_json_or_none(text, name)) for text in value]


def _wait(value: Any, name: str) -> dict[str, Any]:
    """A child's wait (a WaitSpec as a dict), its fields checked by building one."""
    if not isinstance(value, dict) or set(value) != set(WaitSpec._fields):
        raise _BadMessage(f"{name} is not a wait: {str(value)[:200]}")
    try:
        WaitSpec(**{**value, "jobs": tuple(value["jobs"])})
    except TypeError as exc:
        raise _BadMessage(f"{name} is not a wait: {exc}") from exc
    return value


def _number(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise _BadMessage(f"progress {name} is not a finite number: {value!r}")
    return float(value)


def _number_or_none(value: Any, name: str) -> float | None:
    return None if value is None else _number(value, name)


def _flag(value: Any, name: str) -> bool:
    if not isinstance(value, bool):
        raise _BadMessage(f"{name} is not true or false: {value!r}")
    return value


def _snooze(value: Any, name: str) -> RetryAfter | None:
    """The child's snooze ({seconds, reason, pause}) as a RetryAfter, or None."""
    if value is None:
        return None
    if not isinstance(value, dict) or set(value) != {"seconds", "reason", "pause"}:
        raise _BadMessage(f"{name} is not a snooze: {str(value)[:200]}")
    try:
        return RetryAfter(
            value["seconds"], _text(value["reason"], name), pause_limits=_flag(value["pause"], name)
        )
    except InvalidArgument as exc:
        raise _BadMessage(f"{name}: {exc}") from None


def _text(value: Any, name: str) -> str:
    if not isinstance(value, str):
        raise _BadMessage(f"{name} is not text: {type(value).__name__}")
    return value[:500] if name == "message" else value


def _text_or_none(value: Any, name: str) -> str | None:
    return None if value is None else _text(value, name)


def _json_or_none(value: Any, name: str) -> str | None:
    """JSON text, checked (it is stored as a step's value), or None."""
    if value is None:
        return None
    _result(value, name)
    return str(value)


def _result(value: Any, name: str) -> Any:
    try:
        return json.loads(_text(value, name), parse_constant=_reject_constant)
    except ValueError as exc:
        raise _BadMessage(f"the result is not JSON text: {exc}") from exc


def _child(send: Any, answers: Any, shipped: bytes) -> None:
    """In the child: its own session; run the handler, answering in JSON only; exit at once."""
    with contextlib.suppress(OSError):
        os.setsid()  # a group of its own: killing it takes the handler's subprocesses too
    buffer = io.StringIO()
    sys.stdout = sys.stderr = buffer

    sending, asking = threading.Lock(), threading.Lock()  # the handler's threads share the pipes

    def post(kind: str, **body: Any) -> None:
        message = json.dumps({"kind": kind, **body}, allow_nan=False).encode()
        with sending:
            send.send_bytes(message)

    try:
        try:
            job, fn, recorded, retry_on, give_up_on = cloudpickle.loads(shipped)  # from the parent
        except BaseException as exc:
            post("unloadable", error=f"loading it in the child failed: {type(exc).__name__}: {exc}")
            return

        def report(done: float, total: float | None, message: str) -> bool:
            post("progress", done=done, total=total, message=message)
            return True  # a cancelled job's child is killed by the parent

        def record(name: str, value: str | None, error: str | None, started_us: int) -> str | None:
            with asking:  # one step's question and its answer at a time
                post("step", name=name, value=value, error=error, started=started_us)
                stored: str | None = json.loads(answers.recv_bytes())["value"]  # recorded: go on
            return stored

        def reach(wait: WaitSpec) -> Reached:
            with asking:
                post("wait", wait=wait._asdict())
                return _reached(json.loads(answers.recv_bytes()))

        def send_items(items: list[tuple[int, str]], cut: bool) -> bool:
            with asking:  # written by the parent under the claim: False once it is gone
                post("emit", texts=[text for _, text in items])
                return bool(json.loads(answers.recv_bytes())["ok"])

        steps = None if recorded is None else StepBook(job.id, lambda: recorded, record)
        emitter = Emitter(job.id, send_items)
        try:
            with running(JobContext(job, report, steps=steps, reach=reach, emitter=emitter)):
                try:
                    value = fn(*job.args, **job.kwargs)
                    if inspect.iscoroutine(value):  # an async handler: its own loop in the child
                        value = asyncio.run(value)
                finally:
                    emitter.close()  # every item goes up before the outcome does
            post("returned", result=payload_json.dumps(value, "result"), output=tail(buffer.getvalue()))
        except BaseException as exc:  # the job's failure, reported to the parent
            # Decided here, where the error is still an object: the parent gets only its text.
            snooze = retry_after(exc)
            post(
                "raised",
                error=payload_json.error_text(exc),
                output=tail(buffer.getvalue()),
                final=gives_up(exc, retry_on, give_up_on),
                snooze=None
                if snooze is None
                else {"seconds": snooze.seconds, "reason": str(snooze), "pause": snooze.pause_limits},
            )
    except BaseException:  # the pipe is gone: the parent sees the exit
        pass
    finally:
        with contextlib.suppress(Exception):
            send.close()
        os._exit(0)  # no atexit handlers, no waiting for threads the handler left behind
