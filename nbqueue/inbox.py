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
from collections.abc import Callable, Sequence
from typing import Any

from . import payload as payload_json
from .errors import InvalidArgument
from .jobs import Job
from .options import check_id
from .records import Reached, Suspension, WaitRow, WaitSpec
from .steps import check_name
from .storage import Storage, waits

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

    def reach(self, job: Job, wait: WaitSpec) -> Reached:
        """Reach `wait` under `job`'s claim. Read first: a value recorded or sent is returned,
        and a wait with nothing to return says "suspend" (its worker writes that with its
        batch, as it writes successes); only what must be written now (a value dropped, an
        expiry, a value sent ahead) opens a transaction here. A jobs wait whose jobs are done
        gets their (status, result, error) rows, as JSON, for `wait_for_jobs`."""
        if wait.kind != "jobs":
            found, stepped = self.storage.peek_wait(job.id, wait.name)
            if stepped:
                raise InvalidArgument(
                    f"job {job.id} has a step named {wait.name!r}: a wait needs a name of its own"
                )
            reached = waits.decide(found, wait, self.storage.now_us())
            if reached.outcome == "suspend" or (reached.outcome == "value" and found and found[0]):
                return reached
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
        return self.storage.send([(i, name, text) for i in ids], by or sender())

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
