"""What a finished parent does to its blocked children, run inside the transaction that finished it.

The same loops for both backends: each passes `run(name, params)`, which runs the
statement of that name from its own query module (in its open transaction) and
returns the rows. The decisions are `nbqueue.dependencies`'; this module only walks
the graph, level by level, so a doomed child dooms its own children, and the work
per finished parent is its own children.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ..dependencies import Change, When, after_parent, initial
from ..errors import JobNotFound
from ..jobs import State
from . import NewJob

Run = Callable[[str, dict[str, Any]], list[tuple[Any, ...]]]
Finished = tuple[int, State, int | None]  # a job that just finished: id, state, root cause


def doomed_error(root: int, state: State) -> str:
    """The error text of an upstream_failed job: its root cause, and what brings it back."""
    return f"upstream failed: job {root} ended {state.value}; requeue job {root} and this job runs again"


def resolve(run: Run, finished: Sequence[Finished], now: int | None) -> None:
    """Children of jobs that just finished: counted down, released, or doomed, level by level."""
    level = list(finished)
    roots: dict[int, State] = {job_id: state for job_id, state, _ in finished}
    while level:
        outcomes = {job_id: (state, root) for job_id, state, root in level}
        rows = run("CHILDREN_BLOCKED", {"ids": sorted(outcomes)})
        waiting: dict[int, tuple[When, int]] = {}
        next_level: list[Finished] = []
        for parent, child, rule, left in rows:
            current = waiting.get(child, (When(rule or When.ALL_SUCCEEDED), int(left)))
            if current[1] < 0:  # decided already by an earlier parent in this level
                continue
            state, root = outcomes[parent]
            change = after_parent(current[0], current[1], state, root, parent)
            if change.state is State.BLOCKED:
                waiting[child] = (current[0], change.left)
                continue
            waiting[child] = (current[0], -1)
            apply(run, child, change, roots.get(change.root or 0, State.DEAD), now, next_level)
        for child, (_, left) in waiting.items():
            if left >= 0:
                run("SET_LEFT", {"id": child, "left": left})
        level = next_level


def apply(
    run: Run, child: int, change: Change, root_state: State, now: int | None, doomed: list[Finished]
) -> None:
    """Move a blocked child as `change` says; a doomed one joins the next level as a failed parent."""
    if change.state is State.PENDING:
        run("UNBLOCK", {"id": child, "left": change.left, "now": now})
        return
    root = change.root or child
    rows = run(
        "DOOM",
        {"id": child, "left": change.left, "root": root, "error": doomed_error(root, root_state), "now": now},
    )
    if rows and rows[0][0]:  # it has children of its own
        doomed.append((child, State.UPSTREAM_FAILED, root))


def settle(run: Run, job_ids: Sequence[int], now: int | None) -> list[Finished]:
    """Jobs just moved (a requeue) whose parents decide where they stand: blocked, pending or
    upstream_failed again. Returns the ones that ended upstream_failed, to resolve."""
    doomed: list[Finished] = []
    for job_id in job_ids:
        rows = run("WAITS_FOR", {"id": job_id})
        if not rows or rows[0][0] is None:  # no parents: it stays as it was moved
            continue
        rule = When(rows[0][0])
        parents = [(int(p), State(s), r) for p, s, r in run("PARENTS_OF", {"id": job_id})]
        change = initial(rule, parents)
        root = change.root or 0
        error = (
            doomed_error(root, next((s for p, s, _ in parents if p == root), State.DEAD)) if root else None
        )
        run(
            "SETTLE",
            {
                "id": job_id,
                "status": change.state.value,
                "left": change.left,
                "root": change.root,
                "error": error,
                "now": now,
            },
        )
        if change.state is State.UPSTREAM_FAILED:
            doomed.append((job_id, State.UPSTREAM_FAILED, change.root))
    return doomed


def rearm(run: Run, requeued: Sequence[int], now: int | None) -> None:
    """Requeued jobs come back with their graph: children they doomed are re-armed (blocked again,
    in the same transaction), level by level; completed jobs are never touched."""
    doomed = settle(run, requeued, now)
    for root in requeued:
        run("BUMP_CHILDREN", {"ids": [root]})  # it counted as finished for its blocked children
        level = [root]
        while level:
            rows = run("DOOMED_BY", {"ids": level, "root": root})
            level = [int(r[0]) for r in rows]
            for child in level:
                run("REARM", {"id": child, "now": now})
            doomed += settle(run, level, now)
            if level:
                run("BUMP_CHILDREN", {"ids": level})
    if doomed:
        resolve(run, doomed, now)


def link(run: Run, new: NewJob, now: int | None, extra: dict[str, Any] | None = None) -> tuple[int, bool]:
    """Insert one job with its parents, in the caller's transaction: (id, created).

    The parents are locked (marked as having children) before their states are read, so a
    parent that finishes at this moment either sees this child or is seen finished by it:
    none is stranded blocked. A parent that does not exist is refused (JobNotFound, and the
    transaction is rolled back). A job that its origin or key already names is not made twice.
    """
    if new.origin is not None and (held := run("ORIGIN_HELD", {"origin": new.origin})):
        return int(held[0][0]), False
    if new.key is not None and (held := run("HELD_KEY", {"key": new.key})):
        return int(held[0][0]), False
    parents = sorted(set(new.parents))
    found = run("LINK_PARENTS", {"ids": parents}) if parents else []
    missing = sorted(set(parents) - {int(row[0]) for row in found})
    if missing:
        raise JobNotFound(f"no job with id {missing[0]}: a job cannot wait for a job that does not exist")
    rule = When(new.when or When.ALL_SUCCEEDED)
    change = initial(rule, [(int(i), State(s), r) for i, s, r in found])
    states = {int(i): State(s) for i, s, _ in found}
    run_at = new.run_at_us if new.run_at_us is not None else (None if now is None else now + new.delay_us)
    params = {
        "status": change.state.value,
        "queue": new.queue,
        "task": new.task,
        "payload": new.payload,
        "priority": new.priority,
        "key": new.key,
        "max_retries": new.max_retries,
        "run_at": run_at,
        "run_at_us": new.run_at_us,
        "delay_us": new.delay_us,
        "now": now,
        "timeout": new.timeout,
        "backoff": new.backoff,
        "signature": new.signature,
        "limits": new.limits,
        "gate": new.gate,
        "left": change.left,
        "wait_when": rule.value if parents else None,
        "root": change.root,
        "error": doomed_error(change.root, states.get(change.root, State.DEAD)) if change.root else None,
        "origin": new.origin,
        "workflow": new.workflow,
        **(extra or {}),
    }
    job_id = int(run("INSERT_LINKED", params)[0][0])
    for parent in parents:
        run("INSERT_EDGE", {"parent": parent, "child": job_id})
    return job_id, True
