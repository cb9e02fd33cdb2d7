"""Queue: the one place policy lives (validation, leases, retry or dead)."""

from __future__ import annotations

import html
import json
import os
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal, ParamSpec, TypeVar, overload

from . import payload as payload_json
from . import schedule
from . import tasks as registry
from .clock import Clock, Duration, from_us, seconds, system_clock, to_us, utc_seconds
from .errors import (
    InvalidArgument,
    InvalidTransition,
    JobFailed,
    JobNotFound,
    LeaseLost,
    PayloadError,
    WaitTimeout,
)
from .jobs import FINISHED, Job, State, check_transition, sources
from .retry import Backoff
from .storage import ClaimRequest, Filter, NewJob, open_storage
from .tasks import Task

if TYPE_CHECKING:
    import pandas as pd

    from .worker import Worker

RECOVER_BATCH = 500
P = ParamSpec("P")
R = TypeVar("R")


class Queue:
    """A durable job queue in one SQLite file (or a PostgreSQL database).

    Args:
        target: a file path (created if missing) or a ``postgresql://`` URL.
        backoff: the retry policy for raw payload jobs and tasks without their own.
        synchronous: ``"normal"`` survives process and kernel crashes; ``"full"``
            also fsyncs every commit, so it survives power loss.
        clock: seconds since the epoch, like ``time.time`` (inject one for tests).
    """

    def __init__(
        self,
        target: str | os.PathLike[str],
        *,
        backoff: Backoff | None = None,
        synchronous: Literal["normal", "full"] = "normal",
        clock: Clock | None = None,
    ) -> None:
        if backoff is not None and not isinstance(backoff, Backoff):
            raise InvalidArgument(f"backoff must be an nbqueue.Backoff, not {type(backoff).__name__}")
        self.target = os.fspath(target) if isinstance(target, os.PathLike) else target
        self.backoff = backoff or Backoff()
        self.clock: Clock = clock or system_clock
        self.storage = open_storage(self.target, synchronous=synchronous)
        self._default_backoff = payload_json.dumps(self.backoff.to_dict(), "backoff")

    # -- time ------------------------------------------------------------------

    def _now(self) -> int | None:
        """The time to hand to storage: None lets a server backend use its own clock."""
        if self.clock is system_clock and self.storage.server_clock:
            return None
        return to_us(self.clock())

    def _clock_us(self) -> int:
        """The current time as a number, from the same clock storage uses."""
        now = self._now()
        if now is None:
            now = self.storage.now()
        return now if now is not None else to_us(self.clock())

    def now(self) -> datetime:
        """The queue's current time (UTC)."""
        return from_us(self._clock_us())  # type: ignore[return-value]

    # -- producing -------------------------------------------------------------

    @overload
    def task(self, fn: Callable[P, R], /) -> Task[P, R]: ...

    @overload
    def task(
        self,
        fn: None = None,
        /,
        *,
        name: str | None = None,
        max_retries: int = 3,
        backoff: Backoff | None = None,
        queue: str = "default",
        priority: int = 0,
        timeout: Duration | None = None,
        on_complete: Callable[[Job], object] | None = None,
        on_dead: Callable[[Job], object] | None = None,
    ) -> Callable[[Callable[P, R]], Task[P, R]]: ...

    def task(
        self,
        fn: Callable[..., Any] | None = None,
        /,
        *,
        name: str | None = None,
        max_retries: int = 3,
        backoff: Backoff | None = None,
        queue: str = "default",
        priority: int = 0,
        timeout: Duration | None = None,
        on_complete: Callable[[Job], object] | None = None,
        on_dead: Callable[[Job], object] | None = None,
    ) -> Any:
        """Register a function as a task: ``@q.task`` or ``@q.task(max_retries=5, ...)``.

        The name defaults to the function's module-qualified name. Registration is
        process-wide: any worker in this process runs the task, whatever Queue it works.
        `on_complete(job)` and `on_dead(job)` run in the worker after the outcome is
        committed; an error in a hook is logged, never lost silently.
        """

        def wrap(f: Callable[..., Any]) -> Task[Any, Any]:
            if not callable(f):
                raise InvalidArgument(f"@task decorates a function, not {f!r}")
            task_name = name if name is not None else registry.default_name(f)
            _check_name(task_name, "task name")
            _check_name(queue, "queue")
            if backoff is not None and not isinstance(backoff, Backoff):
                raise InvalidArgument("backoff must be an nbqueue.Backoff")
            task: Task[Any, Any] = Task(
                fn=f,
                name=task_name,
                queue=self,
                max_retries=_check_retries(max_retries),
                backoff=backoff,
                queue_name=queue,
                priority=_check_priority(priority),
                timeout=seconds(timeout, "timeout"),
                on_complete=_check_hook(on_complete, "on_complete"),
                on_dead=_check_hook(on_dead, "on_dead"),
            )
            registry.register(task)
            return task

        return wrap(fn) if fn is not None else wrap

    def periodic(
        self,
        cron: str | None = None,
        *,
        every: Duration | None = None,
        name: str | None = None,
        args: Sequence[Any] = (),
        kwargs: dict[str, Any] | None = None,
        max_retries: int = 3,
        queue: str = "default",
        priority: int = 0,
        timeout: Duration | None = None,
    ) -> Callable[[Callable[P, R]], Task[P, R]]:
        """A task its workers enqueue on a schedule: ``@q.periodic(cron="*/5 * * * *")``.

        Or ``every=timedelta(minutes=5)``. Each slot is enqueued exactly once however
        many workers run; slots missed while no worker ran give one job, not a burst.
        """
        plan = schedule.make(cron, every)
        payload_json.dumps(list(args), "args")  # refused before anything is registered
        payload_json.dumps(kwargs or {}, "kwargs")

        def wrap(fn: Callable[P, R]) -> Task[P, R]:
            task = self.task(
                name=name, max_retries=max_retries, queue=queue, priority=priority, timeout=timeout
            )(fn)
            registry.register_periodic(registry.Periodic(task, plan, tuple(args), dict(kwargs or {})))
            return task

        return wrap

    def _tick_periodic(self, names: Sequence[str] | None = None) -> list[str]:
        """Enqueue the due slot of each periodic task (the worker calls this every second)."""
        now_us = self._clock_us()
        moment = from_us(now_us)
        assert moment is not None
        enqueued = []
        for periodic in registry.periodics():
            task = periodic.task
            if names is not None and task.name not in names:
                continue
            slot = periodic.schedule.latest(moment)
            if slot is None:
                continue
            body = payload_json.dumps({"args": list(periodic.args), "kwargs": periodic.kwargs}, "arguments")
            new = self._new_job(
                task.name,
                body,
                task.queue_name,
                task.max_retries,
                None,
                None,
                task.priority,
                f"periodic:{task.name}:{slot.isoformat()}",
                task.timeout,
                payload_json.dumps((task.backoff or self.backoff).to_dict(), "backoff"),
            )
            if self.storage.periodic(task.name, to_us(slot.timestamp()), new, self._now()):
                enqueued.append(task.name)
        return enqueued

    def enqueue(
        self,
        payload: Any,
        *,
        queue: str = "default",
        max_retries: int = 3,
        delay: Duration | None = None,
        run_at: datetime | None = None,
        priority: int = 0,
        key: str | None = None,
        timeout: Duration | None = None,
    ) -> Job:
        """Add a raw JSON payload job; it is durable when this returns."""
        new = self._new_job(
            None,
            payload_json.dumps(payload, "payload"),
            queue,
            max_retries,
            delay,
            run_at,
            priority,
            key,
            timeout,
            self._default_backoff,
        )
        return self._insert_one(new)

    def enqueue_many(
        self,
        payloads: Iterable[Any],
        *,
        queue: str = "default",
        max_retries: int = 3,
        delay: Duration | None = None,
        run_at: datetime | None = None,
        priority: int = 0,
    ) -> list[int]:
        """Add many raw payload jobs in one transaction: all are written, or none."""
        if isinstance(payloads, str | bytes | dict) or not isinstance(payloads, Iterable):
            raise InvalidArgument("enqueue_many takes an iterable of payloads (for one, use enqueue)")
        first = self._new_job(
            None, "null", queue, max_retries, delay, run_at, priority, None, None, self._default_backoff
        )
        news = [
            NewJob(
                first.queue,
                None,
                payload_json.dumps(p, f"payloads[{i}]"),
                first.priority,
                None,
                first.max_retries,
                first.delay_us,
                None,
                first.backoff,
                first.run_at_us,
            )
            for i, p in enumerate(payloads)
        ]
        if not news:
            return []
        return [job_id for job_id, _ in self.storage.insert(news, self._now())]

    def _enqueue_task(
        self,
        task: Task[Any, Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        *,
        delay: Duration | None = None,
        run_at: datetime | None = None,
        priority: int | None = None,
        key: str | None = None,
        queue: str | None = None,
        max_retries: int | None = None,
        timeout: Duration | None = None,
    ) -> Job:
        for name in kwargs:
            if not isinstance(name, str):
                raise InvalidArgument(f"keyword argument names must be strings, not {name!r}")
        try:
            body = payload_json.dumps({"args": list(args), "kwargs": kwargs}, "arguments")
        except PayloadError:
            # Name the argument at fault, as the caller wrote it.
            for i, value in enumerate(args):
                payload_json.dumps(value, f"args[{i}]")
            for name, value in kwargs.items():
                payload_json.dumps(value, f"kwargs[{name!r}]")
            raise
        backoff = task.backoff or self.backoff
        new = self._new_job(
            task.name,
            body,
            task.queue_name if queue is None else queue,
            task.max_retries if max_retries is None else max_retries,
            delay,
            run_at,
            task.priority if priority is None else priority,
            key,
            task.timeout if timeout is None else timeout,
            payload_json.dumps(backoff.to_dict(), "backoff"),
        )
        return self._insert_one(new)

    def _new_job(
        self,
        task: str | None,
        body: str,
        queue: str,
        max_retries: int,
        delay: Duration | None,
        run_at: datetime | None,
        priority: int,
        key: str | None,
        timeout: Duration | None,
        backoff: str,
    ) -> NewJob:
        _check_name(queue, "queue")
        if key is not None:
            _check_name(key, "key")
        delay_s = seconds(delay, "delay")
        run_at_us = None
        if run_at is not None:
            if delay_s is not None:
                raise InvalidArgument("give delay or run_at, not both")
            run_at_us = to_us(utc_seconds(run_at, "run_at"))
        return NewJob(
            queue=queue,
            task=task,
            payload=body,
            priority=_check_priority(priority),
            key=key,
            max_retries=_check_retries(max_retries),
            delay_us=to_us(delay_s or 0.0),
            run_at_us=run_at_us,
            timeout=seconds(timeout, "timeout"),
            backoff=backoff,
        )

    def _insert_one(self, new: NewJob) -> Job:
        now = self._now()
        [(job_id, created)] = self.storage.insert([new], now)
        if not created or now is None:  # a held key's job, or server time: read it back
            return self.get(job_id)
        stamp = from_us(now)
        assert stamp is not None
        return self._attach(
            Job(
                id=job_id,
                status=State.PENDING,
                queue=new.queue,
                task=new.task,
                payload=json.loads(new.payload),
                priority=new.priority,
                key=new.key,
                retries=0,
                max_retries=new.max_retries,
                attempts=0,
                error=None,
                run_at=from_us(new.run_at_us)
                if new.run_at_us is not None  # type: ignore[arg-type]
                else stamp + timedelta(microseconds=new.delay_us),
                created_at=stamp,
                updated_at=stamp,
                timeout=new.timeout,
                backoff=json.loads(new.backoff),
            )
        )

    # -- consuming -------------------------------------------------------------

    def claim(
        self,
        queues: str | Sequence[str] | None = None,
        worker_id: str | None = None,
        lease: Duration = 300,
        tasks: Sequence[str] | None = None,
    ) -> Job | None:
        """Atomically take the best due job (or None), leased for `lease` seconds."""
        lease_s = seconds(lease, "lease", allow_none=False)
        if not lease_s:
            raise InvalidArgument("lease must be more than 0 seconds")
        where = Filter(_queues(queues), None if tasks is None else tuple(tasks))
        return self._claim(ClaimRequest(where, worker_id or default_worker_id(), to_us(lease_s)))

    def _claim(self, request: ClaimRequest) -> Job | None:
        job = self.storage.claim(*request, self._now())
        return self._attach(job) if job else None

    def heartbeat(self, job: Job, lease: Duration | None = None) -> Job:
        """Extend the job's lease (by `lease` seconds, default the claim's lease)."""
        self._check_claim(job, None)
        lease_s = None if lease is None else seconds(lease, "lease", allow_none=False)
        if lease_s is not None and lease_s <= 0:
            raise InvalidArgument("lease must be more than 0 seconds")
        lease_us = None if lease_s is None else to_us(lease_s)
        until = self.storage.heartbeat(job.id, job.attempts, lease_us, self._now())
        if until is None:
            raise self._lease_lost(job, "heartbeat")
        job.lease_until = from_us(until)
        return job

    def complete(self, job: Job, result: Any = None, *, output: str | None = None) -> Job:
        """Record success; the result is stored as JSON."""
        self._complete(job, result, output, None)
        return job

    def _complete(
        self, job: Job, result: Any, output: str | None, then_claim: ClaimRequest | None
    ) -> Job | None:
        """Complete `job` and optionally claim the next one in the same commit (the worker's path)."""
        self._check_claim(job, State.COMPLETED)
        text = payload_json.dumps(result, "result")
        output = payload_json.text(_output(output))
        now = self._now()
        done, following = self.storage.complete(job.id, job.attempts, text, output, now, then_claim)
        if not done:
            raise self._lease_lost(job, "complete")
        job.status, job.result_json, job.output = State.COMPLETED, text, output
        job.finished_at = job.updated_at = from_us(now if now is not None else to_us(time.time()))  # type: ignore[assignment]
        job.lease_until = None
        return self._attach(following) if following else None

    def fail(
        self,
        job: Job,
        error: str | BaseException,
        *,
        output: str | None = None,
        retry: bool = True,
    ) -> Literal["retry", "dead"]:
        """Record a failed attempt: retried after its backoff, or dead past its last retry."""
        self._check_claim(job, State.FAILED)
        text = payload_json.text(_error_text(error)) or ""
        output = payload_json.text(_output(output))
        status, delay = self._verdict(job, retry)
        if not self.storage.fail(job.id, job.attempts, text, output, status, delay, self._now()):
            raise self._lease_lost(job, "fail")
        return "retry" if status is State.FAILED else "dead"

    def release(self, job: Job) -> bool:
        """Give a claimed job back unrun (pending, no retry counted); False if lost already."""
        self._check_claim(job, State.PENDING)
        return self.storage.release(job.id, job.attempts, self._now())

    def recover(self) -> int:
        """Fail every job whose lease expired (a crashed worker): retry or dead by its rules."""
        return len(self._recover())

    def _recover(self) -> list[tuple[Job, State]]:
        """Recover expired leases; each recovered job with the state it moved to."""
        recovered = []
        while True:
            now = self._now()
            batch = self.storage.expired(now, RECOVER_BATCH)
            for job in batch:
                status, delay = self._verdict(job, retry=True)
                if self.storage.fail(
                    job.id,
                    job.attempts,
                    "lease expired (the worker stopped heartbeating: crashed, killed or hung)",
                    job.output,
                    status,
                    delay,
                    now,
                    expired=True,
                ):
                    recovered.append((self._attach(job), status))
            if len(batch) < RECOVER_BATCH:
                return recovered

    def _verdict(self, job: Job, retry: bool) -> tuple[State, int]:
        retry_number = job.retries + 1
        if not retry or retry_number > job.max_retries:
            return State.DEAD, 0
        policy = Backoff.from_dict(job.backoff) if job.backoff else self.backoff
        return State.FAILED, to_us(policy.delay(retry_number))

    def _check_claim(self, job: Job, target: State | None) -> None:
        """The job must be a claim (running); target=None just checks that."""
        if not isinstance(job, Job):
            raise InvalidArgument(f"expected a Job (from claim()), not {type(job).__name__}")
        if target is None and job.status is not State.RUNNING:
            raise InvalidTransition(f"job {job.id} is {job.status.value}, not a running claim")
        if target is not None:
            check_transition(job.id, job.status, target)

    def _lease_lost(self, job: Job, verb: str) -> LeaseLost:
        current = self.storage.get(job.id)
        if current is None:
            why = "the job was deleted"
        elif current.status is not State.RUNNING:
            why = f"the job is now {current.status.value}"
        elif current.attempts != job.attempts:
            why = f"the job was claimed again (attempt {current.attempts}, this claim {job.attempts})"
        else:
            why = "the lease expired"
        return LeaseLost(f"cannot {verb} job {job.id}: {why}; nothing was changed")

    # -- managing --------------------------------------------------------------

    def get(self, job_id: int) -> Job:
        """The job with that id; raises JobNotFound."""
        job = self.storage.get(_check_id(job_id))
        if job is None:
            raise JobNotFound(f"no job with id {job_id}")
        return self._attach(job)

    def get_many(self, job_ids: Iterable[int]) -> list[Job]:
        """Several jobs by id, in the order given; raises JobNotFound for a missing one."""
        ids = [_check_id(i) for i in job_ids]
        found = {job.id: job for job in self.storage.get_many(ids)}
        missing = [i for i in ids if i not in found]
        if missing:
            raise JobNotFound(f"no job with id {missing[0]}")
        return [self._attach(found[i]) for i in ids]

    def cancel(self, job_id: int | Job) -> Job:
        """Cancel a job that has not finished; a running job's result will be refused."""
        job_id = _job_id(job_id)
        while True:  # the job may move on (claimed, finished) between the read and the write
            job = self.get(job_id)
            check_transition(job.id, job.status, State.CANCELLED)
            if self.storage.transition(
                [job_id], sources(State.CANCELLED, "cancel"), State.CANCELLED, self._now()
            ):
                return self.get(job_id)

    def requeue(self, job_ids: int | Job | Iterable[int | Job] | None = None) -> int:
        """Give dead (or cancelled) jobs a fresh start: pending, due now, retries 0.

        `None` requeues every dead job. Returns how many were requeued. A job whose
        idempotency key an unfinished job holds stays where it is (with `None`,
        silently; named by id, with InvalidTransition after the others are requeued).
        """
        allowed = sources(State.PENDING, "requeue")
        if job_ids is None:
            return len(self.storage.transition(None, (State.DEAD,), State.PENDING, self._now()))
        ids = _id_list(job_ids)
        for job in self.get_many(ids):
            if job.status not in allowed:
                raise InvalidTransition(
                    f"job {job.id} is {job.status.value}; only dead or cancelled jobs can be requeued"
                )
        moved = self.storage.transition(ids, allowed, State.PENDING, self._now())
        left = sorted(set(ids) - set(moved))
        if left:
            raise InvalidTransition(
                f"jobs {left} were not requeued: an unfinished job holds their idempotency key "
                f"({len(moved)} other job(s) were requeued)"
            )
        return len(moved)

    def delete(self, job_ids: int | Job | Iterable[int | Job]) -> int:
        """Delete finished (completed, dead or cancelled) jobs; returns how many."""
        ids = _id_list(job_ids)
        for job in self.get_many(ids):
            if not job.finished:
                raise InvalidTransition(
                    f"job {job.id} is {job.status.value}; only finished jobs can be deleted (cancel it first)"
                )
        return self.storage.delete(ids, FINISHED)

    def purge(
        self,
        status: str | Sequence[str] = "completed",
        older_than: Duration | None = None,
        limit: int | None = None,
    ) -> int:
        """Delete finished jobs in `status` not updated for `older_than`; returns how many.

        `limit` deletes at most that many (oldest first), for pruning in small batches.
        """
        statuses = _statuses(status)
        for s in statuses:
            if s not in FINISHED:
                raise InvalidArgument(
                    f"purge removes finished jobs (completed, dead, cancelled), not {s.value} ones"
                )
        age = seconds(older_than, "older_than") or 0.0
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
            raise InvalidArgument(f"limit must be a whole number >= 1, not {limit!r}")
        return self.storage.purge(statuses, to_us(age), self._now(), limit)

    def counts(self, queue: str | None = None) -> dict[str, int]:
        """Jobs per state, every state present: {"pending": n, "running": n, ...}."""
        if queue is not None:
            _check_name(queue, "queue")
        return self.storage.counts(queue)

    def queues(self) -> list[str]:
        """The names of the queues that hold jobs."""
        return self.storage.queues()

    def jobs(
        self,
        status: str | Sequence[str] | None = None,
        queue: str | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> list[Job]:
        """A page of jobs, newest first."""
        if queue is not None:
            _check_name(queue, "queue")
        for value, what in ((limit, "limit"), (offset, "offset")):
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**62:
                raise InvalidArgument(f"{what} must be a whole number >= 0, not {value!r}")
        statuses = None if status is None else _statuses(status)
        return [self._attach(j) for j in self.storage.rows(statuses, queue, limit, offset)]

    def history(
        self, status: str | Sequence[str] | None = None, queue: str | None = None, limit: int = 1000
    ) -> pd.DataFrame:
        """Jobs as a pandas DataFrame, newest first, with UTC datetimes and categories."""
        from .jupyter.frames import jobs_frame  # noqa: PLC0415 - pandas loads only when asked for

        return jobs_frame(self.jobs(status, queue, limit))

    def dead_letters(self, queue: str | None = None, limit: int = 1000) -> pd.DataFrame:
        """Dead jobs as a DataFrame, with their last error, newest first."""
        return self.history(State.DEAD, queue, limit)

    # -- waiting ---------------------------------------------------------------

    def result(self, job: Job | int, timeout: float | None = None) -> Any:
        """Wait for one job and return its result; raises JobFailed if dead or cancelled."""
        [done] = self.wait([job], timeout=timeout, progress=False)
        if isinstance(job, Job):
            for name in Job.__slots__:  # type: ignore[attr-defined]
                setattr(job, name, getattr(done, name))
        if done.status is not State.COMPLETED:
            last = (done.error or "").strip().splitlines()
            reason = f": {last[-1]}" if last else ""
            raise JobFailed(f"job {done.id} is {done.status.value}{reason}", job=done)
        return done.value

    def wait(
        self,
        jobs: Job | int | Iterable[Job | int],
        timeout: float | None = None,
        progress: bool = True,
    ) -> list[Job]:
        """Block until every job is completed, dead or cancelled; returns them refreshed."""
        ids = _id_list(jobs)
        limit = seconds(timeout, "timeout")
        deadline = None if limit is None else time.monotonic() + limit
        done: dict[int, Job] = {}
        bar = _progress_bar(len(ids)) if progress else None
        pause = 0.005
        try:
            while True:
                waiting = [i for i in ids if i not in done]
                partial = 0.0  # running jobs count by the progress they report
                for job in self.get_many(waiting):
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
                self.storage.wait_for_change(min(pause, left))
                pause = min(pause * 2, 0.25)
        finally:
            if bar is not None:
                bar.close()

    # -- workers ---------------------------------------------------------------

    def worker(
        self,
        queues: str | Sequence[str] | None = None,
        concurrency: int = 1,
        lease: Duration = 60,
        **options: Any,
    ) -> Worker:
        """Background thread(s) in this process that run this queue's jobs."""
        from .worker import Worker  # noqa: PLC0415 - worker imports queue

        return Worker(self, queues=queues, concurrency=concurrency, lease=lease, **options)

    def close(self) -> None:
        """Close the storage's connections."""
        self.storage.close()

    def __enter__(self) -> Queue:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"nbqueue.Queue({self.target!r})"

    def _repr_html_(self) -> str:
        counts = self.counts()
        cells = "".join(
            f"<td style='text-align:center'><b>{n}</b><br>{html.escape(s)}</td>" for s, n in counts.items()
        )
        return (
            f"<table><caption>nbqueue <code>{html.escape(str(self.target))}</code></caption>"
            f"<tr>{cells}</tr></table>"
        )

    def _attach(self, job: Job) -> Job:
        job._queue = self
        return job


# -- argument checks (each names what was wrong) -----------------------------------


def default_worker_id() -> str:
    """host:pid:thread, so a lease names who holds it."""
    return f"{os.uname().nodename}:{os.getpid()}:{threading.get_ident() % 100000}:{uuid.uuid4().hex[:6]}"


def _check_name(value: object, what: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise InvalidArgument(f"{what} must be a non-empty string, not {value!r}")
    if len(value) > 1000 or "\x00" in value:
        raise InvalidArgument(f"{what} must be under 1000 characters with no NUL byte")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidArgument(f"{what} {value!r} is not valid unicode text (a lone surrogate)") from None
    return value


def _check_hook(hook: Callable[[Job], object] | None, what: str) -> Callable[[Job], object] | None:
    if hook is not None and not callable(hook):
        raise InvalidArgument(f"{what} must be a function taking the Job, not {hook!r}")
    return hook


def _check_priority(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(f"priority must be an integer, not {value!r}")
    if not -(2**62) < value < 2**62:
        raise InvalidArgument(f"priority {value} is out of range")
    return value


def _check_retries(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidArgument(f"max_retries must be a whole number >= 0, not {value!r}")
    if value > 1000:
        raise InvalidArgument(f"max_retries {value} is more than 1000")
    return value


def _check_id(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(f"job ids are integers, not {value!r}")
    if not 0 < value < 2**63:  # no job can have it
        raise JobNotFound(f"no job with id {value}")
    return value


def _job_id(value: Job | int) -> int:
    return value.id if isinstance(value, Job) else _check_id(value)


def _id_list(value: object) -> list[int]:
    """One job or id, or an iterable of them, as ids."""
    if isinstance(value, int | Job):
        return [_job_id(value)]
    if isinstance(value, str | bytes | dict) or not isinstance(value, Iterable):
        raise InvalidArgument(f"job ids are integers (or Jobs, or a list of them), not {value!r}")
    return [_job_id(v) for v in value]


def _names(value: object, what: str) -> list[Any]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, bytes | dict) or not isinstance(value, Iterable):
        raise InvalidArgument(f"{what} must be a name or a list of names, not {value!r}")
    return list(value)


def _queues(value: str | Sequence[str] | None) -> tuple[str, ...] | None:
    if value is None:
        return None
    names = _names(value, "queues")
    if not names:
        raise InvalidArgument("queues must name at least one queue (or be None for every queue)")
    return tuple(dict.fromkeys(_check_name(q, "queue") for q in names))


def _statuses(value: str | Sequence[str]) -> tuple[State, ...]:
    names = _names(value, "status")
    out = []
    for name in names:
        try:
            out.append(State(name))
        except ValueError:
            valid = ", ".join(s.value for s in State)
            raise InvalidArgument(f"unknown status {name!r}; use one of {valid}") from None
    return tuple(out)


def _output(output: object) -> str | None:
    if output is not None and not isinstance(output, str):
        raise InvalidArgument(f"output must be text, not {type(output).__name__}")
    return output


def _error_text(error: str | BaseException) -> str:
    if isinstance(error, BaseException):
        return "".join(traceback.format_exception(error)).rstrip()
    if not isinstance(error, str):
        raise InvalidArgument(f"error must be a string or an exception, not {type(error).__name__}")
    return error


def _progress_bar(total: int) -> Any:
    from tqdm.auto import tqdm  # noqa: PLC0415 - only when a bar is wanted

    return tqdm(total=total, desc="jobs", unit="job", leave=True)
