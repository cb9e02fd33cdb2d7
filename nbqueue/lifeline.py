"""Claims whose worker is gone: leases that expired (a crashed or hung worker), jobs claimed by
a process of this host that has died (recovered at once, not at the lease's end), and running
jobs whose worker has gone silent (the board marks them). Each recovered claim counts as a
failed attempt: retried after its backoff, or dead if it was its last.

A room of the JobManager (`manager.lifeline`); the worker's keeper runs `recover` now and then.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Sequence

from . import policy
from .errors import DamagedJob
from .jobs import Job, JobRow, State, Verdict, from_row
from .options import check_id
from .retry import Backoff
from .storage import Storage

log = logging.getLogger("nbqueue.manager")

RECOVER_BATCH = 500


def this_host() -> str:
    """This machine as a claim records it: its node name and its pid namespace, so that two
    containers of one hostname are never taken for one host (their pids mean different processes)."""
    name = os.uname().nodename
    try:
        return f"{name}/{os.stat('/proc/self/ns/pid').st_ino}"
    except OSError:  # no /proc (macOS): the node name alone
        return name


HOST = this_host()


def process_gone(pid: int | None) -> bool:
    """True only when no process `pid` exists on this host (a process of another user is alive)."""
    if pid is None or pid <= 0 or pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # PermissionError: it exists
        return False
    try:  # a zombie (dead, not yet reaped by its parent) runs nothing either
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[-1].split()[0] == b"Z"
    except (OSError, IndexError):
        return False


class Lifeline:
    """A queue's recovery of claims whose worker is gone."""

    def __init__(
        self,
        storage: Storage,
        now_us: Callable[[], int],
        backoff: Callable[[], Backoff],
        attach: Callable[[Job], Job],
    ) -> None:
        self.storage = storage
        self._now_us = now_us
        self._backoff = backoff  # the queue's default, read when used (a test may set it)
        self._attach = attach

    def recover(self) -> list[tuple[Job, Verdict]]:
        """Fail every job whose lease expired (a crashed worker): retried or dead by its rules."""
        recovered = []
        while True:
            batch = self.storage.expired(RECOVER_BATCH)
            for row in batch:
                if done := self._fail(row, policy.LEASE_EXPIRED, expired=True):
                    recovered.append(done)
            if len(batch) < RECOVER_BATCH:
                return recovered + self.recover_orphans()

    def recover_orphans(self) -> list[tuple[Job, Verdict]]:
        """Fail the running jobs claimed by a process of this host that is gone, without waiting
        for their lease (the same rule as an expired lease: retried or dead). A live process's job,
        and any job of another host, is never touched."""
        recovered = []
        for row, pid in self.storage.running_on(HOST):
            if not process_gone(pid):
                continue
            why = policy.worker_gone(pid, HOST)
            if done := self._fail(row, why, failed_as="lost"):
                log.warning("job %d recovered: %s", row.id, why)
                recovered.append(done)
        return recovered

    def _fail(
        self, row: JobRow, why: str, expired: bool = False, failed_as: str | None = None
    ) -> tuple[Job, Verdict] | None:
        """Fail a recovered claim as an attempt (retried or dead by its rules); None if another
        process settled it first, or if its row cannot be read (then it is buried)."""
        try:
            job = self._attach(from_row(row))
        except DamagedJob as exc:
            self.storage.bury(row.id, str(exc))
            return None
        failure = policy.after_failure(job, self._backoff())
        args = (job.id, job.attempts, why, job.output, failure.state, failure.delay_us)
        done = self.storage.fail(*args, expired=expired, failed_as=failed_as)
        return (job, failure.verdict) if done else None

    def silent(self, jobs: Iterable[Job | int]) -> set[int]:
        """The running jobs among these whose worker is gone or silent: its process on this host is
        gone, or its lease has not been renewed for more than two heartbeat intervals (a worker
        heartbeats every lease / 3). Jobs not running are never silent."""
        ids = sorted({check_id(getattr(j, "id", j)) for j in jobs})
        if not ids:
            return set()
        now = self._now_us()
        found = set()
        for job_id, status, host, pid, lease_until, lease_us in self.storage.claims(ids):
            if status != State.RUNNING.value:
                continue
            if host == HOST and process_gone(pid):
                found.add(int(job_id))
            elif lease_until is not None and lease_us:
                renewed = int(lease_until) - int(lease_us)
                if now - renewed > policy.SILENT_AFTER_BEATS * int(lease_us) / policy.HEARTBEATS_PER_LEASE:
                    found.add(int(job_id))
        return found

    def lost_claims(self, jobs: Sequence[Job]) -> list[int]:
        """The ids among these claims that are no longer running under that claim (cancelled, taken)."""
        if not jobs:
            return []
        current = {int(row.id): row for row in self.storage.get_many([j.id for j in jobs])}
        return [
            j.id
            for j in jobs
            if j.id not in current
            or current[j.id].status != State.RUNNING.value
            or current[j.id].attempts != j.attempts
        ]
