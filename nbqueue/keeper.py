"""The worker's keeper: one thread that runs chores, each on its own period.

A chore is a plug-in (Oban's engine and plugins are the model): a name, a period and what to
do. The worker hands the keeper its own chores (heartbeats, cancellations, its event loop's
health) and the queue's housekeeping made here (recovery, periodic slots, storage tidying,
retention). Every period is a setting of the worker, so a test shortens it instead of
waiting it out.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .clock import Duration, seconds, to_us
from .errors import InvalidArgument, NbqueueError
from .jobs import Job, State, Verdict

if TYPE_CHECKING:
    from .manager import JobManager

log = logging.getLogger("nbqueue.worker")

PERIODIC_EVERY = 1.0  # seconds between checks for periodic slots
RECOVER_EVERY = 2.0  # seconds between recoveries at most: expired leases, and jobs of gone processes
TIDY_EVERY = 10.0  # seconds between storage housekeeping (PostgreSQL folds its count changes)
WAKE_EVERY = 0.5  # seconds between looks for waiting jobs whose time has come
PRUNE_BATCH = 500  # jobs retention deletes per transaction
PRUNED = (State.COMPLETED,)  # retention prunes completed jobs; dead ones wait for a person


@dataclass(frozen=True, slots=True)
class Chore:
    """Something the keeper does every `every` seconds; its NbqueueError is logged, never fatal."""

    name: str
    every: float
    run: Callable[[], object]


@dataclass(frozen=True, slots=True)
class Housekeeping:
    """The periods of the queue's housekeeping, in seconds (retention None: keep every job)."""

    recover: float
    periodic: float
    tidy: float
    prune: float
    retention: float | None = None

    @classmethod
    def of(
        cls,
        lease: float,
        retention: float | None,
        recover: Duration | None,
        periodic: Duration,
        tidy: Duration,
        prune: Duration | None,
    ) -> Housekeeping:
        """The periods a worker was given, checked; recover and prune default from the lease and
        the retention."""
        return cls(
            # Often enough that a job whose worker process on this host died is back within
            # seconds, whatever the lease; an expired lease is found by the same chore.
            recover=seconds(recover, "recover_interval") or max(0.05, min(lease / 4, RECOVER_EVERY)),
            periodic=interval(periodic, "periodic_interval"),
            tidy=interval(tidy, "tidy_interval"),
            prune=(
                min(60.0, max(1.0, (retention or 0.0) / 10))
                if prune is None
                else interval(prune, "prune_interval")
            ),
            retention=retention,
        )


def interval(value: Duration, name: str) -> float:
    """A worker's period in seconds: more than nothing (a keeper chore of 0 s would spin)."""
    result = seconds(value, name, allow_none=False) or 0.0
    if result < 0.001:
        raise InvalidArgument(f"{name} must be at least 0.001 seconds, not {result:g}")
    return result


def housekeeping(
    manager: JobManager,
    periods: Housekeeping,
    tasks: Callable[[], Sequence[str] | None],
    on_dead: Callable[[Job], object],
    stopping: threading.Event,
) -> list[Chore]:
    """The queue's chores for one worker: recover lost claims (expired leases, jobs of gone
    processes), enqueue due periodic slots of the `tasks` it runs, tidy the storage, and prune
    completed jobs older than the retention. `on_dead` hears of each job recovery made dead."""

    def recover() -> None:
        for job, verdict in manager.lifeline.recover():
            if verdict is Verdict.DEAD:
                on_dead(job)

    def prune() -> None:
        assert periods.retention is not None
        age = to_us(periods.retention)
        while not stopping.is_set():  # in small batches: no long write lock
            if manager.admin.purge(PRUNED, age, limit=PRUNE_BATCH) < PRUNE_BATCH:
                return

    chores = [
        Chore("recover", periods.recover, recover),
        Chore("periodic", periods.periodic, lambda: manager.periodic.tick(tasks())),
        Chore("tidy", periods.tidy, manager.tidy),
        # Waiting jobs whose deadline or wake-up time came: pending again (within about a second).
        Chore("wake", WAKE_EVERY, manager.inbox.wake_due),
    ]
    if periods.retention is not None:
        chores.append(Chore("prune", periods.prune, prune))
    return chores


class Keeper:
    """Runs chores on their periods until `stopping` is set. Between them it sleeps until the
    next one is due, or until `watch` (called every round) says something else is: `watch`
    returns the monotonic times it wants to be called again. `wake` cuts a sleep short."""

    def __init__(
        self,
        chores: Sequence[Chore],
        stopping: threading.Event,
        wake: threading.Event,
        watch: Callable[[], list[float]],
    ) -> None:
        self.chores = list(chores)
        self.stopping = stopping
        self.wake = wake
        self.watch = watch

    def run(self) -> None:
        last = [-float("inf")] * len(self.chores)
        while not self.stopping.is_set():
            self.wake.clear()  # before reading the deadlines: a later wake-up is never lost
            for index, chore in enumerate(self.chores):
                if time.monotonic() - last[index] >= chore.every:
                    last[index] = time.monotonic()
                    try:
                        chore.run()
                    except NbqueueError:
                        log.exception("worker housekeeping failed (%s)", chore.name)
            due = [at + chore.every for at, chore in zip(last, self.chores, strict=True)]
            due += self.watch()
            self.wake.wait(max(0.0, min(due) - time.monotonic()))
