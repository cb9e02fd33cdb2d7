"""What jobs wait for and what is sent to them: a room of the JobManager (`manager.inbox`).

A running job reaches a wait through `reach` (its context's, nbqueue.suspend); a person or
a program answers with `send` (one) or `send_many` (many, in one transaction); workers move
the jobs whose deadline or wake-up time has come back to pending (`wake_due`, a keeper
chore); views read `waits` and `describe` them.
"""

from __future__ import annotations

import functools
import getpass
import json
import os
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from . import payload as payload_json
from .errors import InvalidArgument
from .jobs import Job
from .options import check_id
from .records import Reached, Suspension, WaitRow, WaitSpec
from .steps import check_name
from .storage import Storage, waits
from .storage.statements import Row

if TYPE_CHECKING:
    from .context import StepBook

WAKE_BATCH = 500  # waiting jobs moved to pending per transaction


@functools.cache  # (the user database is read once: it costs as much as a send's commit)
def sender() -> str:
    """Who sends, when `by=` is not given: the OS user and host ("ada@lab-3")."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no user name for this uid (a container)
        user = str(os.getuid())
    return f"{user}@{os.uname().nodename}"


class Inbox:
    """A queue's waits: reached by running jobs, answered by sends, woken by time."""

    def __init__(self, storage: Storage, get_many: Callable[[Sequence[int]], list[Job]]) -> None:
        self.storage = storage
        self._get_many = get_many
        # The tasks whose jobs reached a wait in this process: a batch of their jobs reads its
        # waits with its claim. Replaced, never changed, so a reader needs no lock.
        self.waiting_tasks: frozenset[str] = frozenset()

    def reach(
        self, job: Job, wait: WaitSpec, peek: Peek | None = None, steps: StepBook | None = None
    ) -> Reached:
        """Reach `wait` under `job`'s claim. Read first (from `peek`, the rows of the jobs
        claimed with it, if given): a value recorded or sent is returned, and a wait with nothing
        to return says "suspend" (its worker writes that with its batch, as it writes
        successes); only what must be written now (a value dropped, an expiry, a value sent
        ahead) opens a transaction here. A jobs wait whose jobs are done gets their (status,
        result, error) rows, as JSON, for `wait_for_jobs`. `steps`: the run's step book (a step
        it recorded may not share the wait's name)."""
        if job.task is not None and job.task not in self.waiting_tasks:
            self.waiting_tasks |= {job.task}
        if wait.kind != "jobs":
            rows = None if peek is None else peek.rows(self.storage, job.id)
            found: waits.Found | None = None
            stepped = steps is not None and wait.name in steps.written
            for row in self.storage.peek_waits([job.id]) if rows is None else rows:
                if row[1] == wait.name:
                    if row[2] == "step":
                        stepped = True
                    else:
                        found = row[2:]
            if stepped:
                raise InvalidArgument(
                    f"job {job.id} has a step named {wait.name!r}: a wait needs a name of its own"
                )
            reached = waits.decide(found, wait, self.storage.now_us)
            if reached.outcome == "suspend" or (reached.outcome == "value" and found and found[0]):
                return reached
        if peek is not None:  # what it writes now makes its rows as read before out of date
            peek.forget(job.id)
        reached = self.storage.reach_wait(job.id, job.attempts, wait)
        if reached.outcome != "done":
            return reached
        done = self._get_many(list(wait.jobs))
        return Reached("value", json.dumps([[j.status.value, j.result_json, j.error] for j in done]))

    def send(self, jobs: Sequence[Job | int], name: str, value: Any, by: str | None = None) -> list[bool]:
        """Send `value` (JSON) to each job under `name`, in one transaction; in id order, True for
        each job it woke (one waiting for it), False for one it was kept for (pending or running)."""
        check_name(name)
        text = payload_json.dumps(value, f"the value sent as {name!r}")
        if by is not None and (not isinstance(by, str) or not by.strip()):
            raise InvalidArgument(f"by= names who sends: non-empty text, not {by!r}")
        # In id order: two sends of many jobs lock them in one order, so they never deadlock.
        ids = sorted({check_id(j.id if isinstance(j, Job) else j) for j in jobs})
        if not ids:
            return []
        return self.storage.send(ids, name, text, by or sender())

    def suspend(self, suspensions: Sequence[Suspension]) -> list[bool]:
        """Write runs' suspensions (not in a worker's batch: an async job's) in one transaction."""
        return self.storage.suspend(suspensions)

    def waits(self, job_ids: Sequence[int]) -> list[WaitRow]:
        """What these jobs wait for and were sent, in the order they reached it."""
        return self.storage.waits([check_id(i) for i in job_ids])

    def wake_due(self) -> int:
        """Move the waiting jobs whose deadline or wake-up time has come to pending."""
        woken = 0
        while len(batch := self.storage.wake_due(WAKE_BATCH)) == WAKE_BATCH:
            woken += len(batch)
        return woken + len(batch)

    def until_next_wake(self) -> float | None:
        """Seconds until a waiting job wakes by itself (None: none does by time); the jobs due
        already are moved to pending first (then 0.0)."""
        wakes = self.storage.next_wake()
        if wakes is None:
            return None
        now = self.storage.now_us()
        if wakes <= now:
            self.wake_due()
            return 0.0
        return (wakes - now) / 1e6


class Peek:
    """The waits and steps of jobs claimed together, read once for all of them when the first
    reaches a wait, or with their claim when their task is known to wait (`rows`, on SQLite):
    one read per batch where each job read its own. What was read stays right
    while the claims live, but for what a job writes itself (its steps: StepBook.written; a
    wait written in its own transaction: the job reads afresh after) and values sent since: a
    wait that saw none suspends, and its suspension, written with the batch, finds the value
    and makes the job pending again at once."""

    def __init__(self, job_ids: Sequence[int], rows: Sequence[Row] | None = None) -> None:
        self.job_ids = list(job_ids)
        self._fresh = set(self.job_ids)  # the jobs whose rows as read are still right
        self._rows: dict[int, list[Row]] | None = None if rows is None else _by_job(rows)
        self._lock = threading.Lock()

    def rows(self, storage: Storage, job_id: int) -> list[Row] | None:
        """The rows of `job_id` (storage.peek_waits), read for the whole group on first use;
        None once they may be out of date (read afresh)."""
        with self._lock:
            if job_id not in self._fresh:
                return None
            if self._rows is None:
                self._rows = _by_job(storage.peek_waits(self.job_ids))
            return self._rows.get(job_id, [])

    def forget(self, job_id: int) -> None:
        """The job writes its waits: its rows as read no longer count."""
        with self._lock:
            self._fresh.discard(job_id)


def _by_job(rows: Sequence[Row]) -> dict[int, list[Row]]:
    by_job: dict[int, list[Row]] = {}
    for row in rows:
        by_job.setdefault(int(row[0]), []).append(row)
    return by_job


def open_wait(rows: Sequence[WaitRow]) -> WaitRow | None:
    """The wait a waiting job is in: the last one it reached that has no answer yet."""
    open_rows = [r for r in rows if r.kind is not None and r.value is None and r.expired_at is None]
    return open_rows[-1] if open_rows else None


def describe(row: WaitRow | None, now_us: int) -> str:
    """A wait as text: "review: a person is asked 'Publish?', answer within 13 d", "sleep
    cool-off, wakes in 52 min", "jobs 5, 6"."""
    if row is None:
        return "waiting"
    if row.kind == "jobs":
        return row.prompt or row.name
    if row.kind == "sleep":
        return f"sleep {row.name}, wakes in {span(((row.deadline or now_us) - now_us) / 1e6)}"
    who = f"a person is asked {row.prompt!r}" if row.prompt else "a value sent to it (q.send)"
    if row.choices:
        who += f" ({' or '.join(map(json.dumps, json.loads(row.choices)))})"
    due = "" if row.deadline is None else f", answer within {span((row.deadline - now_us) / 1e6)}"
    return f"{row.name}: {who}{due}"


def span(seconds: float) -> str:
    """A time ahead in the fewest characters: "4 s", "3 min", "5 h", "13 d"."""
    seconds = max(0.0, seconds)
    for size, unit in ((86400, "d"), (3600, "h"), (60, "min")):
        if seconds >= size:
            return f"{seconds / size:.0f} {unit}"
    return f"{seconds:.0f} s"
