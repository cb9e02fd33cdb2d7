"""A worker runner's batch: jobs it claimed together, and successes it has yet to write.

Quick jobs are claimed several to a transaction, and their successes are written with the
next claim: one commit for a batch of jobs instead of one per job. Each batch is sized from
how long the last one's jobs took, to last about half of HOLD; jobs of 25 ms or more go one
at a time, as a worker always took them (each success written with the next claim). A job
that turns out slow never keeps the others waiting long: the keeper writes successes and
undoes the claims of unstarted jobs (no attempt counted) once they have waited HOLD seconds.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from typing import TYPE_CHECKING, Any

from .errors import NbqueueError
from .inbox import Peek

if TYPE_CHECKING:
    from .jobs import Job
    from .manager import JobManager
    from .storage import ClaimRequest, Row

log = logging.getLogger("nbqueue.worker")

HOLD = 0.05  # seconds a written-later success or a waiting claimed job may wait at most


class Batch:
    """One runner's claimed jobs (run in claim order) and its unwritten successes.

    `lock` is held by whoever writes the batch (the runner, or the keeper settling it),
    so each success is written once and each waiting job either runs or is given back.
    """

    def __init__(self, most: int) -> None:
        self.most = most
        self.size = 1  # jobs the next claim asks for
        self.lock = threading.RLock()
        self.waiting: deque[Job] = deque()
        self.done: list[tuple[Job, Any]] = []  # each with its Completion (JobManager.completion)
        self._since: float | None = None  # when the oldest waiting job or success began to wait
        self._loaded = (0.0, 0)  # when the last claim came back, and with how many jobs
        self.peek: Peek | None = None  # the waits of the jobs claimed last, read when one needs them

    def next_job(self) -> Job | None:
        """The next claimed job to run, or None when the batch is used up."""
        with self.lock:
            return self.waiting.popleft() if self.waiting else None

    def add_done(self, job: Job, completion: Any) -> None:
        """A success to write with the next claim (or by the keeper, if that is long coming)."""
        with self.lock:
            self.done.append((job, completion))
            if self._since is None:
                self._since = time.monotonic()

    def take_done(self) -> list[tuple[Job, Any]]:
        """The unwritten successes, for the caller (holding `lock`) to write."""
        done, self.done = self.done, []
        self._since = None if not self.waiting else self._since
        return done

    def load(self, jobs: list[Job], peeked: list[Row] | None = None) -> bool:
        """Claimed jobs to run next (the caller holds `lock`); True if some must wait their turn.
        `peeked`: their waits, if read with the claim (inbox.Peek reads them otherwise).

        The size of the next claim follows how quick the jobs just run were."""
        started, count = self._loaded
        now = time.monotonic()
        if count:
            each = max(1e-6, (now - started) / count)
            self.size = max(1, min(self.most, int(HOLD / 2 / each)))
        if not jobs:  # idle: whatever comes next is taken one at a time until it proves quick
            self.size = 1
        self._loaded = (now, len(jobs))
        self.peek = Peek([job.id for job in jobs], peeked) if len(jobs) > 1 else None
        self.waiting.extend(jobs)
        if len(jobs) > 1 and self._since is None:
            self._since = now
        return len(jobs) > 1

    def overdue(self, now: float) -> bool:
        """True when a success or a waiting job has waited HOLD seconds (a slow job runs)."""
        since = self._since
        return since is not None and now - since >= HOLD

    def deadline(self) -> float | None:
        """When the keeper should look at this batch next (monotonic), if it holds anything."""
        since = self._since
        return None if since is None else since + HOLD

    def give_back(self) -> list[Job]:
        """Every waiting job, taken out to be released (the caller holds `lock`); the batch
        starts again at one job, since a job in it was slow."""
        waiting = list(self.waiting)
        self.waiting.clear()
        self._since = None if not self.done else self._since
        self.size, self._loaded = 1, (0.0, 0)
        return waiting

    def flush(
        self, manager: JobManager, then_claim: ClaimRequest | None
    ) -> tuple[list[tuple[Job, Any]], list[bool], bool]:
        """Write the successes and, with `then_claim`, claim the next jobs: one commit. The
        successes written, whether each was recorded (False: its claim was lost), and whether
        some claimed jobs wait their turn (then the keeper should watch how long)."""
        with self.lock:
            done = self.take_done()
            try:
                claims = self.size if then_claim else 0
                flags, claimed, peeked = manager.finish_batch(done, then_claim, claims)
            except BaseException:
                self.done[:0] = done  # nothing was written: they go with the next try
                raise
            return done, flags, self.load(claimed, peeked)

    def settle(
        self, manager: JobManager, overdue_at: float | None = None
    ) -> tuple[list[tuple[Job, Any]], list[bool]]:
        """Write the successes and give back the waiting jobs unrun (a slow job holds the runner,
        or the runner has ended); with `overdue_at`, only if still overdue then (the runner may
        have written them and claimed afresh meanwhile). The successes and their flags."""
        with self.lock:
            if overdue_at is not None and not self.overdue(overdue_at):
                return [], []
            done = self.take_done()
            waiting = self.give_back()
            try:
                flags = manager.finish_batch(done, None, 0)[0] if done else []
            except NbqueueError:
                log.exception("could not record the outcome of jobs %s", [job.id for job, _ in done])
                flags = [False] * len(done)
            for job in waiting:  # never started: the claim is undone, no attempt counted
                try:
                    manager.unclaim(job)
                except NbqueueError as exc:  # lost meanwhile; else its lease brings it back
                    log.warning("job %d could not be given back: %s", job.id, exc)
            return done, flags
