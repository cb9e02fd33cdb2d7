"""What a Queue shows: DataFrames for people, plain rows for the tools that draw them.

`Queue` inherits these reads; the board, the CLI and the magics use them (and never the
manager behind them), so what they show is what a user can ask for too.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from . import frames, waiting
from . import tasks as registry
from .clock import to_us, utc_seconds
from .errors import InvalidArgument
from .inbox import describe, open_wait
from .jobs import Job, State
from .links import GRAPH_LIMIT
from .options import check_name, names, queue_names
from .records import StepRow, WaitRow
from .search import Search

if TYPE_CHECKING:
    import pandas as pd

    from .manager import JobManager
    from .workflows import Planned, Workflow


class Reads:
    """The reading half of a Queue (see `nbqueue.Queue`)."""

    manager: JobManager

    # -- jobs ------------------------------------------------------------------

    def get(self, job_id: int) -> Job:
        """The job with that id; raises JobNotFound."""
        return self.manager.get(job_id)

    def get_many(self, job_ids: Iterable[int]) -> list[Job]:
        """Several jobs by id, in the order given; raises JobNotFound for a missing one."""
        return self.manager.get_many(job_ids)

    def find(self, job_ids: Iterable[int]) -> dict[int, Job]:
        """The jobs of these ids that exist, by id (a damaged row as what can be read of it)."""
        return self.manager.links.found(job_ids)

    def counts(self, queue: str | None = None) -> dict[str, int]:
        """Jobs per state, every state present: {"pending": n, "running": n, ...}."""
        return self.manager.counts(None if queue is None else check_name(queue, "queue"))

    def queues(self) -> list[str]:
        """The names of the queues that hold jobs."""
        return self.manager.queues()

    def jobs(
        self,
        status: str | Sequence[str] | None = None,
        queue: str | None = None,
        limit: int = 100,
        offset: int = 0,
        brief: bool = False,
        search: str | None = None,
    ) -> list[Job]:
        """A page of jobs, newest first.

        `brief=True` reads only what a listing shows: no payload, result or output, and the
        last 2,000 characters of the error; `get(id)` then reads one job whole. `search`: only
        the jobs it finds (see `count`).
        """
        return self.manager.jobs(*page(status, queue, limit, offset), brief=brief, search=searched(search))

    def count(
        self, status: str | Sequence[str] | None = None, queue: str | None = None, search: str | None = None
    ) -> int:
        """How many jobs `jobs()` and `history()` list with these filters.

        `search` finds the job of an id ("17"; "#17" finds only it) and the jobs whose task, key, arguments,
        error, output or result hold the text, in any case (on SQLite, of ASCII letters), among
        the newest 250,000 jobs (a bounded scan: about 0.1 s, however big the queue)."""
        return self.manager.count(*page(status, queue, 0, 0)[:2], searched(search))

    def history(
        self,
        status: str | Sequence[str] | None = None,
        queue: str | None = None,
        limit: int = 1000,
        search: str | None = None,
    ) -> pd.DataFrame:
        """Jobs as a pandas DataFrame, newest first, with UTC datetimes and categories; `failures`
        counts each job's failed attempts (failed, dead, timed out or lost), so that
        ``h.groupby("task")[["attempts", "failures"]].sum()`` is the failure rate per task.
        `search`: only the jobs it finds (see `count`)."""
        rows = self.manager.rows(*page(status, queue, limit, 0), search=searched(search))
        return frames.with_failures(frames.jobs_frame(rows), self.manager.failures([int(r[0]) for r in rows]))

    def dead_since(self, when: datetime) -> int:
        """How many jobs are dead now that died after `when` (a timezone-aware datetime): what
        the board's sign counts."""
        return self.manager.dead_since(to_us(utc_seconds(when, "when")))

    def attempts(self, job: Job | int) -> pd.DataFrame:
        """Every attempt of a job, in order, one row each: attempt (int), started and finished (UTC
        datetimes; finished NaT while it runs), duration (seconds; NaN while it runs), worker,
        host, pid, outcome ("completed", "failed", "dead", "timeout", "lost", "snoozed",
        "released", "cancelled", or "running") and error (its error text, or None).

        Raises JobNotFound for a job that does not exist.
        """
        [one] = waiting.job_ids(job)
        return frames.attempts_frame(self.manager.attempts(one))

    def activity(self, minutes: int = 60) -> pd.DataFrame:
        """Runs that ended in each of the last `minutes` minutes (UTC), one row per minute, every
        minute present: index "minute" (the minute's start), columns completed, failed (ended
        failed, dead, timed out or lost) and snoozed (rescheduled by a RetryAfter or a 429, or
        released: no attempt spent). Reads only the attempts by their end time."""
        first, counts = self.manager.activity(minutes)
        return frames.activity_frame(first, minutes, counts)

    def dead_letters(self, queue: str | None = None, limit: int = 1000) -> pd.DataFrame:
        """Dead jobs as a DataFrame, with their last error, newest first."""
        return self.history(State.DEAD, queue, limit)

    def pending_per_task(self, queues: str | Sequence[str] | None = None) -> dict[str | None, int]:
        """How many pending jobs each task has in `queues` (None: all); raw payloads under None."""
        return self.manager.pending_per_task(queue_names(queues))

    def missing_tasks(self, queues: str | Sequence[str] | None = None) -> dict[str, int]:
        """Pending jobs per task that no task registered in this process runs: they wait for
        their function (after a kernel restart, define it again; a worker, --import it)."""
        return registry.missing(self.pending_per_task(queues))

    def task_names(self, status: str | Sequence[str], *, signed: bool = False) -> list[str]:
        """The task names that jobs in `status` name (with `signed`, jobs that carry a signature)."""
        return self.manager.task_names(statuses(status), signed)

    def silent_jobs(self, jobs: Iterable[Job | int]) -> set[int]:
        """The ids of the running jobs among these whose worker is gone or silent: its process on
        this host is gone, or its lease was not renewed for more than two heartbeat intervals."""
        return self.manager.lifeline.silent(jobs)

    # -- workflows -------------------------------------------------------------

    def graph(self, of: Workflow | Job | int) -> pd.DataFrame:
        """The jobs of a workflow, or every job connected to a job by `after=`, one row each:
        id, task, status, parents (a list of ids), root_cause, workflow."""
        return frames.graph_frame(self.manager.links.graph(of))

    def steps(self, job: Job | int) -> pd.DataFrame:
        """A job's durable steps (nbqueue.step), in the order they finished: step, status
        (completed or failed), attempt, started, finished, value, error."""
        [one] = waiting.job_ids(job)
        return frames.steps_frame(self.manager.journal.steps(one))

    def graph_rows(
        self, of: Workflow | Planned | Job | int, limit: int = GRAPH_LIMIT
    ) -> list[tuple[Job, list[int]]]:
        """`graph(of)` as (job, parent ids) pairs, at most `limit` jobs: what a drawing needs."""
        return self.manager.links.graph(of, limit=limit)

    def relatives(self, job: Job | int) -> tuple[list[int], list[int]]:
        """A job's parents and children (ids), read at once."""
        [one] = waiting.job_ids(job)
        return self.manager.links.relatives(one)

    def what_blocks(self, jobs: Sequence[Job]) -> dict[int, str]:
        """What each blocked or upstream_failed job among these waits for, in a few words:
        "waiting on #4 (running), #5 (pending)", or "waiting on dead #12: requeue it"."""
        return self.manager.links.what_blocks(jobs)

    def step_rows(self, job: Job | int, preview: int | None = None) -> list[StepRow]:
        """`steps(job)` as rows (name, value, error, attempt, started_at, finished_at); with
        `preview`, each value's JSON text cut to that many characters (reads no more)."""
        [one] = waiting.job_ids(job)
        if preview is None:
            return self.manager.journal.steps(one)
        return self.manager.journal.step_previews(one, preview)

    # -- jobs that wait ----------------------------------------------------------

    def waiting(self, queue: str | None = None) -> pd.DataFrame:
        """The jobs that wait (nbqueue.wait_for, sleep, wait_for_jobs), oldest first: id, task,
        queue, waits_for (text), name, kind ("event", "sleep" or "jobs"), prompt (a question for a
        person), choices, deadline (an event's, or when a sleep wakes), since (when it began)."""
        return frames.waiting_frame(self.waiting_rows(queue))

    def waiting_rows(
        self, queue: str | None = None, limit: int = 10_000
    ) -> list[tuple[Job, WaitRow | None, str]]:
        """`waiting()` as (job, its open wait, waits_for text), oldest first, at most `limit`."""
        jobs = self.manager.jobs(
            [State.WAITING], None if queue is None else check_name(queue, "queue"), limit, 0
        )
        jobs.reverse()
        rows = self.manager.inbox.waits([j.id for j in jobs])
        now = self.manager.now_us()
        found = []
        for job in jobs:
            wait = open_wait([r for r in rows if r.job_id == job.id])
            found.append((job, wait, describe(wait, now)))
        return found

    def last_items(self, jobs: Sequence[Job | int]) -> dict[int, Any]:
        """Each job's newest emitted item (`nbqueue.emit`), by id, for the jobs that emitted any."""
        return {
            i: json.loads(text) for i, text in self.manager.stream_last(waiting.job_ids(list(jobs))).items()
        }

    def waits(self, job: Job | int) -> list[WaitRow]:
        """Everything a job waited for and was sent, in the order it reached it: name, kind,
        prompt, choices, deadline, value, sent_by, sent_at, expired_at, reached_at."""
        [one] = waiting.job_ids(job)
        return self.manager.inbox.waits([one])

    # -- limits and schedules --------------------------------------------------

    def limits(self) -> pd.DataFrame:
        """Every limit: key, concurrency, rate, burst, in_flight (units running jobs hold), waiting
        (jobs), next_start_in (seconds until the rate lets one more start), paused_until, paused_why."""
        rows, waiting_per_key, now_us = self.manager.limit_rows()
        return frames.limits_frame(rows, dict(waiting_per_key), now_us)

    def schedules(self) -> pd.DataFrame:
        """The periodic schedules: those kept in the database (notebooks) and those this
        process declared (`@q.periodic`), with their next run in their own time zone."""
        return frames.schedules_frame(self.manager.periodic.rows())

    def schedule_rows(self) -> list[dict[str, Any]]:
        """`schedules()` as dicts: name, task, schedule, tz, next_run, last_run, stored, notebook,
        parameters."""
        return self.manager.periodic.rows()


def statuses(value: str | Sequence[str]) -> tuple[State, ...]:
    """State names (one or several) as States; an unknown one is refused by name."""
    out = []
    for name in names(value, "status"):
        try:
            out.append(State(name))
        except ValueError:
            valid = ", ".join(s.value for s in State)
            raise InvalidArgument(f"unknown status {name!r}; use one of {valid}") from None
    return tuple(out)


def searched(text: str | None) -> Search | None:
    """A search's text as what it looks for (None or "": no search)."""
    if text is None or (isinstance(text, str) and not text.strip()):
        return None
    return Search(text)


def page(
    status: str | Sequence[str] | None, queue: str | None, limit: int, offset: int
) -> tuple[tuple[State, ...] | None, str | None, int, int]:
    """A page request's arguments, checked."""
    if queue is not None:
        check_name(queue, "queue")
    for value, what in ((limit, "limit"), (offset, "offset")):
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**62:
            raise InvalidArgument(f"{what} must be a whole number >= 0, not {value!r}")
    return (None if status is None else statuses(status)), queue, limit, offset
