"""A stateful property test of dependencies between jobs: random graphs against a plain-Python model.

Hypothesis builds random DAGs (`after=` 0-3 existing jobs, a random `when`, some of
them inside a `q.workflow` block), claims jobs and completes or fails them, cancels
and requeues. The model is WORKFLOWS.md "Dependencies between jobs" written out
here, independently of nbqueue.dependencies and nbqueue.storage.cascade. After
every step every job's state (and an upstream_failed job's root cause) and the
counts must agree with it, and a claim must only ever hand out a job whose parents
allow it to run.

The contract as the model reads it:

- A job with parents is decided from them at once: pending, upstream_failed, or
  blocked until they decide it. "all_succeeded": pending when every parent
  completed, upstream_failed as soon as one did not (dead, cancelled,
  upstream_failed). "all_done": pending when every parent finished.
  "any_succeeded": pending at the first completed parent, upstream_failed when
  all finished and none completed.
- An upstream_failed job's root cause is the dead or cancelled job at the start
  of the chain. Where several chains could have doomed it at the same moment the
  contract does not say which one is named, so the model accepts any of them and
  then holds the queue to the one it chose.
- Requeueing a dead or cancelled job R re-decides R from its parents, re-arms
  every upstream_failed descendant whose root cause is R (blocked, then decided
  again from its parents as they are now). Completed jobs never change.
  Requeueing an upstream_failed job whose root cause is still dead or cancelled
  is refused.
- Blocked means waiting for its parents, and a claim hands out only a job whose
  parents allow it to run now. So a pending job that has not run yet waits again
  when a parent it counted as finished comes back: an all_done child of R, or of
  a job R's requeue re-armed (test_requeue_makes_a_waiting_all_done_child_wait_again).

Raw payload jobs with max_retries=0, so a failed attempt is dead at once. Each
example gets a fresh SQLite file or a fresh PostgreSQL schema, and a ManualClock
that never moves (leases never expire: a claim goes stale only by a cancel).

The quick run is 100 examples of 30 steps on SQLite and 30 on PostgreSQL;
NBQUEUE_SOAK=N runs 400 x N examples of 60 steps on each backend.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
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
from tests import templates
from tests.helpers import examples

PENDING, RUNNING, COMPLETED, FAILED = "pending", "running", "completed", "failed"
DEAD, CANCELLED = "dead", "cancelled"
BLOCKED, UPSTREAM_FAILED = "blocked", "upstream_failed"
ALL_SUCCEEDED, ALL_DONE, ANY_SUCCEEDED = "all_succeeded", "all_done", "any_succeeded"
WHENS = (ALL_SUCCEEDED, ALL_DONE, ANY_SUCCEEDED)

#: States a job never leaves by itself: each counts as a finished parent.
FINISHED = (COMPLETED, DEAD, CANCELLED, UPSTREAM_FAILED)
#: A parent in one of these did not succeed; dead and cancelled ones are roots of a chain.
NOT_SUCCEEDED = (DEAD, CANCELLED, UPSTREAM_FAILED)
#: A job in one of these can be claimed; "failed" (waiting for a retry) needs max_retries > 0.
CLAIMABLE = (PENDING, FAILED)
CANCELLABLE = (PENDING, FAILED, RUNNING, BLOCKED)

# Changes of state one step may show, from the contract (not nbqueue.jobs.TRANSITIONS). A
# requeue re-decides the job from its parents, so dead or cancelled goes to pending, blocked
# or (parents that failed meanwhile) upstream_failed; a re-armed descendant is seen after
# its re-decision: blocked, pending, or upstream_failed again under another root. A pending
# job that has not run waits again when a parent it counted as finished is requeued.
LEGAL = {
    (PENDING, BLOCKED),
    (PENDING, RUNNING),
    (RUNNING, COMPLETED),
    (RUNNING, DEAD),
    (RUNNING, CANCELLED),
    (PENDING, CANCELLED),
    (BLOCKED, PENDING),
    (BLOCKED, UPSTREAM_FAILED),
    (BLOCKED, CANCELLED),
    *((a, b) for a in (DEAD, CANCELLED, UPSTREAM_FAILED) for b in (PENDING, BLOCKED, UPSTREAM_FAILED)),
}

SOAK = int(os.environ.get("NBQUEUE_SOAK", "0") or 0)
QUICK_EXAMPLES = {"sqlite": 100, "postgres": 30}

#: Makes one example's storage: the Queue target, and how to remove it afterwards.
Place = Callable[[], tuple[str, Callable[[], None]]]


@dataclass
class Model:
    """What the contract says one job looks like."""

    id: int
    parents: tuple[int, ...]
    when: str | None  # None: no parents
    state: str
    # For upstream_failed: the root causes the contract allows; one once the queue has chosen.
    roots: frozenset[int] = field(default_factory=frozenset)
    attempts: int = 0


def sqlite_place(template: Path) -> tuple[str, Callable[[], None]]:
    """A fresh SQLite file in a folder of its own: a copy of the migrated template (tests/templates.py)."""
    folder = tempfile.mkdtemp(prefix="nbqueue-deps-")
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


class DependencyMachine(RuleBasedStateMachine):
    def __init__(self, place: Place) -> None:
        super().__init__()
        target, self.remove = place()
        try:
            self.q = nbqueue.Queue(target, clock=nbqueue.ManualClock())
        except BaseException:
            self.remove()
            raise
        self.jobs: dict[int, Model] = {}
        self.handles: dict[int, Job] = {}  # the Job enqueue returned: after= takes it as well as the id
        self.held: list[Job] = []  # claims we hold, live or stale
        self.seen: dict[int, str] = {}  # the states read after the previous step
        self.serial = 0

    def teardown(self) -> None:
        try:
            self.q.close()
        finally:
            self.remove()

    # -- the contract ------------------------------------------------------------

    def root_of(self, parent: Model) -> frozenset[int]:
        """The roots a parent that did not succeed passes on: itself, or its own root cause."""
        return parent.roots if parent.state == UPSTREAM_FAILED else frozenset({parent.id})

    def decide(self, parents: Iterable[int], when: str | None) -> tuple[str, frozenset[int]]:
        """Where a job with these parents stands, as they are now: (state, allowed root causes)."""
        ps = [self.jobs[p] for p in parents]
        if not ps:
            return PENDING, frozenset()
        failed = [p for p in ps if p.state in NOT_SUCCEEDED]
        every_finished = all(p.state in FINISHED for p in ps)
        doomed = False
        if when == ALL_SUCCEEDED:
            if failed:
                doomed = True
            elif all(p.state == COMPLETED for p in ps):
                return PENDING, frozenset()
        elif when == ALL_DONE:
            if every_finished:
                return PENDING, frozenset()
        elif any(p.state == COMPLETED for p in ps):  # any_succeeded
            return PENDING, frozenset()
        elif every_finished:
            doomed = True
        if doomed:
            return UPSTREAM_FAILED, frozenset().union(*(self.root_of(p) for p in failed))
        return BLOCKED, frozenset()

    def allowed_to_run(self, m: Model) -> bool:
        """Do m's parents, as they are now, let it run?"""
        return self.decide(m.parents, m.when)[0] == PENDING

    def settle(self, waiting: tuple[str, ...] = (BLOCKED,)) -> None:
        """Decide every job in `waiting` states from its parents, in id order: parents come before
        their children, so one pass is the whole cascade, level by level."""
        for m in sorted(self.jobs.values(), key=lambda m: m.id):
            if m.state in waiting and m.parents:
                m.state, m.roots = self.decide(m.parents, m.when)

    def add(self, job: Job, parents: tuple[int, ...], when: str | None) -> None:
        """A job the queue just made, with the state the model gives it."""
        assert job.id not in self.jobs
        assert all(p < job.id for p in parents), "a parent exists before its child, so has a smaller id"
        state, roots = self.decide(parents, when)
        self.jobs[job.id] = m = Model(job.id, parents, when if parents else None, state, roots)
        self.handles[job.id] = job
        self.check(job, m)

    def check(self, job: Job, m: Model) -> None:
        """The queue's job against the model's; the root cause the queue chose is kept from now on."""
        assert job.status.value == m.state, f"job {m.id}: {job.status.value}, the model says {m.state}"
        assert job.when == m.when, f"job {m.id}"
        if m.state == UPSTREAM_FAILED:
            assert job.root_cause in m.roots, f"job {m.id}: root cause {job.root_cause}, allowed {m.roots}"
            assert re.search(rf"\bjob {job.root_cause}\b", job.error or ""), f"job {m.id}: {job.error!r}"
            m.roots = frozenset({job.root_cause})
        else:
            assert job.root_cause is None, f"job {m.id} is {m.state} with root cause {job.root_cause}"
        if m.state == BLOCKED:  # what it still waits for: the parents that have not finished
            left = sum(self.jobs[p].state not in FINISHED for p in m.parents)
            assert job.parents_left == left, f"job {m.id}: parents_left {job.parents_left}, expected {left}"

    # -- drawing -------------------------------------------------------------------

    def draw_parents(self, data: st.DataObject, label: str) -> list[int]:
        ids = sorted(self.jobs)
        if not ids:
            return []
        return data.draw(st.lists(st.sampled_from(ids), max_size=3, unique=True), label=label)

    def as_after(self, data: st.DataObject, parents: list[int]) -> list[Job | int]:
        """after= takes Jobs or ids: give it both kinds."""
        return [self.handles[p] if data.draw(st.booleans(), label="as Job") else p for p in parents]

    def pick(self, data: st.DataObject, ids: list[int], label: str) -> int:
        return ids[data.draw(st.integers(0, len(ids) - 1), label=label)]

    # -- rules ---------------------------------------------------------------------

    @initialize(data=st.data(), whens=st.lists(st.sampled_from(WHENS), min_size=2, max_size=6))
    def seed(self, data: st.DataObject, whens: list[str]) -> None:
        """Start with a small graph, so that short runs still reach cascades and re-arming."""
        for when in whens:
            self.enqueue(data, when)

    @rule(data=st.data(), when=st.sampled_from(WHENS))
    def enqueue(self, data: st.DataObject, when: str) -> None:
        parents = self.draw_parents(data, "after")
        self.serial += 1
        job = self.q.enqueue({"n": self.serial}, after=self.as_after(data, parents), when=when, max_retries=0)
        self.add(job, tuple(parents), when)

    @rule(data=st.data(), size=st.integers(2, 4))
    def workflow(self, data: st.DataObject, size: int) -> None:
        """Jobs made together: their parents are earlier jobs of the block or jobs already there."""
        plans: list[tuple[list[int], list[int], str]] = []  # (existing parents, block parents, when)
        with self.q.workflow("w") as wf:
            planned: list[Any] = []
            for i in range(size):
                outside = self.draw_parents(data, f"after (outside, job {i})")
                inside = data.draw(
                    st.lists(st.integers(0, i - 1), max_size=min(i, 3), unique=True) if i else st.just([]),
                    label=f"after (inside, job {i})",
                )
                when = data.draw(st.sampled_from(WHENS), label="when")
                self.serial += 1
                after = [*self.as_after(data, outside), *(planned[k] for k in inside)]
                planned.append(self.q.enqueue({"n": self.serial}, after=after, when=when, max_retries=0))
                plans.append((outside, inside, when))
        assert len(wf.jobs) == size
        for job, (outside, inside, when) in zip(wf.jobs, plans, strict=True):
            parents = tuple(sorted({*outside, *(wf.jobs[k].id for k in inside)}))
            self.add(job, parents, when)
        graph = self.q.graph(wf)  # one row per job of the workflow, with its parents' ids
        rows = zip(graph["id"].tolist(), graph["status"].tolist(), graph["parents"].tolist(), strict=True)
        got = {int(i): (str(status), sorted(parents)) for i, status, parents in rows}
        assert got == {j.id: (self.jobs[j.id].state, list(self.jobs[j.id].parents)) for j in wf.jobs}

    @rule(data=st.data(), then=st.sampled_from(["complete", "complete", "fail", "hold"]))
    def claim(self, data: st.DataObject, then: str) -> None:
        """Claim a job; complete it, fail it, or hold it (running) for a later step."""
        due = {m.id for m in self.jobs.values() if m.state in CLAIMABLE}
        job = self.q.claim()
        if not due:
            assert job is None, f"claimed {job!r} though the model has nothing due"
            return
        assert job is not None, f"the model has {sorted(due)} due, the queue returned nothing"
        assert job.id in due, (
            f"claimed job {job.id} ({self.jobs.get(job.id)}), the model has {sorted(due)} due"
        )
        m = self.jobs[job.id]
        assert self.allowed_to_run(m), (
            f"job {job.id} runs though its parents do not allow it: {self.parents(m)}"
        )
        m.state = RUNNING
        m.attempts += 1
        assert (job.status.value, job.attempts) == (RUNNING, m.attempts)
        self.seen[job.id] = RUNNING  # observed: what follows in this step is a change from running
        self.held.append(job)
        if then == "complete":
            self.finish(job, True)
        elif then == "fail":
            self.finish(job, False)

    @precondition(lambda self: self.held)
    @rule(data=st.data(), ok=st.booleans())
    def finish_held(self, data: st.DataObject, ok: bool) -> None:
        """Complete or fail a claim held since an earlier step (perhaps cancelled or requeued since)."""
        self.finish(self.held[data.draw(st.integers(0, len(self.held) - 1), label="claim")], ok)

    def finish(self, claim: Job, ok: bool) -> None:
        self.held.remove(claim)
        m = self.jobs[claim.id]
        if m.state != RUNNING or m.attempts != claim.attempts:  # cancelled (and maybe requeued) meanwhile
            with pytest.raises(nbqueue.LeaseLost):
                if ok:
                    self.q.complete(claim, {"n": claim.id})
                else:
                    self.q.fail(claim, "boom")
            return
        if ok:
            self.q.complete(claim, {"n": claim.id})
            m.state = COMPLETED
        else:
            assert self.q.fail(claim, "boom") == "dead"  # max_retries=0
            m.state = DEAD
        self.settle()

    @precondition(lambda self: self.jobs)
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        m = self.jobs[self.pick(data, sorted(self.jobs), "cancel")]
        if m.state not in CANCELLABLE:
            with pytest.raises(nbqueue.InvalidTransition):
                self.q.cancel(m.id)
            return
        assert self.q.cancel(m.id).status.value == CANCELLED
        m.state = CANCELLED
        self.settle()  # its waiting descendants are doomed (or, under all_done, freed)

    @precondition(lambda self: any(m.state in (DEAD, CANCELLED) for m in self.jobs.values()))
    @rule(data=st.data())
    def requeue_failed(self, data: st.DataObject) -> None:
        """Requeue a dead or cancelled job: the common case, so drawn on purpose."""
        self.requeue(
            self.pick(data, sorted(i for i, m in self.jobs.items() if m.state in (DEAD, CANCELLED)), "R")
        )

    @precondition(lambda self: self.jobs)
    @rule(data=st.data())
    def requeue_any(self, data: st.DataObject) -> None:
        """Requeue any job: refused unless it is dead or cancelled, or upstream_failed with its root fixed."""
        self.requeue(self.pick(data, sorted(self.jobs), "requeue"))

    def requeue(self, job_id: int) -> None:
        m = self.jobs[job_id]
        legal = m.state in (DEAD, CANCELLED) or (
            m.state == UPSTREAM_FAILED and all(self.jobs[r].state not in (DEAD, CANCELLED) for r in m.roots)
        )
        if not legal:
            with pytest.raises(nbqueue.InvalidTransition):
                self.q.requeue(job_id)
            return
        assert self.q.requeue(job_id) == 1
        # Every descendant it doomed waits again; then the whole graph is decided afresh from
        # the parents as they are now (the requeued job first: it has the smallest id of them).
        for d in self.descendants(job_id):
            if d.state == UPSTREAM_FAILED and d.roots == {job_id}:
                d.state, d.roots = BLOCKED, frozenset()
        m.state, m.roots = (BLOCKED if m.parents else PENDING), frozenset()
        # A pending job has not run yet: if a parent it counted as finished is unfinished again
        # (an all_done child of the requeued job or of a re-armed one), it waits for it again.
        self.settle((BLOCKED, PENDING))

    def descendants(self, job_id: int) -> list[Model]:
        found: set[int] = set()
        for m in sorted(self.jobs.values(), key=lambda m: m.id):  # parents first
            if any(p == job_id or p in found for p in m.parents):
                found.add(m.id)
        return [self.jobs[i] for i in sorted(found)]

    def parents(self, m: Model) -> str:
        return f"{m.when} of " + ", ".join(f"{p} {self.jobs[p].state}" for p in m.parents)

    # -- invariants -----------------------------------------------------------------

    @invariant()
    def counts_match(self) -> None:
        expected = {s.value: 0 for s in nbqueue.State}
        for m in self.jobs.values():
            expected[m.state] += 1
        assert self.q.counts() == expected

    @invariant()
    def every_job_matches(self) -> None:
        stored = {job.id: job for job in self.q.jobs(limit=10_000)}
        assert sorted(stored) == sorted(self.jobs)
        for job_id, m in self.jobs.items():
            self.check(stored[job_id], m)
            before = self.seen.get(job_id)
            if before is not None and before != m.state:
                assert (before, m.state) in LEGAL, f"job {job_id}: {before} -> {m.state}"
            self.seen[job_id] = m.state

    @invariant()
    def roots_are_failed_chains(self) -> None:
        """An upstream_failed job names a job that is dead or cancelled now, and one that a parent
        which did not succeed passes on (the chain is unbroken)."""
        stored = {job.id: job for job in self.q.jobs(limit=10_000)}
        for job in stored.values():
            if job.status.value == UPSTREAM_FAILED:
                assert job.root_cause is not None and stored[job.root_cause].status.value in (DEAD, CANCELLED)
                m = self.jobs[job.id]
                passed = set().union(
                    *(self.root_of(self.jobs[p]) for p in m.parents if self.jobs[p].state in NOT_SUCCEEDED)
                )
                assert job.root_cause in passed, (
                    f"job {job.id}: root {job.root_cause}, its parents pass on {passed}"
                )


def model_settings(backend: str) -> settings:
    return settings(
        max_examples=400 * SOAK
        if SOAK
        else examples(QUICK_EXAMPLES[backend]),  # NBQUEUE_TEST_PROFILE=fast: 15
        stateful_step_count=60 if SOAK else 30,
        deadline=None,
        database=None,  # no .hypothesis/ folder in the repository; a failure prints its steps
        suppress_health_check=[HealthCheck.too_slow],
    )


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.slow)])
def test_dependency_model(backend: str, request: pytest.FixtureRequest) -> None:
    """Random graphs against the model, on a fresh file or schema per example."""
    if backend == "sqlite":
        template = request.getfixturevalue("sqlite_template")
        run_state_machine_as_test(
            lambda: DependencyMachine(partial(sqlite_place, template)),  # type: ignore[arg-type]  # any factory will do
            settings=model_settings(backend),
        )
        return
    import psycopg

    server = str(request.getfixturevalue("pg_server"))
    made: list[str] = []
    with psycopg.connect(server, autocommit=True) as admin:
        try:
            place = postgres_place(server, admin, made)
            run_state_machine_as_test(
                lambda: DependencyMachine(place),  # type: ignore[arg-type]  # any factory will do
                settings=model_settings(backend),
            )
        finally:
            for schema in made:  # also those of an example that failed half-way
                admin.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        left = admin.execute("SELECT nspname FROM pg_namespace WHERE nspname = ANY(%s)", (made,)).fetchall()
    assert len(set(made)) == len(made) > 1, "every example has a schema of its own"
    assert not left, f"schemas left behind: {left}"


def test_requeue_makes_a_waiting_all_done_child_wait_again(queue: nbqueue.Queue) -> None:
    """Found by the model: a pending all_done child that has not run yet kept its place when a
    parent it counted as finished came back (requeued, or re-armed by its root's requeue), so it
    was claimed before that parent ran again. Blocked means waiting for its parents."""
    with queue as q:
        a = q.enqueue({"n": "a"}, max_retries=0)
        report = q.enqueue({"n": "report"}, after=[a], when="all_done", max_retries=0)
        b = q.enqueue({"n": "b"}, after=[a], max_retries=0)  # all_succeeded: doomed with a
        cleanup = q.enqueue({"n": "cleanup"}, after=[b], when="all_done", max_retries=0)
        claim = q.claim()
        assert claim is not None and claim.id == a.id
        assert q.fail(claim, "boom") == "dead"
        before = [q.get(j.id).status.value for j in (report, b, cleanup)]
        assert before == [PENDING, UPSTREAM_FAILED, PENDING]

        assert q.requeue(a) == 1
        after = [q.get(j.id).status.value for j in (a, report, b, cleanup)]
        assert after == [PENDING, BLOCKED, BLOCKED, BLOCKED]
        claim = q.claim()
        assert claim is not None and claim.id == a.id  # nothing that waits for it runs first
