"""The rules that must run inside SQL, written once for both backends.

Each fragment is built from `nbqueue.jobs` when this module loads, in SQL that
SQLite and PostgreSQL read alike, and both backends paste the same text into
their fixed statements and partial indexes (SQLite uses a partial index only
when a query repeats its WHERE clause verbatim). `tests/test_rules_in_sql.py`
checks that both backends' statements carry them; the contract suite, run on both
backends, that they behave the same.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..jobs import CLAIMABLE, FINISHED, UNFINISHED, State, sources
from ..signing import NONCE_CHARS, VERSION


def status_in(states: Iterable[State], column: str = "status") -> str:
    """`status IN ('a', 'b')` for a fixed set of states."""
    return f"{column} IN ({', '.join(repr(s.value) for s in states)})"


#: A claim takes jobs in these states (and the claim index holds only them).
CLAIMABLE_SQL = status_in(CLAIMABLE)
#: Jobs in these states hold their idempotency key (a partial unique index).
UNFINISHED_SQL = status_in(UNFINISHED)
#: Only these may be deleted or purged.
FINISHED_SQL = status_in(FINISHED)
#: `cancel` moves jobs from these states.
CANCELLABLE_SQL = status_in(sources(State.CANCELLED, "cancel"))
#: `requeue` moves jobs from these states.
REQUEUEABLE_SQL = status_in(sources(State.PENDING, "requeue"))
#: `replay` moves jobs from these states (a completed one too: its steps run again).
REPLAYABLE_SQL = status_in((*sources(State.PENDING, "requeue"), *sources(State.PENDING, "replay")))
#: Every state, for the CHECK constraint.
ANY_STATE_SQL = status_in(State)
#: The CHECK and the key's index as versions 1 to 11 wrote them (before `waiting`): history,
#: so that a queue made today passes through the same schema an older nbqueue left behind.
ANY_STATE_V11_SQL = status_in(s for s in State if s is not State.WAITING)
UNFINISHED_V11_SQL = status_in(s for s in UNFINISHED if s is not State.WAITING)
#: Pending jobs per queue and task (the same text for both engines: it takes no parameter).
PENDING_PER_TASK = (
    "SELECT queue, task, count(*) FROM nbqueue_jobs WHERE status = 'pending' GROUP BY queue, task"
)
#: A term PostgreSQL evaluates once, before any row (a one-time filter): with no limit defined,
#: reading what waits on limits scans nothing (else a board's refresh reads every pending job).
NO_LIMITS_NO_SCAN = "EXISTS (SELECT 1 FROM nbqueue_limits)"


def key_is_free(chosen: str) -> str:
    """A requeued job must not take a key an unfinished job holds, nor may two requeued
    jobs share one: of the `chosen` jobs (a condition on `twin`) with the same key, only
    the oldest comes back. Evaluated against the table as it was before the statement.
    """
    return (
        "(nbqueue_jobs.key IS NULL OR (NOT EXISTS (SELECT 1 FROM nbqueue_jobs held "
        f"WHERE held.key = nbqueue_jobs.key AND {status_in(UNFINISHED, 'held.status')}) "
        "AND nbqueue_jobs.id = (SELECT min(twin.id) FROM nbqueue_jobs twin WHERE twin.key = nbqueue_jobs.key "
        f"AND {status_in(sources(State.PENDING, 'requeue'), 'twin.status')} AND {chosen})))"
    )


#: Candidates a claim under limits weighs: the best due job of each (queue, set of keys).
HEADS = 64

#: Characters of error text a listing reads (the end, where the exception is).
BRIEF_ERROR = 2000

#: The order claims take jobs in: higher priority, then earlier run_at, then first in.
CLAIM_ORDER = "priority DESC, run_at, id"

# -- attempts (schema version 8) -----------------------------------------------------------

#: The outcomes of an attempt that count as a failure (q.activity's `failed`, history's `failures`).
FAILED_OUTCOMES = ("failed", "dead", "timeout", "lost")
FAILED_OUTCOMES_SQL = f"outcome IN ({', '.join(repr(o) for o in FAILED_OUTCOMES)})"
#: How the job's new row names the attempt that just ended (in a trigger: `old` and `new` are the
#: job's row before and after), as of schema version 8 (history: the version 11 triggers replace
#: it). A lost claim and a timeout were told by the error text the manager wrote
#: (policy.LEASE_EXPIRED, policy.worker_gone, the worker's "timed out after ...").
ATTEMPT_OUTCOME_SQL = (
    "CASE WHEN new.status = 'completed' THEN 'completed' WHEN new.status = 'cancelled' THEN 'cancelled' "
    "WHEN new.status = 'pending' THEN CASE WHEN new.snoozes > old.snoozes THEN 'snoozed' ELSE 'released' END "
    "WHEN new.error LIKE 'lease expired%' OR new.error LIKE 'lost: %' THEN 'lost' "
    "WHEN new.error LIKE 'timed out%' THEN 'timeout' "
    "WHEN new.status = 'dead' THEN 'dead' ELSE 'failed' END"
)
#: As of version 11: a failure that says more than its state (lost, timeout) is stored as a value
#: by the write that ends the attempt (`failed_as`); otherwise the state it moved to says it.
ATTEMPT_OUTCOME_V11_SQL = (
    "CASE WHEN new.status = 'completed' THEN 'completed' WHEN new.status = 'cancelled' THEN 'cancelled' "
    "WHEN new.status = 'pending' THEN CASE WHEN new.snoozes > old.snoozes THEN 'snoozed' ELSE 'released' END "
    "WHEN new.failed_as IS NOT NULL THEN new.failed_as "
    "WHEN new.status = 'dead' THEN 'dead' ELSE 'failed' END"
)
#: As of version 12: a run that ended in a wait (running -> waiting) is "suspended", not an attempt.
ATTEMPT_OUTCOME_V12_SQL = (
    f"CASE WHEN new.status = 'waiting' THEN 'suspended' ELSE {ATTEMPT_OUTCOME_V11_SQL} END"
)
#: The error an ended attempt keeps (the job's, already capped; none for a success or a hand-back).
ATTEMPT_ERROR_SQL = (
    "CASE WHEN new.status IN ('completed', 'cancelled') "
    "OR (new.status = 'pending' AND new.snoozes = old.snoozes) THEN NULL ELSE new.error END"
)
#: As of version 12: a suspended run keeps no error either.
ATTEMPT_ERROR_V12_SQL = f"CASE WHEN new.status = 'waiting' THEN NULL ELSE {ATTEMPT_ERROR_SQL} END"
#: A waiting job's wake-up time (run_at) when only a send or its jobs wake it: 9999-01-01 UTC,
#: after every real time (the index of waiting jobs by run_at finds the due ones first), and
#: still a date Python can read.
NEVER_US = 253_370_764_800_000_000


def signed_run(row: str) -> tuple[str, str]:
    """For the triggers that bind a signed job's nonce to its run (nbqueue.trust): the condition
    that `row` ("new") carries a current signature ("2.<nonce>.<hmac>"), and its nonce."""
    return (
        f"substr({row}.signature, 1, {len(VERSION) + 1}) = '{VERSION}.'",
        f"substr({row}.signature, {len(VERSION) + 2}, {NONCE_CHARS})",
    )


#: A job that leaves for these states has ended its signed run: the same nonce never runs again.
RUN_ENDED_SQL = status_in((State.COMPLETED, State.DEAD, State.CANCELLED), "new.status")
