"""What a finished parent does to its blocked children, run inside the transaction that finished it.

The same loops for both backends: each passes its open transaction, `tx`, which runs
one of its statements (`tx.sql`, typed: storage.statements) and returns the rows.
The decisions are `nbqueue.dependencies`'; this module only walks the graph, level
by level, so a doomed child dooms its own children, and the work per finished
parent is its own children.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..dependencies import Change, When, after_parent, after_parents, initial
from ..errors import FamilyTooLarge, InvalidTransition, JobNotFound
from ..jobs import State
from . import NewJob
from .statements import NEW_COLUMNS, Tx

Finished = tuple[int, State, int | None]  # a job that just finished: id, state, root cause


def doomed_error(root: int, state: State) -> str:
    """The error text of an upstream_failed job: its root cause, and what brings it back."""
    return f"upstream failed: job {root} ended {state.value}; requeue job {root} and this job runs again"


def resolve(tx: Tx, finished: Sequence[Finished], now: int | None) -> None:
    """Children of jobs that just finished: counted down, released, or doomed, level by level.

    The children of one parent that completed are settled by groups alike (one_completed). Those
    of several are read a row each, with how many of those are its parents (a fan-in's join is
    one row per batch, not one per parent), and folded over that count at once
    (dependencies.after_parents); those of the parents that did not, edge by edge, since each
    passes on its own root cause. A level is a batch of completions or of failures; were one
    both, a child would count its completed parents first."""
    level: Sequence[Finished] = finished
    roots: dict[int, State] = {}  # the finished jobs' states, read only when a child is doomed
    while level:
        completed: list[int] = []
        failed: dict[int, tuple[State, int | None]] = {}
        for job_id, state, root in level:  # (a worker's batch of completions: one pass)
            if state is State.COMPLETED:
                completed.append(job_id)
            else:
                failed[job_id] = (state, root)
        if len(completed) == 1 and not failed:  # a fan-out's root, a link of a chain
            one_completed(tx, completed[0], now)
            return
        completed.sort()
        # (child, rule, count left, parent, parents): parent 0 stands for `parents` that completed
        rows = tx(tx.sql.CHILDREN_COUNTED, {"ids": completed}) if completed else []
        if failed:
            rows += tx(tx.sql.CHILDREN_BLOCKED, {"ids": sorted(failed)})
        known: dict[tuple[str | None, int, int, int], Change] = {}  # children alike are decided once
        counts: dict[int, int] = {}  # each child's count left so far in this level (-1: decided)
        next_level: list[Finished] = []
        released: dict[int, list[int]] = {}  # children let go, by the count they have left
        child: int
        rule: str | None
        stored: int
        parent: int
        parents: int
        blocked, pending = State.BLOCKED, State.PENDING  # (a fan-out's root folds thousands of rows)
        for child, rule, stored, parent, parents in rows:
            left = counts.get(child, stored)
            if left < 0:  # decided already by an earlier parent in this level
                continue
            if (change := known.get(key := (rule, left, parent, parents))) is None:
                state, root = failed.get(parent, (State.COMPLETED, None))
                when = When(rule or When.ALL_SUCCEEDED)
                change = known[key] = after_parents(when, int(left), state, root, parent, int(parents))
            if change.state is blocked:
                counts[child] = change.left
                continue
            counts[child] = -1
            if change.state is pending:
                released.setdefault(change.left, []).append(child)
            else:
                roots = roots or {job_id: state for job_id, state, _ in finished}
                apply(tx, child, change, roots.get(change.root or 0, State.DEAD), now, next_level)
        for left, children in released.items():  # one statement per count, not one per child
            tx(tx.sql.UNBLOCK_MANY, {"ids": children, "left": left, "now": now})
        if released:  # the workers are woken once, not once per child let go
            tx(tx.sql.WAKE, {})
        for child, left in counts.items():
            if left >= 0:
                tx(tx.sql.SET_LEFT, {"id": child, "left": left})
        level = next_level


def one_completed(tx: Tx, parent: int, now: int | None) -> None:
    """The children of one parent that completed, group by group: those alike (rule, count left)
    are decided once and moved by one statement that finds them by their parent (a fan-out's
    thousands of leaves are never read a row each). A completed parent only ever lets a child go
    or counts it down (dependencies.after_parent), so no group is doomed and the cascade ends
    here. Groups come fewest left first: one counted down to a count already seen is not moved
    twice."""
    released = False
    for rule, stored in tx(tx.sql.CHILD_GROUPS, {"id": parent}):
        change = after_parent(When(rule or When.ALL_SUCCEEDED), int(stored), State.COMPLETED, None, parent)
        group = {"parent": parent, "rule": rule, "stored": stored, "left": change.left}
        if change.state is State.PENDING:
            tx(tx.sql.UNBLOCK_GROUP, {**group, "now": now})
            released = True
        elif change.state is State.BLOCKED:
            tx(tx.sql.SET_LEFT_GROUP, group)
        else:  # a rule that dooms on a completed parent would need the row path of resolve
            raise InvalidTransition(f"job {parent} completed, yet its children would be {change.state}")
    if released:  # the workers are woken once
        tx(tx.sql.WAKE, {})


def apply(
    tx: Tx, child: int, change: Change, root_state: State, now: int | None, doomed: list[Finished]
) -> None:
    """Move a blocked child as `change` says; a doomed one joins the next level as a failed parent."""
    if change.state is State.PENDING:
        tx(tx.sql.UNBLOCK, {"id": child, "left": change.left, "now": now})
        return
    root = change.root or child
    rows = tx(
        tx.sql.DOOM,
        {"id": child, "left": change.left, "root": root, "error": doomed_error(root, root_state), "now": now},
    )
    if rows and rows[0][0]:  # it has children of its own
        doomed.append((child, State.UPSTREAM_FAILED, root))


def settle(tx: Tx, job_id: int, now: int | None) -> Change | None:
    """Put a job where its parents, as they are now, say it stands: blocked, pending or
    upstream_failed (None: it has no parents, and stays as it is)."""
    rows = tx(tx.sql.WAITS_FOR, {"id": job_id})
    if not rows or rows[0][0] is None:
        return None
    parents = [(int(p), State(s), r) for p, s, r in tx(tx.sql.PARENTS_OF, {"id": job_id})]
    change = initial(When(rows[0][0]), parents)
    root = change.root
    error = doomed_error(root, next((s for p, s, _ in parents if p == root), State.DEAD)) if root else None
    params = {"id": job_id, "status": change.state.value, "left": change.left, "root": root}
    tx(tx.sql.SETTLE, {**params, "error": error, "now": now})
    return change


def rearm(tx: Tx, requeued: Sequence[int], now: int | None) -> None:
    """Requeued jobs come back with their graph, in the same transaction: every descendant that
    failed because of one of them is blocked again, and every child that waits on them, or was
    let go by them and has not started, is counted afresh (a pending all_done child waits again
    for a parent that will run again). Completed and running jobs are never touched.

    The jobs moved and their blocked children are settled in topological order, each from its
    parents' states as they are by then, so a diamond or a longer path counts every parent once.
    """
    moved = set(requeued)
    for root in requeued:
        level = [root]
        while level:
            found = {int(r[0]) for r in tx(tx.sql.DOOMED_BY, {"ids": level, "root": root})}
            level = sorted(found - moved)
            for child in level:
                tx(tx.sql.REARM, {"id": child, "now": now})
            moved.update(level)
    waiting = {int(r[0]) for r in tx(tx.sql.CHILDREN_WAITING, {"ids": sorted(moved)})} - moved
    touched = moved | waiting
    edges = [(int(p), int(c)) for p, c in tx(tx.sql.EDGES_OF, {"ids": sorted(touched)})]
    doomed: list[Finished] = []
    for job_id in topological(touched, edges):
        change = settle(tx, job_id, now)
        if job_id in waiting and change is not None and change.state is State.UPSTREAM_FAILED:
            doomed.append((job_id, State.UPSTREAM_FAILED, change.root))  # its children lie outside
    if doomed:
        resolve(tx, doomed, now)


def topological(jobs: set[int], edges: Sequence[tuple[int, int]]) -> list[int]:
    """`jobs` ordered so that each comes after its parents among them (edges: parent, child)."""
    inside = [(p, c) for p, c in edges if p in jobs and c in jobs and p != c]
    parents_left = dict.fromkeys(jobs, 0)
    children: dict[int, list[int]] = {}
    for p, c in set(inside):
        parents_left[c] += 1
        children.setdefault(p, []).append(c)
    ready = sorted(j for j, n in parents_left.items() if n == 0)
    order: list[int] = []
    while ready:
        job = ready.pop()
        order.append(job)
        for child in children.get(job, ()):
            parents_left[child] -= 1
            if parents_left[child] == 0:
                ready.append(child)
    return order


def join_family(tx: Tx, new: NewJob) -> tuple[int | None, int | None]:
    """A job made by a running job (its origin names that job, the spawner) joins the spawner's
    family, counted on the family's first job: (spawner, family), or FamilyTooLarge once the
    family holds `new.family_limit` jobs; a cancelled job (its code may still run) makes none.
    A family whose first job was deleted is not counted."""
    if new.origin is None:
        return None, None
    spawner = int(new.origin.split(":", 1)[0])  # workflows.origin_of: "<job id>:<call>:<n>"
    found = tx(tx.sql.FAMILY_OF, {"spawner": spawner})
    if not found:
        return spawner, None
    family = int(found[0][0])
    if found[0][1] == State.CANCELLED.value:  # its code may still run: what it made was cancelled
        raise InvalidTransition(f"job {spawner} was cancelled: it cannot make more jobs")
    most = new.family_limit
    if most is not None and not tx(tx.sql.GROW_FAMILY, {"family": family, "most": most}):
        size = tx(tx.sql.FAMILY_SIZE, {"family": family})
        if size:
            raise FamilyTooLarge(
                f"job {spawner} cannot make another job: its family (job {family} and every job made "
                f"inside it, however deep) holds {int(size[0][0])} jobs, the queue's family_limit "
                f"({most}); a job that enqueues itself needs a way to stop"
            )
    return spawner, family


def cancel(tx: Tx, job_ids: Sequence[int], now: int | None) -> list[int]:
    """Cancel the jobs of `job_ids` that have not finished, and every unfinished job they made while
    they ran (and those made, theirs); then doom what waited for any of them. Returns the ids of
    `job_ids` cancelled (the jobs they made are cancelled with them, silently)."""
    rows = tx(tx.sql.CANCEL, {"ids": list(job_ids), "now": now})
    cancelled = sorted(int(r[0]) for r in rows)
    made = [int(r[0]) for r in tx(tx.sql.MADE_BY, {"ids": cancelled})] if cancelled else []
    if made:
        rows += tx(tx.sql.CANCEL, {"ids": made, "now": now})
    linked = [(int(i), State.CANCELLED, None) for i, children in rows if children]
    if linked:  # their waiting descendants are doomed in the same transaction
        resolve(tx, linked, now)
    return cancelled


def link(tx: Tx, new: NewJob, now: int | None, token: int | None = None) -> tuple[int, bool]:
    """Insert one job with its parents, in the caller's transaction: (id, created).

    The parents are locked (marked as having children) before their states are read, so a
    parent that finishes at this moment either sees this child or is seen finished by it:
    none is stranded blocked. A parent that does not exist is refused (JobNotFound, and the
    transaction is rolled back). A job that its origin or key already names is not made twice.
    """
    if new.origin is not None and (held := tx(tx.sql.ORIGIN_HELD, {"origin": new.origin})):
        return int(held[0][0]), False
    if new.key is not None and (held := tx(tx.sql.HELD_KEY, {"key": new.key})):
        return int(held[0][0]), False
    spawner, family = join_family(tx, new)
    parents = sorted(set(new.parents))
    found = tx(tx.sql.LINK_PARENTS, {"ids": parents}) if parents else []
    missing = sorted(set(parents) - {int(row[0]) for row in found})
    if missing:
        raise JobNotFound(f"no job with id {missing[0]}: a job cannot wait for a job that does not exist")
    rule = When(new.when or When.ALL_SUCCEEDED)
    change = initial(rule, [(int(i), State(s), r) for i, s, r in found])
    states = {int(i): State(s) for i, s, _ in found}
    params = {
        **{name: getattr(new, name) for name in (*NEW_COLUMNS, "run_at_us", "delay_us")},
        "status": change.state.value,
        "now": now,
        "left": change.left,
        "wait_when": rule.value if parents else None,
        "root": change.root,
        "error": doomed_error(change.root, states.get(change.root, State.DEAD)) if change.root else None,
        "origin": new.origin,
        "workflow": new.workflow,
        "spawner": spawner,
        "family": family,
        "token": token,
    }
    job_id = int(tx(tx.sql.INSERT_LINKED, params)[0][0])
    for parent in parents:
        tx(tx.sql.INSERT_EDGE, {"parent": parent, "child": job_id})
    return job_id, True
