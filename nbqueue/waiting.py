"""Waiting for jobs: block until they finish, with a progress bar in notebooks and terminals."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

from .clock import seconds
from .errors import InvalidArgument, JobFailed, WaitTimeout
from .jobs import Job, State
from .options import check_id
from .workflows import Planned


class Watched(Protocol):
    """What waiting needs of a queue: read jobs, and sleep until something may have changed."""

    def get_many(self, job_ids: Sequence[int]) -> list[Job]:
        """The jobs, in the order given."""
        ...

    def wait_for_change(self, timeout: float) -> None:
        """Block until another writer may have committed, or timeout seconds pass."""
        ...


def job_ids(value: object) -> list[int]:
    """One job or id, or an iterable of them, as ids (a workflow's jobs too, once written)."""
    if isinstance(value, Job | Planned):
        return [value.id]
    if isinstance(value, int):
        return [check_id(value)]
    if isinstance(value, str | bytes | dict) or not isinstance(value, Iterable):
        raise InvalidArgument(f"job ids are integers (or Jobs, or a list of them), not {value!r}")
    return [v.id if isinstance(v, Job | Planned) else check_id(v) for v in value]


def wait(manager: Watched, ids: list[int], timeout: float | None, progress: bool) -> list[Job]:
    """Block until every job is completed, dead or cancelled; returns them refreshed."""
    limit = seconds(timeout, "timeout")
    deadline = None if limit is None else time.monotonic() + limit
    done: dict[int, Job] = {}
    bar = _progress_bar(len(ids)) if progress else None
    pause = 0.005
    try:
        while True:
            waiting = [i for i in ids if i not in done]
            partial = 0.0  # running jobs count by the progress they report
            for job in manager.get_many(waiting):
                if job.finished:
                    done[job.id] = job
                elif job.progress is not None and job.progress.fraction is not None:
                    partial += job.progress.fraction
                    if bar is not None and len(ids) == 1 and job.progress.message:
                        bar.set_postfix_str(job.progress.message[:40], refresh=False)
            if bar is not None:
                bar.n = round(len(done) + partial, 2)
                bar.refresh()
            if len(done) == len(ids):
                return [done[i] for i in ids]
            if deadline is not None and time.monotonic() >= deadline:
                raise WaitTimeout(f"{len(ids) - len(done)} of {len(ids)} jobs unfinished after {limit} s")
            left = 0.25 if deadline is None else max(0.0, deadline - time.monotonic())
            manager.wait_for_change(min(pause, left))
            pause = min(pause * 2, 0.25)
    finally:
        if bar is not None:
            bar.close()


def result(manager: Watched, job: Job | int, timeout: float | None) -> Any:
    """Wait for one job and return its result; raises JobFailed if it ended dead or cancelled."""
    [done] = wait(manager, job_ids(job), timeout, progress=False)
    if isinstance(job, Job):
        job.update_from(done)
    return outcome(done)


async def wait_async(manager: Watched, ids: list[int], timeout: float | None) -> list[Job]:
    """Like `wait`, for a coroutine: reads happen in a thread, so the caller's loop stays free."""
    limit = seconds(timeout, "timeout")
    deadline = None if limit is None else time.monotonic() + limit
    done: dict[int, Job] = {}
    pause = 0.005
    while True:
        waiting = [i for i in ids if i not in done]
        for job in await asyncio.to_thread(manager.get_many, waiting):
            if job.finished:
                done[job.id] = job
        if len(done) == len(ids):
            return [done[i] for i in ids]
        if deadline is not None and time.monotonic() >= deadline:
            raise WaitTimeout(f"{len(ids) - len(done)} of {len(ids)} jobs unfinished after {limit} s")
        await asyncio.sleep(pause if deadline is None else min(pause, max(0.0, deadline - time.monotonic())))
        pause = min(pause * 2, 0.25)


def outcome(job: Job) -> Any:
    """A finished job's result; JobFailed if it ended dead or cancelled."""
    if job.status is not State.COMPLETED:
        last = (job.error or "").strip().splitlines()
        reason = f": {last[-1]}" if last else ""
        raise JobFailed(f"job {job.id} is {job.status.value}{reason}", job=job)
    return job.value


async def result_async(manager: Watched, job: Job | int, timeout: float | None = None) -> Any:
    """`await job`: its result once it finishes, without blocking the caller's event loop."""
    [done] = await wait_async(manager, job_ids(job), timeout)
    if isinstance(job, Job):
        job.update_from(done)
    return outcome(done)


async def gather(manager: Watched, jobs: object, timeout: float | None = None) -> list[Any]:
    """The results of several jobs, in order, like asyncio.gather (JobFailed for the first that failed)."""
    return [outcome(job) for job in await wait_async(manager, job_ids(jobs), timeout)]


def _progress_bar(total: int) -> Any:
    from tqdm.auto import tqdm  # noqa: PLC0415 - only when a bar is wanted

    return tqdm(total=total, desc="jobs", unit="job", leave=True)
