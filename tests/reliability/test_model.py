"""A stateful property test: the Queue API, step by step, against a plain-Python model.

Hypothesis drives a real queue through random sequences of enqueue, claim,
complete, fail, heartbeat, release, clock moves (forwards and backwards), recover,
requeue and cancel. The model is the contract written out in a few lines of
Python; after every step the queue's counts, every job's fields and every change
of state must agree with it.

It runs on both backends: each example gets a fresh SQLite file, or a fresh
PostgreSQL schema (dropped afterwards). The queue is given a ManualClock on both,
so time is the test's own even where the server has a clock of its own.

The quick run is 150 examples of 30 steps on SQLite and 50 on PostgreSQL, where
each example costs a schema's creation and migration and every step a few round
trips to the server (about 6 times slower per example). NBQUEUE_SOAK=N runs
600 x N examples of 60 steps on each backend.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

import nbqueue
from nbqueue import Job
from nbqueue.clock import from_us, to_us
from tests import templates
from tests.helpers import examples

PENDING, RUNNING, COMPLETED, FAILED, DEAD, CANCELLED = (
    "pending",
    "running",
    "completed",
    "failed",
    "dead",
    "cancelled",
)
STATES = (PENDING, RUNNING, COMPLETED, FAILED, DEAD, CANCELLED)
QUEUES = ("a", "b")
BASE, CAP = 2, 60

# The contract's state machine, written out independently of nbqueue.jobs.TRANSITIONS.
LEGAL = {
    (PENDING, RUNNING),
    (FAILED, RUNNING),
    (RUNNING, COMPLETED),
    (RUNNING, FAILED),
    (RUNNING, DEAD),
    (RUNNING, PENDING),
    (RUNNING, CANCELLED),
    (PENDING, CANCELLED),
    (FAILED, CANCELLED),
    (DEAD, PENDING),
    (CANCELLED, PENDING),
}
UNFINISHED = (PENDING, FAILED, RUNNING)

SOAK = int(os.environ.get("NBQUEUE_SOAK", "0") or 0)
QUICK_EXAMPLES = {"sqlite": 150, "postgres": 50}

#: Makes one example's storage: the Queue target, and how to remove it afterwards.
Place = Callable[[], tuple[str, Callable[[], None]]]


@dataclass
class Model:
    """What the contract says one job looks like."""

    id: int
    queue: str
    priority: int
    key: str | None
    max_retries: int
    run_at: int  # microseconds, like storage
    state: str = PENDING
    retries: int = 0
    attempts: int = 0
    lease_until: int | None = None
    lease_us: int = 0
    error: str | None = None


def sqlite_place(template: Path) -> tuple[str, Callable[[], None]]:
    """A fresh SQLite file in a folder of its own: a copy of the migrated template (tests/templates.py)."""
    folder = tempfile.mkdtemp(prefix="nbqueue-model-")
    target = os.path.join(folder, "jobs.db")
    templates.copy_sqlite_template(template, Path(target))
    return target, lambda: shutil.rmtree(folder, ignore_errors=True)


def postgres_place(server: str, admin: Any, made: list[str]) -> Place:
    """Fresh PostgreSQL schemas on `server` (named in `made`), each dropped through `admin` afterwards."""

    def make() -> tuple[str, Callable[[], None]]:
        schema = f"nbq_test_{uuid.uuid4().hex[:12]}"
        made.append(schema)

        def drop() -> None:
            admin.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')

        return f"{server}?schema={schema}", drop

    return make


class QueueMachine(RuleBasedStateMachine):
    def __init__(self, place: Place) -> None:
        super().__init__()
        target, self.remove = place()
        self.clock = nbqueue.ManualClock()
        try:
            self.q = nbqueue.Queue(
                target, clock=self.clock, backoff=nbqueue.Backoff(base=BASE, cap=CAP, jitter=0)
            )
        except BaseException:
            self.remove()
            raise
        self.jobs: dict[int, Model] = {}
        self.held: list[Job] = []  # claims we hold, live or stale
        self.seen: dict[int, str] = {}  # the states read after the previous step
        self.serial = 0

    def teardown(self) -> None:
        try:
            self.q.close()
        finally:
            self.remove()

    # -- helpers ---------------------------------------------------------------

    def now(self) -> int:
        return to_us(self.clock())

    def live(self, claim: Job) -> bool:
        """May this claim still complete, fail or heartbeat?"""
        m = self.jobs[claim.id]
        return (
            m.state == RUNNING
            and m.attempts == claim.attempts
            and m.lease_until is not None
            and m.lease_until > self.now()
        )

    def verdict(self, m: Model, retry: bool) -> None:
        """Apply a failed attempt to the model: retry after the exact backoff, or dead."""
        number = m.retries + 1
        m.lease_until = None
        if not retry or number > m.max_retries:
            m.state = DEAD
        else:
            m.state = FAILED
            m.retries = number
            m.run_at = self.now() + to_us(min(CAP, BASE**number))

    def pick_claim(self, data: st.DataObject) -> Job:
        return self.held[data.draw(st.integers(0, len(self.held) - 1), label="claim")]

    def pick_job(self, data: st.DataObject) -> int:
        ids = sorted(self.jobs)
        return ids[data.draw(st.integers(0, len(ids) - 1), label="job")]

    # -- rules -----------------------------------------------------------------

    @initialize(
        batch=st.lists(
            st.tuples(st.sampled_from(QUEUES), st.integers(-2, 2), st.integers(0, 3)), min_size=1, max_size=6
        )
    )
    def seed(self, batch: list[tuple[str, int, int]]) -> None:
        """Start with a few jobs, so that short runs still reach leases, retries and the dead."""
        for queue, priority, max_retries in batch:
            self.enqueue(queue, priority, None, max_retries, None)

    @rule(
        queue=st.sampled_from(QUEUES),
        priority=st.integers(-2, 2),
        delay=st.sampled_from([None, 0, 0.5, 1, 5, 30]),
        max_retries=st.integers(0, 3),
        key=st.sampled_from([None, None, None, "k1", "k2"]),
    )
    def enqueue(
        self, queue: str, priority: int, delay: float | None, max_retries: int, key: str | None
    ) -> None:
        self.serial += 1
        holder = next(
            (m for m in self.jobs.values() if key is not None and m.key == key and m.state in UNFINISHED),
            None,
        )
        job = self.q.enqueue(
            {"serial": self.serial},
            queue=queue,
            priority=priority,
            delay=delay,
            max_retries=max_retries,
            key=key,
        )
        if holder is not None:  # idempotency: the unfinished job holding the key is the answer
            assert job.id == holder.id
            return
        assert job.id not in self.jobs
        assert all(job.id > i for i in self.jobs), "ids must grow"
        run_at = self.now() + to_us(delay or 0)
        assert (job.status, job.run_at, job.payload) == (PENDING, from_us(run_at), {"serial": self.serial})
        self.jobs[job.id] = Model(job.id, queue, priority, key, max_retries, run_at)

    @rule(
        queues=st.sampled_from([None, ("a",), ("b",), ("a", "b"), ("b", "a")]),
        lease=st.sampled_from([1, 5, 30]),
    )
    def claim(self, queues: tuple[str, ...] | None, lease: int) -> None:
        now = self.now()
        due = [
            m
            for m in self.jobs.values()
            if m.state in (PENDING, FAILED) and m.run_at <= now and (queues is None or m.queue in queues)
        ]
        # Highest priority, then earliest run_at, then the earlier job.
        expected = min(due, key=lambda m: (-m.priority, m.run_at, m.id), default=None)
        job = self.q.claim(queues=None if queues is None else list(queues), lease=lease)
        if expected is None:
            assert job is None, f"claimed {job!r} though the model has nothing due"
            return
        assert job is not None, f"expected job {expected.id}, the queue returned nothing"
        assert job.id == expected.id, f"claimed {job.id}, the model predicts {expected.id}"
        expected.state = RUNNING
        expected.attempts += 1
        expected.lease_us = to_us(lease)
        expected.lease_until = now + expected.lease_us
        assert (job.status, job.attempts, job.lease_until) == (
            RUNNING,
            expected.attempts,
            from_us(expected.lease_until),
        )
        self.held.append(job)

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def complete(self, data: st.DataObject) -> None:
        claim = self.pick_claim(data)
        self.held.remove(claim)
        if not self.live(claim):
            with pytest.raises(nbqueue.LeaseLost):
                self.q.complete(claim, result={"id": claim.id})
            return
        self.q.complete(claim, result={"id": claim.id})
        m = self.jobs[claim.id]
        m.state, m.lease_until = COMPLETED, None
        assert self.q.get(claim.id).value == {"id": claim.id}

    @precondition(lambda self: self.held)
    @rule(data=st.data(), retry=st.sampled_from([True, True, True, False]))
    def fail(self, data: st.DataObject, retry: bool) -> None:
        claim = self.pick_claim(data)
        error = f"boom {claim.id}/{claim.attempts}"
        if not self.live(claim):
            self.held.remove(claim)
            with pytest.raises(nbqueue.LeaseLost):
                self.q.fail(claim, error, retry=retry)
            return
        verdict = self.q.fail(claim, error, retry=retry)
        m = self.jobs[claim.id]
        self.verdict(m, retry)
        m.error = error
        assert verdict == ("retry" if m.state == FAILED else "dead")
        # The claim stays held: from now on it is stale and must be refused.

    @precondition(lambda self: self.held)
    @rule(data=st.data(), lease=st.sampled_from([None, None, 1, 5, 30]))
    def heartbeat(self, data: st.DataObject, lease: int | None) -> None:
        claim = self.pick_claim(data)
        if not self.live(claim):
            self.held.remove(claim)
            with pytest.raises(nbqueue.LeaseLost):
                self.q.heartbeat(claim, lease=lease)
            return
        beat = self.q.heartbeat(claim, lease=lease)
        m = self.jobs[claim.id]
        m.lease_until = self.now() + (m.lease_us if lease is None else to_us(lease))
        assert beat.lease_until == from_us(m.lease_until)

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        claim = self.pick_claim(data)
        m = self.jobs[claim.id]
        mine = m.state == RUNNING and m.attempts == claim.attempts
        assert self.q.release(claim) is mine
        if mine:  # back to pending, no retry counted, run_at unchanged
            m.state, m.lease_until = PENDING, None
        else:
            self.held.remove(claim)

    @rule(seconds=st.sampled_from([0.5, 1, 2, 5, 10, 31, 61, 120, -2, -40]))
    def move_clock(self, seconds: float) -> None:
        self.clock.advance(seconds)

    @rule()
    def recover(self) -> None:
        now = self.now()
        expired = [m for m in self.jobs.values() if m.state == RUNNING and (m.lease_until or 0) <= now]
        assert self.q.recover() == len(expired)
        for m in expired:
            self.verdict(m, retry=True)
            m.error = "lease expired"  # checked as a prefix

    def key_taken(self, m: Model) -> bool:
        """Does another unfinished job hold m's idempotency key?"""
        return m.key is not None and any(
            o.key == m.key and o.state in UNFINISHED for o in self.jobs.values() if o is not m
        )

    def fresh_start(self, m: Model) -> None:
        m.state, m.retries, m.run_at, m.lease_until = PENDING, 0, self.now(), None

    @precondition(lambda self: self.jobs)
    @rule(data=st.data())
    def requeue(self, data: st.DataObject) -> None:
        job_id = self.pick_job(data)
        m = self.jobs[job_id]
        if m.state not in (DEAD, CANCELLED) or self.key_taken(m):
            # Only dead or cancelled jobs; and two unfinished jobs never share a key.
            with pytest.raises(nbqueue.InvalidTransition):
                self.q.requeue(job_id)
            return
        assert self.q.requeue(job_id) == 1
        self.fresh_start(m)

    @rule()
    def requeue_every_dead_job(self) -> None:
        dead = sorted((m for m in self.jobs.values() if m.state == DEAD), key=lambda m: m.id)
        clash = any(self.key_taken(m) for m in dead)
        try:
            n = self.q.requeue(None)
        except nbqueue.InvalidTransition:
            # Tolerated here (the invariants check that nothing changed); whether a key clash
            # may block every other dead job is pinned by test_requeue_all_is_not_blocked_by_a_key_clash.
            assert clash, "requeue(None) refused though no key clashes"
            return
        requeued = 0
        for m in dead:  # in id order: the first dead job with a key takes it back
            if not self.key_taken(m):
                self.fresh_start(m)
                requeued += 1
        assert n == requeued

    @rule()
    def requeue_unknown_id(self) -> None:
        with pytest.raises(nbqueue.JobNotFound):
            self.q.requeue(max(self.jobs, default=0) + 1)

    @precondition(lambda self: self.jobs)
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        job_id = self.pick_job(data)
        m = self.jobs[job_id]
        if m.state not in (PENDING, FAILED, RUNNING):
            with pytest.raises(nbqueue.InvalidTransition):
                self.q.cancel(job_id)
            return
        assert self.q.cancel(job_id).status == CANCELLED
        m.state, m.lease_until = CANCELLED, None

    # -- invariants --------------------------------------------------------------

    @invariant()
    def counts_match(self) -> None:
        none = {s.value: 0 for s in nbqueue.State}  # blocked and upstream_failed: no job here has parents
        expected = {s: sum(m.state == s for m in self.jobs.values()) for s in STATES}
        assert self.q.counts() == none | expected
        for name in QUEUES:
            per_queue = {s: sum(m.state == s and m.queue == name for m in self.jobs.values()) for s in STATES}
            assert self.q.counts(name) == none | per_queue

    @invariant()
    def every_job_matches(self) -> None:
        stored = {job.id: job for job in self.q.jobs(limit=10_000)}
        assert sorted(stored) == sorted(self.jobs)
        for job_id, m in self.jobs.items():
            job = stored[job_id]
            got: dict[str, Any] = {
                "status": job.status.value,
                "retries": job.retries,
                "attempts": job.attempts,
                "max_retries": job.max_retries,
                "priority": job.priority,
                "queue": job.queue,
                "key": job.key,
                "run_at": job.run_at,
                "lease_until": job.lease_until,
            }
            want = {
                "status": m.state,
                "retries": m.retries,
                "attempts": m.attempts,
                "max_retries": m.max_retries,
                "priority": m.priority,
                "queue": m.queue,
                "key": m.key,
                "run_at": from_us(m.run_at),
                "lease_until": from_us(m.lease_until),
            }
            assert got == want, f"job {job_id}"
            if m.error == "lease expired":
                assert (job.error or "").startswith("lease expired"), job.error
            else:
                assert job.error == m.error
            # A change of state since the last step must be one the contract allows.
            before = self.seen.get(job_id)
            if before is not None and before != m.state:
                assert (before, m.state) in LEGAL, f"job {job_id}: {before} -> {m.state}"
            self.seen[job_id] = m.state


def model_settings(backend: str) -> settings:
    return settings(
        max_examples=600 * SOAK
        if SOAK
        else examples(QUICK_EXAMPLES[backend]),  # NBQUEUE_TEST_PROFILE=fast: 15
        stateful_step_count=60 if SOAK else 30,
        deadline=None,
        database=None,  # no .hypothesis/ folder in the repository; a failure prints its steps
        suppress_health_check=[HealthCheck.too_slow],
    )


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.slow)])
def test_queue_model(backend: str, request: pytest.FixtureRequest) -> None:
    """The queue against the model, on a fresh file or schema per example."""
    if backend == "sqlite":
        template = request.getfixturevalue("sqlite_template")
        run_state_machine_as_test(
            lambda: QueueMachine(partial(sqlite_place, template)), settings=model_settings(backend)
        )
        return
    import psycopg

    server = str(request.getfixturevalue("pg_server"))
    made: list[str] = []
    with psycopg.connect(server, autocommit=True) as admin:
        try:
            place = postgres_place(server, admin, made)
            run_state_machine_as_test(lambda: QueueMachine(place), settings=model_settings(backend))
        finally:
            for schema in made:  # also those of an example that failed half-way
                admin.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        left = admin.execute("SELECT nspname FROM pg_namespace WHERE nspname = ANY(%s)", (made,)).fetchall()
    assert len(set(made)) == len(made) > 1, "every example has a schema of its own"
    assert not left, f"schemas left behind: {left}"


def test_requeue_all_is_not_blocked_by_a_key_clash(queue: nbqueue.Queue) -> None:
    """Two dead jobs that shared a key (the second was enqueued after the first died) must not
    make "requeue every dead job" (the CLI's --all-dead, the dead-letter view's button) fail
    for all of them: the first takes its key back, the unrelated dead job is requeued too."""
    with queue as q:

        def dead(key: str | None) -> int:
            job = q.enqueue({"key": key}, key=key, max_retries=0)
            claim = q.claim()
            assert claim is not None and claim.id == job.id
            assert q.fail(claim, "boom") == "dead"
            return job.id

        first, second, keyless = dead("report:42"), dead("report:42"), dead(None)
        requeued = q.requeue(None)
        states = {i: q.get(i).status.value for i in (first, second, keyless)}
        assert states[keyless] == PENDING, states
        assert states[first] == PENDING, states
        assert states[second] == DEAD, states  # its key is held again: it stays in the dead letters
        assert requeued == 2


def test_requeue_refuses_a_running_job(queue: nbqueue.Queue) -> None:
    """Found by the model: running -> pending is legal for release(), so requeue() let it through
    its transition check and then silently changed nothing (returned 0)."""
    with queue as q:
        job = q.enqueue({"n": 1})
        claim = q.claim()
        assert claim is not None and claim.id == job.id
        with pytest.raises(nbqueue.InvalidTransition, match=str(job.id)):
            q.requeue(job.id)
        assert q.get(job.id).status.value == RUNNING
        q.complete(claim)  # the claim is untouched
