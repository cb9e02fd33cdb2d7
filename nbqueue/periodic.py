"""Periodic schedules: the tasks a queue's workers enqueue on a schedule, declared in this
process (`@q.periodic`) or kept in the database (`q.periodic_notebook`), and the slots each has
enqueued, so that a slot is enqueued once however many workers tick.

A room of the JobManager (`manager.periodic`): it reaches the storage only through the verbs
it is handed, and makes its jobs with the manager's `new_job`, so they are encoded and signed
like any other.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from . import policy, signing
from . import schedule as schedules
from . import tasks as registry
from .clock import to_us
from .errors import NbqueueError
from .jobs import NOTEBOOK_TASK
from .options import JobOptions
from .payload import call_body
from .retry import Backoff
from .schedule import Cron, Every
from .storage import NewJob, Storage, StoredSchedule
from .tasks import Task

log = logging.getLogger("nbqueue.manager")

STORED_PREFIX = "schedule:"  # the slots of stored schedules (storage deletes them by it too)

NewJobMaker = Callable[[str | None, str, JobOptions, Backoff | None, bool], NewJob]


@dataclass(frozen=True)
class Periodic:
    """A task this queue's workers enqueue on a schedule, with fixed arguments."""

    task: Task[Any, Any]
    schedule: Every | Cron
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    name: str = ""  # a stored schedule's name ("": declared in this process, named by its task)
    options: JobOptions | None = None  # its jobs' options; None: the task's

    @property
    def slot_name(self) -> str:
        """Under which name its last slot is kept (a stored schedule's never meets a task's)."""
        return f"{STORED_PREFIX}{self.name}" if self.name else self.task.name


class Periodics:
    """A queue's periodic schedules: those declared here, those stored, and their slots."""

    def __init__(self, storage: Storage, now: Callable[[], datetime], new_job: NewJobMaker) -> None:
        self.storage = storage
        self.now = now
        self._new_job = new_job
        self.declared: dict[str, Periodic] = {}  # by task name

    def add(self, periodic: Periodic) -> None:
        """Make this queue's workers enqueue `periodic` on its schedule."""
        self.declared[periodic.task.name] = periodic

    def tick(self, names: Sequence[str] | None = None) -> list[str]:
        """Enqueue each due slot of this queue's periodic tasks (once however many workers tick)."""
        now = self.now()
        enqueued = []
        for periodic in [*self.declared.values(), *self.stored(names)]:
            task = periodic.task
            if names is not None and task.name not in names:
                continue
            last = self.storage.periodic_slot(periodic.slot_name)
            slot = policy.due_slot(periodic.schedule, now, last)
            if slot is None:
                continue
            job = None
            if slot.enqueue:
                chosen = periodic.options or task.options
                options = chosen.but({"key": f"periodic:{periodic.slot_name}:{slot.at.isoformat()}"})
                body = call_body(periodic.args, periodic.kwargs)
                job = self._new_job(task.name, body, options, task.backoff, task.signed)
            slot_us = to_us(slot.at.timestamp())
            if self.storage.periodic_advance(periodic.slot_name, last, slot_us, job) and slot.enqueue:
                enqueued.append(periodic.slot_name)
        return enqueued

    def save(self, periodic: Periodic, options: dict[str, Any]) -> None:
        """Keep a schedule in the database, so that every worker allowed its task keeps it."""
        body = call_body(periodic.args, periodic.kwargs)
        JobOptions.given(options)  # refused now, not at its first slot
        task = periodic.task.name
        signature = signing.sign(task, body) if periodic.task.signed else None
        spec = json.dumps(schedules.to_spec(periodic.schedule))
        row = StoredSchedule(periodic.name, task, body, spec, json.dumps(options), signature)
        self.storage.save_schedule(row)

    def stored(self, names: Sequence[str] | None = None) -> list[Periodic]:
        """The schedules kept in the database whose task is registered here (and in `names`).

        Stored schedules are for opt-in tasks (notebook jobs), so a worker that runs none
        of those does not read them. A signed task's schedule whose signature does not
        verify (another user's, or a row edited by hand) is skipped with a warning.
        """
        tasks = [registry.find(name) for name in (names if names is not None else registry.names())]
        if not any(task is not None and task.opt_in for task in tasks):
            return []
        found = []
        for row in self.storage.schedules():
            task = registry.find(row.task)
            if task is None or (names is not None and row.task not in names):
                continue
            if task.signed and not signing.verify(row.task, row.payload, row.signature):
                log.warning("schedule %r is not signed by this user: not run", row.name)
                continue
            try:
                body = json.loads(row.payload)
                plan = schedules.from_spec(json.loads(row.spec))
                options = task.options.but(json.loads(row.options))
            except (ValueError, TypeError, NbqueueError) as exc:
                log.warning("schedule %r cannot be read: %s", row.name, exc)
                continue
            found.append(Periodic(task, plan, tuple(body["args"]), body["kwargs"], row.name, options))
        return found

    def rows(self) -> list[dict[str, Any]]:
        """Every schedule, stored or declared here: name, task, schedule, tz, next_run and
        last_run (in its zone), stored, notebook, parameters."""
        now = self.now()
        listed: list[tuple[str, str, Every | Cron, dict[str, Any], bool]] = [
            (p.task.name, p.task.name, p.schedule, p.kwargs, False) for p in self.declared.values()
        ]
        for row in self.storage.schedules():
            try:
                plan = schedules.from_spec(json.loads(row.spec))
                kwargs = json.loads(row.payload)["kwargs"]
            except (ValueError, TypeError, KeyError, NbqueueError):
                continue  # tick() warns about it
            listed.append((row.name, row.task, plan, kwargs, True))
        rows = []
        for name, task, plan, kwargs, kept in listed:
            zone = plan.zone if isinstance(plan, Cron) else UTC
            last = self.storage.periodic_slot(f"{STORED_PREFIX}{name}" if kept else name)
            upcoming = plan.next_after(now)
            rows.append(
                {
                    "name": name,
                    "task": task,
                    "schedule": str(plan),
                    "tz": plan.tz if isinstance(plan, Cron) else "UTC",
                    "next_run": None if upcoming is None else upcoming.astimezone(zone),
                    "last_run": None
                    if last is None
                    else datetime.fromtimestamp(last / 1e6, UTC).astimezone(zone),
                    "stored": kept,
                    "notebook": kwargs.get("source") if task == NOTEBOOK_TASK else None,
                    "parameters": kwargs.get("parameters") if task == NOTEBOOK_TASK else None,
                }
            )
        return rows

    def delete(self, name: str) -> bool:
        """Forget a stored schedule; False if there was none of that name."""
        return self.storage.delete_schedule(name)
