"""Which signed rows may run: one job, in its own database, for its own run (nbqueue.signing).

A job's signature covers the database's identity, a nonce, and the job's task, payload,
queue and options. The database binds each nonce to the first job that claims it and
records when that run ended (triggers, storage version 9). A claimed job of a signed task
runs only if its signature verifies here (not another user's, not altered, not written in
another database or schema, not of the first form, which bound neither), its nonce is bound
to this very job (else the row is a copy) and that run has not ended (else the row was set
back to pending behind nbqueue's back); and every parent result its arguments take
(`result_of`) was recorded by a signed run of this user, with the MAC written when it
completed. Only nbqueue's own verbs (requeue, replay, reload, trust) give a signed job a
fresh nonce, and only to a row whose signature verifies, or that a person trusted (q.trust). Jobs
without a signature pay nothing for any of this.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from . import policy, signing
from . import tasks as registry
from .jobs import JobRow, State
from .records import RunRow

Runs = Callable[[Sequence[str]], dict[str, RunRow]]  # the storage's `runs`
Vouch = Callable[[str, int, str], bool]  # the storage's `vouch`

# Positions in nbqueue.jobs.COLUMNS of what a signature covers, and of the rest read here.


def covered(row: JobRow, payload: str | None = None) -> signing.Covered:
    """What a stored job's signature covers (with `payload` instead of the stored one)."""
    return signing.Covered(
        str(row.task),
        row.payload if payload is None else payload,
        row.queue,
        row.max_retries,
        row.timeout,
        row.backoff,
        row.limits,
    )


class Writing(Protocol):
    """A job about to be written (storage.NewJob): what its signature covers."""

    task: str | None
    payload: str
    queue: str
    max_retries: int
    timeout: float | None
    backoff: str
    limits: str | None


class Trust:
    """Signs and checks one queue database's signed jobs, through the storage verbs it is given
    (the manager's: nothing above it touches storage)."""

    def __init__(self, identity: Callable[[], str], runs: Runs, vouch: Vouch) -> None:
        self._read_identity, self._runs, self._vouch = identity, runs, vouch
        self._identity: str | None = None

    @property
    def identity(self) -> str:
        """The database's identity (read once: it never changes)."""
        if self._identity is None:
            self._identity = self._read_identity()
        return self._identity

    def sign(self, new: Writing) -> str:
        """A new job's signature (a fresh nonce)."""
        assert new.task is not None
        job = signing.Covered(
            new.task, new.payload, new.queue, new.max_retries, new.timeout, new.backoff, new.limits
        )
        return signing.sign_job(self.identity, job)

    def resign(self, row: JobRow, payload: str | None = None) -> str | None:
        """A fresh signature (with `payload`, if given) for a row whose signature verifies and
        is bound to no other job; None for any other row (it stays unsigned, refused until
        trusted)."""
        if not signing.verify_job(self.identity, covered(row), row.signature):
            return None
        run = self._run_of(row)
        if run is not None and run.job_id != int(row.id):
            return None
        return signing.sign_job(self.identity, covered(row, payload))

    def _run_of(self, row: JobRow) -> RunRow | None:
        """The run its verified signature's nonce is bound to (None: no job has claimed it yet)."""
        nonce = signing.nonce_of(row.signature)
        assert nonce is not None  # a signature that verifies has one
        return self._runs([nonce]).get(nonce)

    def trusted(self, row: JobRow) -> str:
        """The signature a person who trusts a row gives it (q.trust: a fresh nonce)."""
        return signing.sign_job(self.identity, covered(row))

    def refusal(self, row: JobRow) -> str | None:
        """Why a claimed row of a signed task must not run (None: it may)."""
        signature = row.signature
        if not signing.verify_job(self.identity, covered(row), signature):
            if signing.nonce_of(signature) is None and signing.verify(row.task, row.payload, signature):
                return policy.OLD_SIGNATURE
            return policy.NOT_SIGNED
        run = self._run_of(row)  # bound by the claim's own trigger
        if run is None or run.job_id != int(row.id):
            return policy.signed_copy(None if run is None else run.job_id)
        if run.finished_at is not None:
            return policy.RUN_ENDED
        return None

    def parents_refusal(self, parents: Mapping[int, JobRow], wanted: Sequence[int]) -> str | None:
        """Why a signed job may not take these parents' results (None: each was recorded by a
        signed run of this user and is unchanged since)."""
        nonces = {p: signing.nonce_of(row.signature) for p, row in parents.items()}
        runs = self._runs([n for n in nonces.values() if n is not None])
        for parent in dict.fromkeys(wanted):
            row = parents.get(parent)
            nonce = nonces.get(parent)
            run = None if nonce is None else runs.get(nonce)
            if row is None:
                why = "is gone"
            elif row.status != State.COMPLETED.value:
                why = f"ended {row.status} (its error is not signed)"
            elif nonce is None or not signing.verify_job(self.identity, covered(row), row.signature):
                why = "is not a signed job of this user"
            elif (
                run is None
                or run.job_id != parent
                or run.result_mac != signing.vouch(self.identity, nonce, row.result)
            ):
                why = "holds a result its signed run did not record (changed since, or not vouched for)"
            else:
                continue
            return policy.untrusted_result(parent, why)
        return None

    def vouch(self, task: str | None, job_id: int, signature: str | None, result: str) -> None:
        """Record the MAC of a signed job's result on its run, so that signed children take it."""
        found = registry.find(task) if task is not None else None
        nonce = signing.nonce_of(signature)
        if found is None or not found.signed or nonce is None:
            return
        self._vouch(nonce, job_id, signing.vouch(self.identity, nonce, result))
