"""Jobs that wait without holding a worker: for a value sent to them, for a time, for jobs.

    @q.task(max_retries=3)
    def publish(draft_id):
        draft = nbqueue.step("draft", write_draft, draft_id)
        answer = nbqueue.wait_for("review", timeout=timedelta(days=14),
                                  prompt=f"Publish {draft['title']}?", choices=["approve", "reject"])
        nbqueue.sleep("cool-off", timedelta(hours=1))
        texts = nbqueue.wait_for_jobs([translate.enqueue(draft, lang) for lang in ("de", "fr")])
        return nbqueue.step("post", post_all, texts)

    q.send(job, "review", "approve")

A wait whose answer is not there yet suspends the job: it becomes `waiting` (its lease,
worker slot and limit units released in that transaction) and the handler unwinds with
`Suspended`, a BaseException, so `except Exception` does not swallow it. When the answer
comes (a send, the deadline, the wake-up time, its jobs finishing) the job is pending again
and runs from the top: its recorded steps return their values without running, and the wait
returns its answer. So the work before a wait belongs in steps. A suspended run spends no
retry. Outside a job these are plain: `wait_for` has no one to wait for (it raises),
`sleep` sleeps, `wait_for_jobs` waits for the jobs' results.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from . import payload as payload_json
from .clock import Duration, seconds, to_us, utc_seconds
from .context import JobContext, current
from .dependencies import Outcome, When
from .errors import InvalidArgument, JobFailed, NbqueueError, WaitExpired
from .jobs import NOTEBOOK_JOB_ENV, State
from .records import Reached, Suspension, WaitSpec
from .steps import check_name
from .waiting import job_ids

_NO_DEFAULT: Any = object()


class Suspended(BaseException):
    """The job suspended in a wait: the handler unwinds, and the job runs again from the top
    when what it waits for happens. A BaseException, so `except Exception` does not catch it;
    code that catches BaseException must raise it again."""


def wait_for(
    name: str,
    timeout: Duration | None = None,
    prompt: str | None = None,
    choices: Sequence[Any] | None = None,
    default: Any = _NO_DEFAULT,
) -> Any:
    """The value sent to this job under `name` (`q.send(job, name, value)`); until one is sent,
    the job waits without holding a worker. A value sent before the job gets here is returned at
    once. With `prompt` the wait is for a person (the board's "needs you"); with `choices`,
    only those values are accepted. At the deadline (`timeout` from when the wait is first
    reached) it returns `default` if one is given, else raises `WaitExpired`.

    Raises:
        Suspended: the job now waits (let it propagate).
        WaitExpired: the deadline passed with nothing sent and no default (never retried).
        InvalidArgument: a bad name, timeout or choices, or the name used twice in one run.
        NbqueueError: called outside a job, or in a notebook job's own kernel.
    """
    timeout_us = None if timeout is None else to_us(_duration(timeout, "timeout"))
    wait = WaitSpec("event", check_name(name), _prompt(prompt), _choices(choices), timeout_us)
    context = _context("wait_for", name)
    reached = _reach(context, wait)
    if reached.outcome == "value":
        return payload_json.loads(reached.value or "null")
    assert reached.outcome == "expired"
    if default is not _NO_DEFAULT:
        return default
    raise WaitExpired(f"job {context.job.id}: the wait {name!r} expired with nothing sent and no default")


def sleep(name: str, duration: Duration) -> None:
    """Sleep `duration` durably: the first run records the wake-up time and the job waits until
    then without holding a worker; later runs return at once. Outside a job: time.sleep."""
    length = _duration(duration, "duration")
    context = current()
    if context is None:
        time.sleep(length)
        return
    _sleep(context, WaitSpec("sleep", check_name(name), timeout_us=to_us(length)))


def sleep_until(name: str, when: datetime) -> None:
    """Sleep until `when` (an aware datetime) durably, like `sleep`."""
    at = utc_seconds(when, "sleep_until's time")
    context = current()
    if context is None:
        time.sleep(max(0.0, at - time.time()))
        return
    _sleep(context, WaitSpec("sleep", check_name(name), until_us=to_us(at)))


def wait_for_jobs(jobs: Iterable[Any], when: str = "all_succeeded") -> list[Any]:
    """The results of `jobs`, in order, once they are finished as `when` says ("all_succeeded",
    or "all_done": a job that did not complete gives `Outcome(ok=False, error=...)`). Until then
    the job waits without holding a worker; if a job dies or is cancelled under all_succeeded,
    the waiting job becomes upstream_failed (requeue that job and this one waits again).
    Outside a job it blocks until they finish (`q.wait` would do the same)."""
    ids = job_ids(list(jobs) if not isinstance(jobs, int) else jobs)
    rule = When(when) if when in (When.ALL_SUCCEEDED, When.ALL_DONE) else None
    if rule is None:
        raise InvalidArgument(f"wait_for_jobs waits for 'all_succeeded' or 'all_done', not {when!r}")
    name = "jobs:" + ",".join(map(str, ids))
    context = current()
    if context is None or context.reach is None:
        raise NbqueueError(_outside("wait_for_jobs") if context is None else _no_waits(context))
    if name in context.waited:  # the same jobs twice in one run: one wait
        raise InvalidArgument(
            f"job {context.job.id} waits for jobs {', '.join(map(str, ids))} twice in one run"
        )
    context.waited.add(name)
    prompt = "jobs " + ", ".join(map(str, ids)) + ("" if rule is When.ALL_SUCCEEDED else " (all done)")
    reached = _reach(context, WaitSpec("jobs", name, prompt=prompt, jobs=tuple(ids), when=rule.value))
    results = []
    for status, value, error in payload_json.loads(reached.value or "[]"):
        if status == State.COMPLETED.value:
            results.append(None if value is None else payload_json.loads(value))
        elif rule is When.ALL_DONE:
            results.append(Outcome(ok=False, error=error))
        else:
            raise JobFailed(f"job {context.job.id} waited for a job that ended {status}")
    return results


def _sleep(context: JobContext, wait: WaitSpec) -> None:
    if context.reach is None:
        raise NbqueueError(_no_waits(context))
    _claim_name(context, wait.name)
    _reach(context, wait)


def _context(verb: str, name: str) -> JobContext:
    context = current()
    if context is None:
        raise NbqueueError(_outside(verb))
    if context.reach is None:
        raise NbqueueError(_no_waits(context))
    _claim_name(context, name)
    return context


def _claim_name(context: JobContext, name: str) -> None:
    """Steps, waits and sleeps share one namespace per job; a wait or sleep name once per run."""
    if name in context.waited:
        raise InvalidArgument(
            f"job {context.job.id} reached the wait or sleep {name!r} twice in one run: give each its "
            f"own name (in a loop: wait_for(f'reply-{{n}}'))"
        )
    context.waited.add(name)


def _reach(context: JobContext, wait: WaitSpec) -> Any:
    assert context.reach is not None
    reached = context.reach(wait)
    if note_suspension(context, wait, reached):
        raise Suspended(f"job {context.job.id} waits for {wait.name!r}")
    return reached


def note_suspension(context: JobContext, wait: WaitSpec, reached: Reached) -> bool:
    """Whether the run ends in a wait: the job waits already ("suspended", "doomed"), or its
    worker is to write the suspension (kept on the context for it)."""
    if reached.outcome == "suspend":
        assert reached.wake is not None
        context.suspension = Suspension(context.job.id, context.job.attempts, wait, reached.wake)
    context.suspended = reached.outcome in ("suspend", "suspended", "doomed")
    return context.suspended


def _outside(verb: str) -> str:
    if job := os.environ.get(NOTEBOOK_JOB_ENV):
        return (
            f"{verb} is not yet supported inside a notebook job's own kernel (job {job}): it has no "
            "job context to record waits in, as steps are not recorded there either; wait in a task "
            "that enqueues the notebook job instead"
        )
    return f"{verb} runs inside a job (a task's handler run by a worker); there is nothing to wait for here"


def _no_waits(context: JobContext) -> str:
    return (
        f"job {context.job.id} cannot wait here: waits are not yet supported inside a notebook job's own "
        "kernel (it has no job context to record them in, as steps are not recorded there either); "
        "wait in a task that enqueues the notebook job instead"
    )


def _duration(value: Duration, name: str) -> float:
    length = seconds(value, name, allow_none=False)
    assert length is not None
    if length < 0:
        raise InvalidArgument(f"{name} must not be negative, not {value!r}")
    return length


def _prompt(prompt: object) -> str | None:
    if prompt is not None and not isinstance(prompt, str):
        raise InvalidArgument(f"a wait's prompt is text, not {type(prompt).__name__}")
    return prompt


def _choices(choices: Sequence[Any] | None) -> str | None:
    if choices is None:
        return None
    if isinstance(choices, str | bytes) or not isinstance(choices, Sequence) or not choices:
        raise InvalidArgument(f"choices are a non-empty list of JSON values, not {choices!r}")
    return payload_json.dumps(list(choices), "choices")
