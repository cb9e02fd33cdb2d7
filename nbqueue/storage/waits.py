"""Jobs that wait, inside one write transaction: reaching a wait, and sending a value.

The same decisions for both backends, over the open transaction `tx` (as in
`storage.cascade`). A wait is reached under the job's live claim: it returns a value
already there (sent ahead, or recorded by an earlier run), records an expiry, or
suspends the job (running -> waiting, its lease released). A send records a value and
wakes the job if it waits for that name.

No wake-up is lost between them: each locks the job's row first (PostgreSQL; SQLite's
write transactions run one at a time anyway), so a send either commits before the
suspension reads the wait (and the wait returns its value) or after the job is
`waiting` (and the send wakes it).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Hashable, Sequence
from typing import Any

from ..dependencies import When, initial
from ..errors import InvalidArgument, InvalidTransition, JobNotFound, LeaseLost
from ..jobs import FINISHED, State
from ..records import Reached, Suspension, WaitSpec
from .cascade import doomed_error
from .rules import NEVER_US
from .statements import Row, Tx

Claim = dict[str, int | None]  # a claim as statement parameters: id, attempt, now


Found = tuple[Any, ...]  # a wait's row as read (WAIT_OF): kind, choices, deadline, value, expired_at


def accepts(choices: str | None, value: str) -> bool:
    """Whether a wait with these `choices` (a JSON array; None: any value) takes `value` (JSON)."""
    return choices is None or json.loads(value) in json.loads(choices)


def decide(found: Found | None, wait: WaitSpec, now: Callable[[], int]) -> Reached:
    """What reaching `wait` leads to, from its row as read (None: no row), at the time `now()`
    (µs; read only where a deadline or a wake-up time is to be compared): "value" (its JSON),
    "expired", "suspend" (until `wake`), or what must be written first: "drop" (a value sent
    ahead outside its choices) or "expire" (the deadline, `wake`, has passed)."""
    kind, _, deadline, value, expired = found if found else (None, None, None, None, None)
    if kind is not None and kind != wait.kind:
        raise InvalidArgument(
            f"the name {wait.name!r} was used for a {kind} before; a {wait.kind} needs a name of its own"
        )
    if wait.kind == "sleep":  # the first run fixes the wake-up time
        now_us = now()
        if deadline is not None:
            wake = int(deadline)
        else:
            wake = wait.until_us if wait.until_us is not None else now_us + (wait.timeout_us or 0)
        return Reached("value", "null") if now_us >= wake else Reached("suspend", None, wake)
    if expired is not None:
        return _EXPIRED
    if value is not None:
        return Reached("value", str(value)) if accepts(wait.choices, value) else _DROP
    if deadline is not None:
        now_us = now()
    elif wait.timeout_us is None:
        return _SUSPEND_UNTIL_SENT
    else:  # the first run fixes the deadline (the clock read once: it is compared with that moment)
        now_us = now()
        deadline = now_us + wait.timeout_us
    if now_us >= int(deadline):
        return Reached("expire", None, int(deadline))
    return Reached("suspend", None, int(deadline))


_EXPIRED, _DROP = Reached("expired"), Reached("drop")
_SUSPEND_UNTIL_SENT = Reached("suspend", None, NEVER_US)


def reach(tx: Tx, job_id: int, attempt: int, wait: WaitSpec, now_us: int, stamp: int | None) -> Reached:
    """Reach `wait` under the claim (job_id, attempt) at `now_us`, writing what that needs: a
    dropped value, an expiry, or the suspension itself. LeaseLost if the claim is gone."""
    claim = {"id": job_id, "attempt": attempt, "now": stamp}
    if wait.kind == "jobs":
        return _reach_jobs(tx, claim, wait)
    _lock_claim(tx, claim, wait.name)
    key = {"id": job_id, "name": wait.name}
    found = tx(tx.sql.WAIT_OF, key)
    reached = decide(found[0] if found else None, wait, lambda: now_us)
    if reached.outcome == "drop":  # sent ahead, outside its choices: dropped, the name free again
        tx(tx.sql.DROP_SENT, key)
        reached = decide((*found[0][:3], None, None), wait, lambda: now_us)
    if reached.outcome == "expire":
        _record(tx, [job_id], stamp, wait, reached.wake)
        tx(tx.sql.EXPIRE, {**key, "now": stamp})
        return Reached("expired")
    if reached.outcome == "suspend":
        assert reached.wake is not None
        if not suspend_all(tx, [Suspension(job_id, attempt, wait, reached.wake)], stamp)[0]:
            raise LeaseLost(f"job {job_id} cannot wait: its claim is gone")
        return Reached("suspended")
    if reached.outcome == "value" and found and found[0][0] is None:
        _record(tx, [job_id], stamp, wait, None)  # a value sent ahead: the wait it answered is known now
    return reached


def suspend_all(tx: Tx, suspensions: Sequence[Suspension], stamp: int | None) -> list[bool]:
    """Write suspensions decided by their runs (a worker's batch); False where the claim is gone.
    Jobs that wait alike are written together: one statement per (attempt, wake-up) to suspend
    them, one per wait to record it. Each suspension locks the job's row first, so a send either
    committed before (and the wait's row, upserted next, returns its value: the job is pending
    again at once) or waits for this commit and finds the job waiting."""
    held: set[int] = set()
    for (attempt, wake), alike in _grouped(suspensions, lambda s: (s.attempt, s.wake)).items():
        params = {"ids": [s.job_id for s in alike], "attempt": attempt, "wake": wake, "now": stamp}
        held.update(int(row[0]) for row in tx(tx.sql.SUSPEND_MANY, params))
    suspended = [s for s in suspensions if s.job_id in held]
    for (wait, deadline), alike in _grouped(suspended, lambda s: (s.wait, _deadline(s))).items():
        sent = [
            (int(i), str(v)) for i, v in _record(tx, [s.job_id for s in alike], stamp, wait, deadline) if v
        ]
        if wait.kind != "event":
            continue
        for job_id, value in sent:  # sent while it ran: it runs again now
            if accepts(wait.choices, value):
                tx(tx.sql.WAKE_SENT, {"id": job_id, "now": stamp, "wake": True})
            else:  # outside its choices: dropped, the name free again
                tx(tx.sql.DROP_SENT, {"id": job_id, "name": wait.name})
    return [s.job_id in held for s in suspensions]


def _deadline(suspension: Suspension) -> int | None:
    """The deadline a suspension records: a sleep's wake-up, an event's deadline if it has one."""
    wake = suspension.wake
    return wake if suspension.wait.kind == "sleep" or wake != NEVER_US else None


def _grouped(
    suspensions: Sequence[Suspension], key: Callable[[Suspension], Hashable]
) -> dict[Any, list[Suspension]]:
    groups: dict[Any, list[Suspension]] = {}
    for suspension in suspensions:
        groups.setdefault(key(suspension), []).append(suspension)
    return groups


def _record(tx: Tx, ids: list[int], stamp: int | None, wait: WaitSpec, deadline: int | None) -> list[Row]:
    """The wait as reached by each job of `ids`: its kind, prompt and choices; its deadline as
    first fixed. (job id, the value sent already, if any) for each."""
    return tx(tx.sql.REACH, {"ids": ids, "name": wait.name, "kind": wait.kind, "prompt": wait.prompt,
                             "choices": wait.choices, "deadline": deadline, "now": stamp})  # fmt: skip


def _lock_claim(tx: Tx, claim: Claim, name: str) -> None:
    if not tx(tx.sql.LOCK_CLAIM, claim):
        raise LeaseLost(
            f"job {claim['id']} cannot wait for {name!r}: its claim is gone (timed out, cancelled, or "
            "taken by another worker)"
        )


def _suspend(tx: Tx, claim: Claim, wake: int, left: int = 0, when: str | None = None) -> Reached:
    if not tx(tx.sql.SUSPEND, {**claim, "wake": wake, "left": left, "when": when}):
        raise LeaseLost(f"job {claim['id']} cannot wait: its claim is gone")
    return Reached("suspended")


def _reach_jobs(tx: Tx, claim: Claim, wait: WaitSpec) -> Reached:
    """`wait_for_jobs`: `after=` decided at run time. The jobs become the job's parents (the
    edges a graph draws); while some are unfinished it waits, counted down by the cascade that
    finishes them (storage/cascade.py), in the same transactions."""
    job_id = int(str(claim["id"]))
    jobs = sorted(set(wait.jobs))
    # The jobs are marked as having children (so none finishes unseen) and locked before the job
    # itself: the order a finishing job's cascade takes them in, so the two never deadlock.
    found = tx(tx.sql.LINK_PARENTS, {"ids": jobs})
    _lock_claim(tx, claim, wait.name)
    missing = sorted(set(jobs) - {int(row[0]) for row in found})
    if missing:
        raise JobNotFound(f"no job with id {missing[0]}: job {job_id} cannot wait for it")
    if job_id in jobs:
        raise InvalidArgument(f"job {job_id} cannot wait for itself")
    rule = When(wait.when or When.ALL_SUCCEEDED)
    change = initial(rule, [(int(i), State(s), r) for i, s, r in found])
    if change.state is State.PENDING:
        return Reached("done")
    _record(tx, [job_id], claim["now"], wait, None)
    for parent in jobs:
        tx(tx.sql.INSERT_EDGE, {"parent": parent, "child": job_id})
    _suspend(tx, claim, NEVER_US, change.left, rule.value)
    if change.state is State.UPSTREAM_FAILED:  # one failed as it may not: never runs again
        root = change.root or job_id
        states = {int(i): State(s) for i, s, _ in found}
        error = doomed_error(root, states.get(root, State.DEAD))
        tx(tx.sql.DOOM, {"id": job_id, "left": 0, "root": root, "error": error, "now": claim["now"]})
        return Reached("doomed")
    return Reached("suspended")


def send(tx: Tx, job_ids: Sequence[int], name: str, value: str, by: str, stamp: int | None) -> list[bool]:
    """Record `value` (JSON) under `name` for each job of `job_ids` (ascending: rows are locked in
    that order); True for each job it woke. Every job is checked before anything is written."""
    # One job (q.send) by its id, several (send_many) by a list: a list costs SQLite a JSON parse.
    sql = tx.sql
    one = len(job_ids) == 1
    jobs = {"id": job_ids[0]} if one else {"ids": list(job_ids)}
    lock, named, write, wake = (
        (sql.LOCK_JOB, sql.WAIT_NAMED, sql.SEND, sql.WAKE_SENT)
        if one
        else (sql.LOCK_JOBS, sql.WAITS_NAMED, sql.SEND_MANY, sql.WAKE_SENT_MANY)
    )
    # Locked first, read after, in two statements: on PostgreSQL a read joined to the lock would
    # see the waits as they were when it began, before a suspension it waited for committed.
    states = {int(i): State(s) for i, s in tx(lock, jobs)}
    waits = {int(row[0]): row[1:] for row in tx(named, {**jobs, "name": name})}
    for job_id in job_ids:
        status = states.get(job_id)
        if status is None:
            raise JobNotFound(f"no job with id {job_id}")
        if status in FINISHED:
            raise InvalidTransition(
                f"job {job_id} is {status.value}: a value can be sent only to a job that has not finished"
            )
        kind, choices, sent, expired = waits.get(job_id, (None, None, None, None))
        if kind in ("sleep", "jobs"):
            raise InvalidArgument(f"{name!r} of job {job_id} is a {kind}, not a wait for a value")
        if expired is not None:
            raise InvalidArgument(f"the wait {name!r} of job {job_id} expired; it takes no value now")
        if sent is not None:
            raise InvalidArgument(f"a value was sent to job {job_id} as {name!r} already: {sent}")
        if not accepts(choices, value):
            raise InvalidArgument(
                f"job {job_id} waits for one of {', '.join(map(json.dumps, json.loads(choices)))} "
                f"as {name!r}, not {value}"
            )
    tx(write, {**jobs, "name": name, "value": value, "by": by, "now": stamp})
    wakeable = [i for i in job_ids if states[i] is State.WAITING and waits.get(i, ("",))[0] == "event"]
    if not wakeable:
        return [False] * len(job_ids)
    to_wake = {"id": wakeable[0]} if one else {"ids": wakeable}
    woken = {int(row[0]) for row in tx(wake, {**to_wake, "now": stamp, "wake": True})}
    return [job_id in woken for job_id in job_ids]
