"""Queue: what a user holds. Tasks, enqueueing, the verbs, views and workers of one queue.

Each verb checks its arguments and hands the work to the queue's JobManager,
which decides by the rules in `nbqueue.policy` and runs the storage.
"""

from __future__ import annotations

import html
import os
import warnings
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, ParamSpec, TypeVar, Unpack, overload

from . import cells, notebooks, targets, waiting
from . import schedule as schedules
from . import tasks as registry
from .clock import Clock, Duration, seconds, to_us
from .errors import InvalidArgument
from .jobs import Job, Verdict
from .limits import Limit, parse_rate
from .manager import JobManager
from .options import JobArgs, JobOptions, check_hook, check_name, limit_units, names, queue_names
from .payload import call_body
from .periodic import Periodic
from .reads import Reads, statuses
from .retry import Backoff
from .steps import check_name as check_step_name
from .storage import ClaimRequest, Filter, open_storage
from .tasks import Task
from .worker import Worker, default_worker_id
from .workflows import FAMILY_LIMIT, Workflow

if TYPE_CHECKING:
    pass

P = ParamSpec("P")
R = TypeVar("R")


class Queue(Reads):
    """A durable job queue in one SQLite file (or a PostgreSQL database).

    Args:
        target: a file path (created if missing) or a ``postgresql://`` URL; None (or left
            out) takes the one the ``NBQUEUE_URL`` environment variable names, so a notebook
            need not hold a password. Wherever the queue is shown, a password is masked.
        backoff: the retry policy for raw payload jobs and tasks without their own.
        synchronous: ``"normal"`` survives process and kernel crashes; ``"full"``
            also fsyncs every commit, so it survives power loss.
        clock: seconds since the epoch, like ``time.time`` (inject one for tests).
        family_limit: at most this many jobs made inside one job's family (the jobs a running
            job enqueues, those they enqueue, and so on); one more raises FamilyTooLarge.
    """

    def __init__(
        self,
        target: str | os.PathLike[str] | None = None,
        *,
        backoff: Backoff | None = None,
        synchronous: Literal["normal", "full"] = "normal",
        clock: Clock | None = None,
        family_limit: int = FAMILY_LIMIT,
    ) -> None:
        if backoff is not None and not isinstance(backoff, Backoff):
            raise InvalidArgument(f"backoff must be an nbqueue.Backoff, not {type(backoff).__name__}")
        if isinstance(family_limit, bool) or not isinstance(family_limit, int) or family_limit < 1:
            raise InvalidArgument(
                f"family_limit must be a whole number of jobs, at least 1, not {family_limit!r}"
            )
        self.target = targets.resolve(target)
        #: The door to storage that the Queue, its workers and the job context share.
        self.manager = JobManager(open_storage(self.target, synchronous=synchronous), clock, backoff)
        self._workers: weakref.WeakSet[Worker] = weakref.WeakSet()  # this Queue's workers in this process
        self.manager.intake.family_limit = family_limit

    @property
    def backoff(self) -> Backoff:
        """The retry policy of raw payload jobs and of tasks that name none."""
        return self.manager.backoff

    @property
    def clock(self) -> Clock:
        """The queue's clock: seconds since the epoch."""
        return self.manager.clock

    def now(self) -> datetime:
        """The queue's current time (UTC)."""
        return self.manager.now()

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
        signed: bool = False,
        limits: Sequence[str] | Mapping[str, int] | None = None,
        retry_on: type[BaseException] | tuple[type[BaseException], ...] | None = None,
        give_up_on: type[BaseException] | tuple[type[BaseException], ...] = (),
        stream_bytes: int | None = None,
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
        signed: bool = False,
        limits: Sequence[str] | Mapping[str, int] | None = None,
        retry_on: type[BaseException] | tuple[type[BaseException], ...] | None = None,
        give_up_on: type[BaseException] | tuple[type[BaseException], ...] = (),
        stream_bytes: int | None = None,
    ) -> Any:
        """Register a function as a task: ``@q.task`` or ``@q.task(max_retries=5, ...)``.

        The name defaults to the function's module-qualified name. Registration is
        process-wide: any worker in this process runs the task, whatever Queue it works.
        `on_complete(job)` and `on_dead(job)` run in the worker after the outcome is
        committed; an error in a hook is logged, never lost silently. With `signed=True`
        the task runs only jobs that a process of this user queued (they are signed with a
        secret only this user can read); any other row naming it stays pending.

        `limits` names the limit keys its jobs hold while they run (`q.limit` sets what a
        key allows): a list, one unit each, or {key: units}. `retry_on` retries only those
        errors (others are dead at once); `give_up_on` makes those dead at once (it wins when
        both match). A snooze (`nbqueue.RetryAfter`, an HTTP 429/503 with Retry-After) applies
        whatever they say. `stream_bytes` is what a stream of its jobs (`nbqueue.emit`) keeps per
        attempt, its newest items (default 1 MiB).
        """
        options = JobOptions(
            queue=queue,
            priority=priority,
            max_retries=max_retries,
            timeout=seconds(timeout, "timeout"),
            limits=limit_units(limits) or None,
        )
        errors = error_types(retry_on, "retry_on"), error_types(give_up_on, "give_up_on") or ()
        if backoff is not None and not isinstance(backoff, Backoff):
            raise InvalidArgument("backoff must be an nbqueue.Backoff")
        hooks = check_hook(on_complete, "on_complete"), check_hook(on_dead, "on_dead")
        if stream_bytes is not None and (
            isinstance(stream_bytes, bool) or not isinstance(stream_bytes, int) or stream_bytes < 1
        ):
            raise InvalidArgument(f"stream_bytes is a whole number of bytes >= 1, not {stream_bytes!r}")

        def wrap(f: Callable[..., Any]) -> Task[Any, Any]:
            if not callable(f):
                raise InvalidArgument(f"@task decorates a function, not {f!r}")
            task_name = check_name(name if name is not None else registry.default_name(f), "task name")
            task: Task[Any, Any] = Task(
                f,
                task_name,
                self.manager.intake,
                options,
                backoff,
                on_complete=hooks[0],
                on_dead=hooks[1],
                signed=signed,
                retry_on=errors[0],
                give_up_on=errors[1],
                stream_bytes=stream_bytes,
            )
            registry.register(task)
            return task

        return wrap(fn) if fn is not None else wrap

    def periodic(
        self,
        cron: str | None = None,
        *,
        every: Duration | None = None,
        tz: str | None = None,
        name: str | None = None,
        args: Sequence[Any] = (),
        kwargs: dict[str, Any] | None = None,
        max_retries: int = 3,
        queue: str = "default",
        priority: int = 0,
        timeout: Duration | None = None,
    ) -> Callable[[Callable[P, R]], Task[P, R]]:
        """A task this queue's workers enqueue on a schedule: ``@q.periodic(cron="*/5 * * * *")``.

        Cron takes names and aliases (``"0 9 * * MON-FRI"``, ``"@daily"``) and is read in `tz`
        (an IANA name like ``"Europe/Berlin"``; UTC by default), daylight saving handled as
        cron does. Or ``every=timedelta(minutes=5)``. Each slot is enqueued exactly once however
        many workers run; slots missed while no worker ran give one job, not a burst.
        The schedule belongs to this queue: another Queue's workers never enqueue it.
        """
        plan = schedules.make(cron, every, tz)
        call_body(tuple(args), kwargs or {})  # refused before anything is registered

        def wrap(fn: Callable[P, R]) -> Task[P, R]:
            task = self.task(
                name=name, max_retries=max_retries, queue=queue, priority=priority, timeout=timeout
            )(fn)
            self.manager.periodic.add(Periodic(task, plan, tuple(args), dict(kwargs or {})))
            return task

        return wrap

    def enqueue(self, payload: Any, **options: Unpack[JobArgs]) -> Job:
        """Add a raw JSON payload job; it is durable when this returns.

        Options: queue, priority, delay or run_at, key, max_retries, timeout.
        """
        return self.manager.intake.payload(payload, options)

    def enqueue_notebook(
        self,
        path: str | os.PathLike[str],
        parameters: Mapping[str, Any] | None = None,
        *,
        outputs: str | Sequence[str] = ("ipynb",),
        output_dir: str | os.PathLike[str] | None = None,
        **options: Unpack[JobArgs],
    ) -> Job:
        """Queue a run of the notebook at `path`, in a fresh kernel, as one job.

        `parameters` are injected papermill's way (after the cell tagged ``parameters``).
        The notebook is copied into the job now: later edits do not change this run. The
        worker (started with ``allow_code=True``) writes the executed notebook, after every
        cell, to `output_dir` (default: its own folder setting) and keeps it with the job
        (`job.notebook()`); ``outputs=("ipynb", "html")`` adds an HTML export. The result
        is ``{"values": {...}, "notebook": path}`` (and ``"html"``), the values being what
        the notebook gave ``nbqueue.output(name, value)``. A cell that raises fails the
        job, naming the cell (counted from 0). Options as for `enqueue`: timeout (the
        kernel is killed), max_retries, after, limits, queue, priority, key...
        """
        kwargs = notebooks.job_kwargs(path, parameters, outputs, output_dir)
        return self.manager.intake.enqueue_call(self._notebook_task(), (), kwargs, options)

    def periodic_notebook(
        self,
        path: str | os.PathLike[str],
        cron: str | None = None,
        *,
        every: Duration | None = None,
        tz: str | None = None,
        parameters: Mapping[str, Any] | None = None,
        name: str | None = None,
        outputs: str | Sequence[str] = ("ipynb",),
        output_dir: str | os.PathLike[str] | None = None,
        queue: str | None = None,
        priority: int | None = None,
        max_retries: int | None = None,
        timeout: Duration | None = None,
    ) -> str:
        """Run a notebook on a schedule, kept in the database: ``cron="0 6 * * MON-FRI",
        tz="Europe/Berlin"`` (or ``every=``). Returns the schedule's name (default: the file's).

        The notebook is pinned now, with its parameters; declaring a name again replaces
        that schedule (with the file as it is then). Every worker started with
        ``allow_code=True`` by this user keeps it, each slot exactly once, also while the
        notebook that declared it is closed. `q.schedules()` lists it; `q.unschedule(name)`.
        """
        plan = schedules.make(cron, seconds(every, "every") if every is not None else None, tz)
        kwargs = notebooks.job_kwargs(path, parameters, outputs, output_dir)
        chosen = {"queue": queue, "priority": priority, "max_retries": max_retries, "timeout": timeout}
        options = {key: value for key, value in chosen.items() if value is not None}
        label = check_name(name if name is not None else Path(path).stem, "schedule name")
        task = self._notebook_task()
        self.manager.periodic.save(Periodic(task, plan, (), kwargs, label), options)
        return label

    def unschedule(self, name: str) -> bool:
        """Forget a schedule kept in the database; False if there was none of that name."""
        return self.manager.periodic.delete(check_name(name, "schedule name"))

    def _notebook_task(self) -> Task[Any, Any]:
        """The notebook task as registered here (a worker's, with its folder), or registered now."""
        return registry.find(notebooks.NOTEBOOK_TASK) or self.notebook_task()

    def notebook_task(self) -> Task[Any, Any]:
        """Register (again) the opt-in, signed task that runs notebook jobs, for this process's
        workers; executed notebooks go beside this queue's file unless a job names a folder."""
        return notebooks.notebook_task(self.manager.intake)

    def cell_task(self, namespace: dict[str, Any] | None = None) -> Task[Any, Any]:
        """Register the opt-in, signed task that runs queued code (``%%enqueue`` cells) in
        `namespace` (a notebook's own; default: a fresh one for each job)."""
        return cells.register_cell_task(self.manager.intake, namespace)

    def enqueue_many(self, payloads: Iterable[Any], **options: Unpack[JobArgs]) -> list[int]:
        """Add many raw payload jobs in one transaction: all are written, or none."""
        return self.manager.intake.many(payloads, options)

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
        where = Filter(queue_names(queues), None if tasks is None else tuple(names(tasks, "tasks")))
        return self.manager.claim(ClaimRequest(where, worker_id or default_worker_id(), to_us(lease_s)))

    def heartbeat(self, job: Job, lease: Duration | None = None) -> Job:
        """Extend the job's lease (by `lease` seconds, default the claim's lease)."""
        lease_s = None if lease is None else seconds(lease, "lease", allow_none=False)
        if lease_s is not None and lease_s <= 0:
            raise InvalidArgument("lease must be more than 0 seconds")
        return self.manager.heartbeat(job, None if lease_s is None else to_us(lease_s))

    def complete(self, job: Job, result: Any = None, *, output: str | None = None) -> Job:
        """Record success; the result is stored as JSON."""
        self.manager.complete(job, result, output)
        return job

    def fail(
        self, job: Job, error: str | BaseException, *, output: str | None = None, retry: bool = True
    ) -> Verdict:
        """Record a failed attempt: "retry" after its backoff, or "dead" past its last retry."""
        return self.manager.fail(job, error, output, retry)

    def release(self, job: Job) -> bool:
        """Give a claimed job back unrun (pending, no retry counted); False if lost already."""
        return self.manager.release(job)

    def recover(self) -> int:
        """Fail every job whose lease expired (a crashed worker), and every running job whose
        worker process on this host is gone (at once, without waiting for its lease): retry or
        dead by its rules."""
        return len(self.manager.lifeline.recover())

    # -- managing --------------------------------------------------------------

    def cancel(self, job_id: int | Job) -> Job:
        """Cancel a job that has not finished; a running job's result will be refused."""
        [one] = waiting.job_ids(job_id)
        return self.manager.admin.cancel(one)

    def requeue(self, job_ids: int | Job | Iterable[int | Job] | None = None, *, reload: bool = False) -> int:
        """Give dead (or cancelled) jobs a fresh start: pending, due now, retries 0.

        `None` requeues every dead job. Returns how many were requeued. A job whose
        idempotency key an unfinished job holds stays where it is (with `None`,
        silently; named by id, with InvalidTransition after the others are requeued).
        ``reload=True`` gives the named notebook jobs the notebook file as it is now (a
        notebook job otherwise runs the copy pinned when it was queued), signed again only if
        each row's signature verifies (InvalidTransition otherwise, nothing reloaded).
        """
        if reload:
            if job_ids is None:
                raise InvalidArgument("requeue(reload=True) takes the jobs to reload; name them")
            jobs = [
                j
                for j in self.manager.get_many(waiting.job_ids(job_ids))
                if j.task == notebooks.NOTEBOOK_TASK
            ]
            self.manager.admin.check_signed(jobs)  # only rows that verify are signed again: checked first
            for job in jobs:
                current = notebooks.read(job.kwargs.get("source", ""))
                self.manager.admin.repin(job, {**job.kwargs, "notebook": current})
        return self.manager.admin.requeue(None if job_ids is None else waiting.job_ids(job_ids))

    def send(self, job: Job | int, name: str, value: Any, *, by: str | None = None) -> bool:
        """Send `value` (any JSON value) to a job under `name`: what its `nbqueue.wait_for(name)`
        returns. A job waiting for it is pending at once (True); to a pending or running job the
        value is kept for its wait (False). Recorded with who sent it (`by`, else the OS user and
        host) and when.

        Raises:
            JobNotFound: no such job.
            InvalidTransition: the job has finished.
            InvalidArgument: a value was sent under that name already, the wait expired, or the
                value is not one of its choices.
        """
        [one] = waiting.job_ids(job)
        [woke] = self.manager.inbox.send([one], name, value, by)
        return woke

    def send_many(self, jobs: Iterable[Job | int], name: str, value: Any, *, by: str | None = None) -> int:
        """`send` to many jobs in one transaction (the board's "approve all like this"): all or,
        if one is refused, none. Returns how many it woke."""
        return sum(self.manager.inbox.send(waiting.job_ids(jobs), name, value, by))

    def approve(self, job_ids: int | Job | Iterable[int | Job]) -> int:
        """Deprecated: `trust` (the board's Approve now answers a person's question: `send`)."""
        warnings.warn(
            "q.approve(jobs) is now q.trust(jobs): 'approve' answers a waiting job's question (q.send)",
            DeprecationWarning,
            stacklevel=2,
        )
        return self.trust(job_ids)

    def trust(self, job_ids: int | Job | Iterable[int | Job]) -> int:
        """Sign jobs you trust with your secret, so that a signed task (a notebook's code jobs,
        `@q.task(signed=True)`) runs them although another process queued them. How many.

        Hand the Jobs you read (`q.get`): each is signed as you read it, and if its row changed
        since (task, payload, queue or options), nothing is signed (InvalidTransition). A
        job id alone signs the row as it is now."""
        many = isinstance(job_ids, Iterable) and not isinstance(job_ids, str | bytes | dict)
        items: list[object] = list(job_ids) if isinstance(job_ids, Iterable) and many else [job_ids]
        ids = waiting.job_ids(items if many else job_ids)
        return self.manager.admin.trust(
            [j if isinstance(j, Job) else i for j, i in zip(items, ids, strict=True)]
        )

    def delete(self, job_ids: int | Job | Iterable[int | Job]) -> int:
        """Delete finished (completed, dead or cancelled) jobs; returns how many."""
        return self.manager.admin.delete(waiting.job_ids(job_ids))

    def purge(
        self,
        status: str | Sequence[str] = "completed",
        older_than: Duration | None = None,
        limit: int | None = None,
    ) -> int:
        """Delete finished jobs in `status` not updated for `older_than`; returns how many.

        `limit` deletes at most that many (oldest first), for pruning in small batches.
        """
        age = seconds(older_than, "older_than") or 0.0
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
            raise InvalidArgument(f"limit must be a whole number >= 1, not {limit!r}")
        return self.manager.admin.purge(statuses(status), to_us(age), limit)

    # -- workflows -------------------------------------------------------------

    def workflow(self, name: str) -> Workflow:
        """`with q.workflow("research") as wf:` the jobs enqueued in the block are collected in
        memory (no write lock while your code runs) and written in one transaction when it ends;
        an exception in the block writes none. Then `wf.id` and `wf.jobs`."""
        return self.manager.intake.workflow(name)

    def replay(self, job: Job | int, from_step: str | None = None) -> Job:
        """Run a job again from one of its steps: that step and every step recorded after it are
        forgotten (None: all of them), so the run calls them afresh and gets the earlier ones'
        recorded values. A finished job goes back to pending (a completed one too), with the
        descendants that failed because of it; a job waiting for its run just forgets them."""
        [one] = waiting.job_ids(job)
        if from_step is not None:
            check_step_name(from_step)
        return self.manager.admin.replay(one, from_step)

    # -- limits ----------------------------------------------------------------

    def limit(
        self, key: str, *, concurrency: int | None = None, rate: str | None = None, burst: float = 0
    ) -> None:
        """Set what a limit key allows, for every worker of this queue: at most `concurrency`
        units held by running jobs, and starts spaced to `rate` ("500/m", "10/s", "2/h") with
        `burst` more at once after a quiet spell. Stored in the database.

        Raises InvalidArgument for what the claim could not compute: a rate slower than 1/h, a
        concurrency over 10^9, a burst of 10^9 or more (a job's units are under 10^9 too)."""
        limit = Limit(key, concurrency, None if rate is None else parse_rate(rate), burst)
        self.manager.define_limit(limit)

    def pause(self, key: str, duration: Duration, why: str = "paused by hand") -> None:
        """Start nothing that holds `key` for `duration` (seconds or a timedelta)."""
        span = seconds(duration, "duration", allow_none=False) or 0.0
        self.manager.pause([check_name(key, "limit key")], to_us(span), why)

    def resume(self, key: str) -> bool:
        """End a key's pause (a 429's, or one set by hand); False if it was not paused."""
        return self.manager.resume(check_name(key, "limit key"))

    # -- waiting ---------------------------------------------------------------

    def result(self, job: Job | int, timeout: float | None = None) -> Any:
        """Wait for one job and return its result; raises JobFailed if dead or cancelled."""
        return self.manager.result(job, timeout)

    def wait(
        self,
        jobs: Job | int | Iterable[Job | int] | None = None,
        timeout: float | None = None,
        progress: bool = True,
    ) -> list[Job]:
        """Block until every job is completed, dead or cancelled; returns them refreshed.

        With no jobs given, waits for every job unfinished when it was called.
        """
        ids = self.manager.unfinished_ids() if jobs is None else waiting.job_ids(jobs)
        return waiting.wait(self.manager, ids, timeout, progress)

    async def gather(self, jobs: Iterable[Job | int], timeout: float | None = None) -> list[Any]:
        """`await q.gather([a, b, c])`: their results, in order, like asyncio.gather; the caller's
        loop stays free meanwhile. JobFailed if one ended dead or cancelled."""
        return await waiting.gather(self.manager, jobs, timeout)

    # -- workers ---------------------------------------------------------------

    def worker(
        self,
        queues: str | Sequence[str] | None = None,
        concurrency: int = 1,
        lease: Duration = 60,
        **options: Any,
    ) -> Worker:
        """Background thread(s) in this process that run this queue's jobs."""
        worker = Worker(self, queues=queues, concurrency=concurrency, lease=lease, **options)
        self._workers.add(worker)
        return worker

    def held_in_batches(self) -> set[int]:
        """The jobs (ids) the database counts running that this Queue's workers in this process
        are not running: quick jobs are claimed a few at a time and their successes written
        together, so a batch holds jobs claimed ahead (each starts within 50 ms, or is given
        back) and jobs finished but not yet written (each written within 50 ms)."""
        return {job_id for worker in list(self._workers) for job_id in worker.held_in_batches()}

    def close(self) -> None:
        """Close the storage's connections."""
        self.manager.close()

    def __enter__(self) -> Queue:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"nbqueue.Queue({str(self)!r})"

    def __str__(self) -> str:
        return targets.redact(self.target)

    def _repr_html_(self) -> str:
        counts = self.counts()
        cells = "".join(
            f"<td style='text-align:center'><b>{n}</b><br>{html.escape(s)}</td>" for s, n in counts.items()
        )
        return (
            f"<table><caption>nbqueue <code>{html.escape(str(self))}</code></caption><tr>{cells}</tr></table>"
        )


def error_types(
    value: type[BaseException] | tuple[type[BaseException], ...] | None, what: str
) -> tuple[type[BaseException], ...] | None:
    """An exception class, or a tuple of them, as a tuple (None stays None)."""
    if value is None:
        return None
    found = value if isinstance(value, tuple) else (value,)
    for kind in found:
        if not (isinstance(kind, type) and issubclass(kind, BaseException)):
            raise InvalidArgument(f"{what} takes exception classes, not {kind!r}")
    return found
