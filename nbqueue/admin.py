"""What a person does to jobs after the fact: cancel, requeue, replay from a step, delete,
purge, trust a job another process wrote, and reload a dead notebook job with the current
file. Each checks its rules (the state machine, idempotency keys, a root cause still dead, a
signature that must verify) before it writes, and changes nothing when it refuses.

A room of the JobManager (`manager.admin`): it reads jobs through the manager (`get`,
`get_many`) and writes through the storage it is handed; signed jobs are re-signed by the
manager's `Trust`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from . import policy
from . import tasks as registry
from .errors import InvalidArgument, InvalidTransition, JobNotFound
from .jobs import FINISHED, Job, State, check_transition, from_row, listed, sources
from .options import check_id
from .payload import call_body
from .storage import Storage
from .trust import Trust

EVERY_STEP = -(2**62)  # replay from the start: forget every step


class Admin:
    """A queue's after-the-fact verbs on jobs."""

    def __init__(
        self,
        storage: Storage,
        trust: Trust,
        get: Callable[[int], Job],
        get_many: Callable[[Iterable[int]], list[Job]],
    ) -> None:
        self.storage = storage
        self.signer = trust  # not `trust`: that is the verb below
        self._get = get
        self._get_many = get_many

    def repin(self, job: Job, kwargs: dict[str, Any]) -> None:
        """Give a dead or cancelled task job new keyword arguments (a notebook job the current
        file), signed again (a fresh nonce) when its task is signed, and then only if its stored
        signature verifies: a row another process wrote or changed is not reloaded
        (InvalidTransition, nothing written) until a person trusts it (q.trust)."""
        row = self.storage.get(job.id)
        if row is None:
            raise JobNotFound(f"no job with id {job.id}")
        body = call_body(tuple(job.args), kwargs)
        task = registry.find(job.task)
        signature = None if task is not None and not task.signed else self.signer.resign(row, body)
        if signature is None and (task is None or task.signed):
            raise InvalidTransition(policy.not_reloaded(job.id))
        if not self.storage.repin(job.id, row.payload, body, signature):
            raise InvalidTransition(
                f"job {job.id} is {self._get(job.id).status.value}; "
                "only a dead or cancelled job takes new input"
            )

    def cancel(self, job_id: int) -> Job:
        """Cancel a job that has not finished; a running one's result will be refused."""
        while True:  # the job may move on (claimed, finished) between the read and the write
            job = self._get(job_id)
            check_transition(job.id, job.status, State.CANCELLED)
            if self.storage.cancel([job.id]):
                return self._get(job.id)

    def requeue(self, job_ids: Sequence[int] | None) -> int:
        """Give dead or cancelled jobs a fresh start; None: every dead job. How many moved.

        A job whose idempotency key an unfinished job holds stays where it is: with
        None silently, named by id with InvalidTransition after the others moved.
        """
        if job_ids is None:
            self._resign(self._signed_dead())
            return len(self.storage.requeue(None))
        allowed = sources(State.PENDING, "requeue")
        jobs = self._get_many(job_ids)
        for job in jobs:
            if job.status not in allowed:
                raise InvalidTransition(
                    f"job {job.id} is {job.status.value}; only dead or cancelled jobs can be requeued"
                )
            self._check_root_fixed(job)
        self._resign([job.id for job in jobs if job.signature])
        moved = self.storage.requeue(list(job_ids))
        left = sorted(set(job_ids) - set(moved))
        if left:
            raise InvalidTransition(
                f"jobs {left} were not requeued: an unfinished job holds their idempotency key "
                f"({len(moved)} other job(s) were requeued)"
            )
        return len(moved)

    def check_signed(self, jobs: Sequence[Job]) -> None:
        """Raise InvalidTransition for the first job whose stored signature does not verify (a
        reload checks every job before it writes any)."""
        for row in self.storage.get_many([job.id for job in jobs]) if jobs else ():
            if self.signer.resign(row) is None:
                raise InvalidTransition(policy.not_reloaded(row.id))

    def _resign(self, job_ids: Sequence[int]) -> None:
        """Give signed jobs about to start afresh (requeue, replay) a fresh nonce, each only if its
        signature verifies: their old nonce's run has ended, and a row that does not verify
        stays refused until a person trusts it (q.trust)."""
        for row in self.storage.get_many(job_ids) if job_ids else ():
            signature = self.signer.resign(row)
            if signature is not None:
                self.storage.sign(row.id, row.payload, signature, row.signature)

    def _signed_dead(self, page: int = 1000) -> list[int]:
        """The ids of dead jobs that carry a signature (none read when no dead job is signed)."""
        if not self.storage.task_names([State.DEAD], signed=True):
            return []
        found: list[int] = []
        for offset in range(0, 2**62, page):
            rows = self.storage.rows([State.DEAD], None, page, offset, brief=True)
            found += [row.id for row in rows if row.signature]
            if len(rows) < page:
                return found
        return found

    def _check_root_fixed(self, job: Job) -> None:
        """An upstream_failed job comes back with its root cause: requeueing it alone while that job
        is still dead or cancelled would only fail it again."""
        if job.status is not State.UPSTREAM_FAILED or job.root_cause is None:
            return
        row = self.storage.get(job.root_cause)
        root = None if row is None else listed(row)
        if root is not None and root.status in (State.DEAD, State.CANCELLED):
            raise InvalidTransition(
                f"job {job.id} failed because job {root.id} is {root.status.value}: requeue job {root.id} "
                "(its descendants come back with it)"
            )

    def replay(self, job_id: int, from_step: str | None) -> Job:
        """Forget a job's steps from `from_step` on (None: all) and run it again: a finished job
        goes back to pending (with its graph, like a requeue); a waiting one just forgets them."""
        job = self._get(job_id)
        since = EVERY_STEP
        if from_step is not None:
            finished = {step.name: step.finished_at for step in self.storage.steps(job.id)}
            if from_step not in finished:
                known = ", ".join(repr(name) for name in finished) or "none"
                raise InvalidArgument(f"job {job.id} has no step {from_step!r} (its steps: {known})")
            since = finished[from_step]
        if job.status in (State.PENDING, State.FAILED):
            self.storage.forget_steps(job.id, since)
            return self._get(job.id)
        if not job.finished:
            raise InvalidTransition(
                f"job {job.id} is {job.status.value}; replay a finished job (wait for it, or cancel it first)"
            )
        self._check_root_fixed(job)
        if job.signature:
            self._resign([job.id])
        if not self.storage.replay(job.id, since):
            raise InvalidTransition(
                f"job {job.id} was not replayed: an unfinished job holds its idempotency key"
            )
        return self._get(job.id)

    def delete(self, job_ids: Sequence[int]) -> int:
        """Delete finished jobs; refuses (and deletes nothing) if one has not finished, or if a
        job that waits for it has not."""
        for job in self._get_many(job_ids):
            if not job.finished:
                raise InvalidTransition(
                    f"job {job.id} is {job.status.value}; only finished jobs can be deleted (cancel it first)"
                )
        wanted = set(job_ids)
        children = sorted({int(c) for p, c in self.storage.edges(list(job_ids)) if int(p) in wanted})
        for child in self._get_many(children):
            if not child.finished:
                parent = next(int(p) for p, c in self.storage.edges([child.id]) if int(p) in wanted)
                raise InvalidTransition(
                    f"job {parent} cannot be deleted: job {child.id} ({child.status.value}) waits for it"
                )
        return self.storage.delete(list(job_ids))

    def purge(self, statuses: Sequence[State], older_than_us: int, limit: int | None = None) -> int:
        """Delete finished jobs in `statuses` not updated for `older_than_us` (at most `limit`)."""
        for state in statuses:
            if state not in FINISHED:
                raise InvalidArgument(
                    f"purge removes finished jobs (completed, dead, cancelled), not {state.value} ones"
                )
        return self.storage.purge(statuses, older_than_us, limit)

    def trust(self, jobs: Sequence[int | Job]) -> int:
        """Sign jobs with this user's secret (a fresh nonce), so that signed tasks run them; how
        many were signed. A Job is signed as it was read: if its row changed since (task,
        payload, queue or options), nothing is signed (InvalidTransition)."""
        rows = []
        for given in jobs:
            job_id = check_id(given.id if isinstance(given, Job) else given)
            row = self.storage.get(job_id)
            if row is None:
                raise JobNotFound(f"no job with id {job_id}")
            if row.task is None:
                raise InvalidArgument(f"job {job_id} is a raw payload job; only task jobs are signed")
            if isinstance(given, Job):
                changed = policy.changed_since(given, from_row(row))
                if changed:
                    raise InvalidTransition(
                        f"job {job_id} changed since it was read ({', '.join(changed)}); nothing was "
                        "signed: read it again (q.get) and trust what you read"
                    )
            rows.append(row)
        return sum(self.storage.sign(int(r[0]), r[4], self.signer.trusted(r), r[25]) for r in rows)
