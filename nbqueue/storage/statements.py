"""The statements both backends mean alike, written once and rendered per dialect at import.

A statement is written here in a neutral form: `:name` is a parameter, `:name::type` a
parameter whose type PostgreSQL must be told, `IN [:name::type]` a list bound as one value,
and `{d.now}`, `{d.wake}` and the like are the few fragments a `Dialect` spells its own way
(the clock, the wake-up, locking and planner hints). `build(dialect, written)` renders them
into a `Statements`, a frozen record with one typed attribute per statement the shared storage
(`storage.sql`, `storage.cascade`) runs, so a statement a dialect lacks is an error at import
and under mypy, never a lookup by name at run time. What a dialect writes in its own words
(statements whose shape differs, not only their spelling) it passes in as `Written`.
`tests/test_storage_dialects.py` checks that the two renderings differ only where the
dialect says.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

from ..jobs import COLUMNS, UNFINISHED, State
from .cascade_statements import cascade_statements
from .dialect import Dialect
from .rules import (
    CANCELLABLE_SQL,
    FAILED_OUTCOMES_SQL,
    PENDING_PER_TASK,
    REPLAYABLE_SQL,
    REQUEUEABLE_SQL,
    UNFINISHED_SQL,
    key_is_free,
    status_in,
)
from .wait_statements import wait_statements

Params = dict[str, Any]
Row = tuple[Any, ...]


class Tx:
    """One open write transaction: `tx(statement, params)` runs a statement in it and gives its
    rows; `tx.sql` are its dialect's statements, `tx.raw` its connection (or cursor)."""

    __slots__ = ("raw", "run", "sql")

    def __init__(self, run: Callable[[str, Params], list[Row]], sql: Statements, raw: Any) -> None:
        self.run = run
        self.sql = sql
        self.raw = raw

    def __call__(self, statement: str, params: Params) -> list[Row]:
        return self.run(statement, params)


@dataclass(frozen=True, slots=True)
class Written:
    """The statements a dialect writes in its own words (their shape differs, not only their
    spelling), in the neutral parameter style, which `build` renders."""

    COUNTS: str
    QUEUES: str
    DELETE: str
    PURGE: str
    DEFINE_LIMIT: str
    LIMITS: str
    WAITING_PER_KEY: str
    LIMITED_WAITING_IN_QUEUES: str
    LIMITED_WAITING_IN_ANY_QUEUE: str
    NEXT_DUE_IN_QUEUES: str
    NEXT_DUE_IN_ANY_QUEUE: str
    # Claims: the best due job (one statement); under limits, the best due job of each (queue,
    # set of keys) with the time, the keys' states (locked), the units running jobs hold, and
    # the chosen job taken (if it is still claimable: none where another claim took it first).
    CLAIM_FROM_QUEUES: str
    CLAIM_FROM_ANY_QUEUE: str
    HEADS_IN_QUEUES: str
    HEADS_IN_ANY_QUEUE: str
    LOCK_KEYS: str
    IN_FLIGHT: str
    TAKE_ID: str
    # The next candidates of a head's (queue, set of keys), in claim order, due by :moment; and
    # the ones chosen of them, taken at once (those still claimable).
    NEXT_OF_GATE: str
    TAKE_IDS: str
    EMIT: str  # a run's items into its stream (their list is bound each backend's way)


@dataclass(frozen=True, slots=True)
class Statements(Written):
    """Every statement the shared storage runs, in one dialect: those its dialect writes in its
    own words (Written, rendered) and those written once, below."""

    dialect: Dialect
    # jobs read
    GET: str
    GET_MANY: str
    EXPIRED: str
    RUNNING_ON: str
    CLAIMS: str
    ROWS: dict[tuple[bool, bool, bool], str]  # (by status, by queue, brief) -> statement
    SEARCH: dict[tuple[bool, bool, bool], str]  # the same, of the jobs a search finds
    SEARCH_COUNT: dict[tuple[bool, bool], str]  # (by status, by queue) -> how many it finds
    DEAD_SINCE: str
    TASK_NAMES: str
    PENDING_PER_TASK: str
    # a claim's outcome
    HEARTBEAT: str
    FAIL: str
    FAIL_LINKED: str
    FAIL_EXPIRED: str
    SNOOZE: str
    RELEASE: str
    UNCLAIM: str
    FORGET_ATTEMPT: str
    REFUSE: str
    PROGRESS: str
    BURY: str
    # operator verbs
    CANCEL: str
    REQUEUE_IDS: str
    REQUEUE_DEAD: str
    REPLAY: str
    DELETE: str
    PURGE: str
    SIGN: str
    REPIN: str
    IDENTITY_VALUE: str
    RUNS: str
    VOUCH: str
    WAKE: str
    # attempts
    ATTEMPTS: str
    ACTIVITY: str
    FAILURES: str
    # periodic schedules and stored schedules
    PERIODIC_SLOT: str
    PERIODIC_START: str
    PERIODIC_MOVE: str
    SAVE_SCHEDULE: str
    SCHEDULES: str
    DELETE_SCHEDULE: str
    FORGET_SLOT: str
    # limits
    DEFINE_LIMIT: str
    PAUSE: str
    RESUME: str
    SET_TAT: str
    LIMITS: str
    WAITING_PER_KEY: str
    # dependencies, families and workflows (storage/cascade.py)
    HELD_KEY: str
    LINK_PARENTS: str
    ORIGIN_HELD: str
    NEW_WORKFLOW: str
    INSERT_LINKED: str
    FAMILY_OF: str
    GROW_FAMILY: str
    FAMILY_SIZE: str
    MADE_BY: str
    INSERT_EDGE: str
    CHILDREN_BLOCKED: str
    CHILDREN_COUNTED: str
    CHILD_GROUPS: str
    UNBLOCK_GROUP: str
    SET_LEFT_GROUP: str
    CHILDREN_WAITING: str
    SET_LEFT: str
    UNBLOCK: str
    UNBLOCK_MANY: str
    DOOM: str
    WAITS_FOR: str
    PARENTS_OF: str
    SETTLE: str
    DOOMED_BY: str
    REARM: str
    EDGES_OF: str
    IN_WORKFLOW: str
    # jobs that wait (storage/waits.py)
    LOCK_CLAIM: str
    LOCK_JOB: str
    LOCK_JOBS: str
    WAIT_OF: str
    PEEK_WAITS: str
    WAIT_NAMED: str
    WAITS_NAMED: str
    REACH: str
    DROP_SENT: str
    EXPIRE: str
    SEND: str
    SEND_MANY: str
    SUSPEND: str
    SUSPEND_MANY: str
    WAKE_SENT: str
    WAKE_SENT_MANY: str
    WAKE_DUE: str
    NEXT_WAKE: str
    WAITS: str
    FORGET_EXPIRIES: str
    FORGET_WAITS: str
    FORGET_CHILDREN: str
    # streams (nbqueue.emit)
    TRIM_STREAM: str
    STREAM_ITEMS: str
    STREAM_HEAD: str
    STREAM_LAST: str
    FORGET_STREAM: str
    # steps and files
    STEP_VALUES: str
    RECORD_STEP: str
    STILL_CLAIMED: str
    STEP_OF: str
    STEPS: str
    STEP_PREVIEWS: str
    FORGET_STEPS: str
    SAVE_FILE: str
    LOAD_FILE: str
    FILE_NAMES: str
    # After a lost reply (PostgreSQL): did the write commit? Each reads back what its write
    # leaves behind, with the same parameters; a first value that is true means it did.
    INSERTED: str
    CLAIMED: str
    FAILED: str
    SNOOZED: str
    RELEASED: str
    CANCELLED: str
    REQUEUED: str
    PERIODIC_MOVED: str
    SIGNED_AS: str
    REPINNED: str
    FILE_SAVED: str
    SCHEDULE_GONE: str


#: The columns a new job is written with, in the order of INSERT_LINKED's values (and of the
#: backends' own INSERT): NewJob's fields of the same names.
NEW_COLUMNS = (
    *("queue", "task", "payload", "priority", "key", "max_retries"),
    *("timeout", "backoff", "signature", "limits", "gate"),
)
JOB_COLUMNS = ", ".join(COLUMNS)
#: The text a search looks in (storage.sql.search): the task's name, key, arguments, error, output
#: and result.
SEARCHED_COLUMNS = ("task", "key", "payload", "error", "output", "result")
LIVE_CLAIM = "id = :id AND status = 'running' AND attempts = :attempt"
# What a listing shows: no payload, result or output, and only the end of the error text.
_BRIEF = {"payload": "'null'", "result": "NULL", "output": "NULL"}
# A parent a child still needs (to be waited for, or for its result at the claim): kept by purge.
PARENT_NEEDED = (
    "EXISTS (SELECT 1 FROM nbqueue_edges e JOIN nbqueue_jobs c ON c.id = e.child "
    f"WHERE e.parent = nbqueue_jobs.id AND {status_in(UNFINISHED, 'c.status')})"
)


def build(d: Dialect, w: Written) -> Statements:
    """Every statement of the shared storage in dialect `d` (once, at import)."""
    r = d.render
    now = d.now
    select = f"SELECT {JOB_COLUMNS} FROM nbqueue_jobs"
    brief = ", ".join(_BRIEF.get(c, d.tail_error if c == "error" else c) for c in COLUMNS)
    failed = f":status = '{State.FAILED.value}'"

    def fail(lease_test: str, guard: str = "") -> str:
        return r(
            "UPDATE nbqueue_jobs SET status = :status, error = :error, output = :output, failed_as = "
            ":failed_as, "
            f"retries = retries + CASE WHEN {failed} THEN 1 ELSE 0 END, "  # a dead job used its retries
            f"run_at = CASE WHEN {failed} THEN {now} + :delay ELSE run_at END, "
            f"finished_at = CASE WHEN {failed} THEN NULL ELSE {now} END, updated_at = {now}, "
            f"lease_until = NULL WHERE {LIVE_CLAIM} AND {lease_test}{guard} RETURNING has_children{d.wake}"
        )

    requeue = (
        f"UPDATE nbqueue_jobs SET status = 'pending', updated_at = {now}, retries = 0, run_at = {now}, "
        "lease_until = NULL, worker_id = NULL, finished_at = NULL"
    )
    chosen = "twin.id IN [:ids::bigint]"
    every_dead = "twin.status = 'dead'"
    status_in_list = "status IN [:statuses::text]"
    where = {
        (False, False): "",
        (True, False): f"WHERE {status_in_list}",
        (False, True): "WHERE queue = :queue",
        (True, True): f"WHERE {status_in_list} AND queue = :queue",
    }
    page = "ORDER BY id DESC LIMIT :limit OFFSET :offset"
    also = {  # the filters after a search's own test
        (False, False): "",
        (True, False): f" AND {status_in_list}",
        (False, True): " AND queue = :queue",
        (True, True): f" AND {status_in_list} AND queue = :queue",
    }
    text_holds = " OR ".join(f"{c} {d.like} :pattern::text ESCAPE '!'" for c in SEARCHED_COLUMNS)
    newest = "id > (SELECT id FROM nbqueue_jobs ORDER BY id DESC LIMIT 1) - :scanned::bigint"

    def found(columns: str, clause: str) -> str:
        return (
            f"SELECT {columns} FROM nbqueue_jobs WHERE id = :id::bigint{clause} UNION "
            f"SELECT {columns} FROM nbqueue_jobs WHERE :pattern::text IS NOT NULL AND {newest} "
            f"AND ({text_holds}){clause}"
        )

    attempt_of = "SELECT 1 FROM nbqueue_jobs WHERE id = :id AND attempts = :attempt AND status"
    own: dict[str, Any] = {f.name: r(getattr(w, f.name)) for f in fields(Written)}
    return Statements(
        **own,
        dialect=d,
        GET=r(f"{select} WHERE id = :id"),
        GET_MANY=r(f"{select} WHERE id IN [:ids::bigint]"),
        EXPIRED=r(
            f"{select} WHERE status = 'running' AND lease_until <= {now} ORDER BY lease_until LIMIT :limit"
        ),
        # The running jobs a host's workers claimed (with the claiming process): recovered when it is gone.
        RUNNING_ON=r(
            f"SELECT {JOB_COLUMNS}, worker_pid FROM nbqueue_jobs WHERE status = 'running' AND worker_host = "
            ":host"
        ),
        CLAIMS=r(
            "SELECT id, status, worker_host, worker_pid, lease_until, lease_us FROM nbqueue_jobs WHERE id IN "
            "[:ids::bigint]"
        ),
        # A page of jobs, newest first: one statement per filter, so each can use its index.
        ROWS={
            (*filters, short): r(
                f"SELECT {brief if short else JOB_COLUMNS} FROM nbqueue_jobs {clause} {page}"
            )
            for filters, clause in where.items()
            for short in (False, True)
        },
        # A search: the job of that id, and the newest `scanned` jobs whose text holds the pattern.
        SEARCH={
            (*filters, short): r(f"{found(brief if short else JOB_COLUMNS, clause)} {page}")
            for filters, clause in also.items()
            for short in (False, True)
        },
        SEARCH_COUNT={
            filters: r(f"SELECT count(*) FROM ({found('id', clause)}) AS found")
            for filters, clause in also.items()
        },
        DEAD_SINCE=r("SELECT count(*) FROM nbqueue_jobs WHERE status = 'dead' AND finished_at > :since"),
        TASK_NAMES=r(
            f"SELECT DISTINCT task FROM nbqueue_jobs WHERE task IS NOT NULL AND {status_in_list} "
            "AND (signature IS NOT NULL OR NOT :signed) ORDER BY task"
        ),
        PENDING_PER_TASK=PENDING_PER_TASK,
        HEARTBEAT=r(
            f"UPDATE nbqueue_jobs SET lease_until = {now} + coalesce(:lease::bigint, lease_us), updated_at = "
            f"{now} "
            f"WHERE {LIVE_CLAIM} AND lease_until > {now} RETURNING lease_until"
        ),
        # A job with children finishes in a transaction that also resolves them (storage/cascade.py):
        # FAIL leaves it alone (a dead one), and the storage then takes FAIL_LINKED in a transaction.
        FAIL=fail(f"lease_until > {now}", f" AND (has_children = 0 OR :status = '{State.FAILED.value}')"),
        FAIL_LINKED=fail(f"lease_until > {now}"),
        FAIL_EXPIRED=fail(f"lease_until <= {now}"),
        SNOOZE=r(
            "UPDATE nbqueue_jobs SET status = 'pending', error = :error, output = :output, snoozes = snoozes "
            "+ 1, "
            f"run_at = {now} + :delay, lease_until = NULL, worker_id = NULL, updated_at = {now} "
            f"WHERE {LIVE_CLAIM} AND lease_until > {now} RETURNING 1{d.wake}"
        ),
        RELEASE=r(
            "UPDATE nbqueue_jobs SET status = 'pending', lease_until = NULL, worker_id = NULL, updated_at = "
            f"{now} "
            f"WHERE {LIVE_CLAIM} RETURNING 1{d.wake}"
        ),
        # A claim undone (its job never started): the attempt it counted, and the record of it, go.
        UNCLAIM=r(
            "UPDATE nbqueue_jobs SET status = 'pending', attempts = attempts - 1, lease_until = NULL, "
            "worker_id = NULL, worker_host = NULL, worker_pid = NULL, started_at = NULL, "
            f"updated_at = {now} WHERE {LIVE_CLAIM} AND started_at = :started RETURNING 1{d.wake}"
        ),
        FORGET_ATTEMPT=r("DELETE FROM nbqueue_attempts WHERE job_id = :id AND attempt = :attempt"),
        REFUSE=r(
            "UPDATE nbqueue_jobs SET status = 'pending', signature = NULL, error = :error, lease_until = "
            "NULL, "
            f"worker_id = NULL, updated_at = {now} WHERE {LIVE_CLAIM} RETURNING 1"
        ),
        PROGRESS=r(
            "UPDATE nbqueue_jobs SET progress_done = :done, progress_total = :total, "
            f"progress_message = :message, updated_at = {now} WHERE {LIVE_CLAIM} RETURNING 1"
        ),
        BURY=r(
            "UPDATE nbqueue_jobs SET status = 'dead', error = :error, failed_as = NULL, lease_until = NULL, "
            f"finished_at = {now}, updated_at = {now} WHERE id = :id AND status = 'running' RETURNING "
            "has_children"
        ),
        CANCEL=r(
            f"UPDATE nbqueue_jobs SET status = 'cancelled', updated_at = {now}, lease_until = NULL, "
            f"finished_at = {now} WHERE id IN [:ids::bigint] AND {CANCELLABLE_SQL} RETURNING id, has_children"
        ),
        REQUEUE_IDS=r(
            f"{requeue} WHERE id IN [:ids::bigint] AND {REQUEUEABLE_SQL} AND {key_is_free(chosen)} "
            f"RETURNING id{d.wake}"
        ),
        REQUEUE_DEAD=r(f"{requeue} WHERE status = 'dead' AND {key_is_free(every_dead)} RETURNING id{d.wake}"),
        REPLAY=r(
            f"{requeue} WHERE id IN [:ids::bigint] AND {REPLAYABLE_SQL} AND {key_is_free(chosen)} "
            f"RETURNING id{d.wake}"
        ),
        SIGN=r(
            "UPDATE nbqueue_jobs SET signature = :signature WHERE id = :id AND payload = :payload "
            f"AND signature {d.same} :old::text RETURNING 1"
        ),
        # A finished job's pinned input replaced (requeue with the current notebook), re-signed with it.
        REPIN=r(
            "UPDATE nbqueue_jobs SET payload = :payload, signature = :signature WHERE id = :id "
            "AND payload = :old AND status IN ('dead', 'cancelled') RETURNING 1"
        ),
        IDENTITY_VALUE="SELECT value FROM nbqueue_info WHERE name = 'identity'",
        RUNS=r(
            "SELECT nonce, job_id, finished_at, result_mac FROM nbqueue_runs WHERE nonce IN [:nonces::text]"
        ),
        VOUCH=r(
            "UPDATE nbqueue_runs SET result_mac = :mac WHERE nonce = :nonce AND job_id = :id RETURNING 1"
        ),
        WAKE=r(f"SELECT 1{d.wake}"),
        ATTEMPTS=r(
            "SELECT attempt, started_at, finished_at, worker_id, host, pid, outcome, error FROM "
            "nbqueue_attempts "
            "WHERE job_id = :id ORDER BY attempt"
        ),
        # Attempts that ended since then, per minute: read by the finished_at index only.
        ACTIVITY=r(
            "SELECT finished_at / 60000000, sum(CASE WHEN outcome = 'completed' THEN 1 ELSE 0 END), "
            f"sum(CASE WHEN {FAILED_OUTCOMES_SQL} THEN 1 ELSE 0 END), "
            "sum(CASE WHEN outcome IN ('snoozed', 'released') THEN 1 ELSE 0 END) FROM nbqueue_attempts "
            "WHERE finished_at >= :since AND finished_at IS NOT NULL GROUP BY 1"
        ),
        FAILURES=r(
            "SELECT job_id, count(*) FROM nbqueue_attempts WHERE job_id IN [:ids::bigint] AND "
            f"{FAILED_OUTCOMES_SQL} "
            "GROUP BY job_id"
        ),
        PERIODIC_SLOT=r("SELECT last_slot FROM nbqueue_periodic WHERE name = :name"),
        PERIODIC_START=r(
            "INSERT INTO nbqueue_periodic VALUES (:name, :slot) ON CONFLICT (name) DO NOTHING RETURNING 1"
        ),
        PERIODIC_MOVE=r(
            "UPDATE nbqueue_periodic SET last_slot = :slot WHERE name = :name AND last_slot = :last "
            "RETURNING 1"
        ),
        # Schedules kept in the database (notebook schedules): any worker allowed to run them keeps them.
        SAVE_SCHEDULE=r(
            "INSERT INTO nbqueue_schedules VALUES (:name, :task, :payload, :spec, :options, :signature, "
            f"{now}) "
            "ON CONFLICT (name) DO UPDATE SET task = excluded.task, payload = excluded.payload, "
            "spec = excluded.spec, options = excluded.options, signature = excluded.signature, "
            "updated_at = excluded.updated_at"
        ),
        SCHEDULES="SELECT name, task, payload, spec, options, signature FROM nbqueue_schedules ORDER BY name",
        DELETE_SCHEDULE=r("DELETE FROM nbqueue_schedules WHERE name = :name RETURNING 1"),
        FORGET_SLOT=r(
            "DELETE FROM nbqueue_periodic WHERE name = 'schedule:' || :name"
        ),  # manager.STORED_PREFIX
        # A pause until a time (pause) or for a while from now (snooze); a later pause already there is kept.
        PAUSE=r(
            "INSERT INTO nbqueue_limits (key, paused_until, paused_why, updated_at) "
            f"SELECT k.key, coalesce(:until::bigint, {now} + :delay::bigint), :why, {now} "
            "FROM (SELECT DISTINCT value AS key FROM EACH [:keys::text]) k "
            "WHERE true ON CONFLICT (key) DO UPDATE SET "
            f"paused_until = {d.greatest}(coalesce(nbqueue_limits.paused_until, 0), excluded.paused_until), "
            "paused_why = excluded.paused_why, updated_at = excluded.updated_at"
        ),
        RESUME=r(
            f"UPDATE nbqueue_limits SET paused_until = NULL, paused_why = NULL, updated_at = {now} "
            "WHERE key = :key RETURNING 1"
        ),
        SET_TAT=r("UPDATE nbqueue_limits SET tat = :tat WHERE key = :key"),
        HELD_KEY=r(f"SELECT id FROM nbqueue_jobs WHERE key = :key AND {UNFINISHED_SQL}"),
        LINK_PARENTS=r(
            "UPDATE nbqueue_jobs SET has_children = 1 WHERE id IN [:ids::bigint] RETURNING id, status, "
            "root_cause"
        ),
        ORIGIN_HELD=r("SELECT id FROM nbqueue_jobs WHERE origin = :origin"),
        NEW_WORKFLOW=r(
            f"INSERT INTO nbqueue_workflows (name, created_at) VALUES (:name, {now}) RETURNING id"
        ),
        INSERT_LINKED=r(
            f"INSERT INTO nbqueue_jobs (status, {', '.join(NEW_COLUMNS)}, run_at, created_at, updated_at, "
            "parents_left, wait_when, root_cause, error, finished_at, origin, workflow, enqueue_token, "
            "spawned_by, "
            f"family) VALUES (:status, {', '.join(':' + c for c in NEW_COLUMNS)}, "
            f"coalesce(:run_at_us::bigint, {now} + :delay_us), {now}, {now}, :left, :wait_when, :root, "
            ":error, "
            f"CASE WHEN :status = 'upstream_failed' THEN {now} END, :origin, :workflow, :token::bigint, "
            ":spawner::bigint, :family::bigint) RETURNING id"
        ),
        # A job made by a running job joins that job's family, counted on the family's first job (its
        # row locked until the transaction ends: two jobs joining at once are counted one after the other).
        FAMILY_OF=r("SELECT coalesce(family, id), status FROM nbqueue_jobs WHERE id = :spawner"),
        GROW_FAMILY=r(
            "UPDATE nbqueue_jobs SET family_size = family_size + 1 WHERE id = :family AND family_size < "
            ":most "
            "RETURNING family_size"
        ),
        FAMILY_SIZE=r("SELECT family_size FROM nbqueue_jobs WHERE id = :family"),
        # Every job made by these jobs while they ran, and by those, however deep (spawned_by's index).
        MADE_BY=r(
            "WITH RECURSIVE made(id) AS (SELECT value FROM EACH [:ids::bigint] "
            f"UNION SELECT j.id FROM made {d.ordered_join} nbqueue_jobs j{d.spawned_index} ON j.spawned_by = "
            "made.id "
            "WHERE j.spawned_by IS NOT NULL) SELECT id FROM made WHERE id NOT IN [:ids::bigint]"
        ),
        INSERT_EDGE=r(
            "INSERT INTO nbqueue_edges (parent, child) VALUES (:parent, :child) ON CONFLICT DO NOTHING"
        ),
        **cascade_statements(d),
        IN_WORKFLOW=r("SELECT id FROM nbqueue_jobs WHERE workflow = :workflow ORDER BY id"),
        **wait_statements(r, now, d.lock_row, d.wake, d.unindexed, LIVE_CLAIM),
        # A stream keeps at most :bound bytes of its newest items (and always the newest one).
        TRIM_STREAM=r(
            "DELETE FROM nbqueue_stream WHERE job_id = :id AND attempt = :run AND seq <= (SELECT seq "
            "FROM (SELECT seq, sum(bytes) OVER (ORDER BY seq DESC) AS tail FROM nbqueue_stream "
            "WHERE job_id = :id AND attempt = :run) AS t WHERE tail > :bound ORDER BY seq DESC LIMIT 1) "
            "AND seq < (SELECT seq FROM nbqueue_stream WHERE job_id = :id AND attempt = :run "
            "ORDER BY seq DESC LIMIT 1)"
        ),
        STREAM_ITEMS=r(
            "SELECT seq, value FROM nbqueue_stream WHERE job_id = :id AND attempt = :run AND seq > :after "
            "ORDER BY seq LIMIT :limit"
        ),
        # A job's newest attempt that emitted, and the first item it keeps (before: dropped).
        STREAM_HEAD=r(
            "SELECT attempt, min(seq) FROM nbqueue_stream WHERE job_id = :id AND attempt = (SELECT attempt "
            "FROM nbqueue_stream WHERE job_id = :id AND attempt <= :most ORDER BY attempt DESC LIMIT 1) "
            "GROUP BY attempt"
        ),
        STREAM_LAST=r(
            "SELECT s.job_id, s.value FROM nbqueue_stream s WHERE s.job_id IN [:ids::bigint] AND s.seq = "
            "(SELECT l.seq FROM nbqueue_stream l WHERE l.job_id = s.job_id AND l.attempt = s.attempt "
            "ORDER BY l.seq DESC LIMIT 1) AND s.attempt = (SELECT a.attempt FROM nbqueue_stream a "
            "WHERE a.job_id = s.job_id ORDER BY a.attempt DESC LIMIT 1)"
        ),
        FORGET_STREAM=r("DELETE FROM nbqueue_stream WHERE job_id IN [:ids::bigint]"),
        # A replay from a step makes afresh the jobs the job made after it (they keep their rows).
        FORGET_CHILDREN=r(
            "UPDATE nbqueue_jobs SET origin = NULL WHERE spawned_by = :id AND origin IS NOT NULL "
            "AND created_at >= :since"
        ),
        STEP_VALUES=r("SELECT name, value FROM nbqueue_steps WHERE job_id = :id AND error IS NULL"),
        # A step is recorded only under the caller's live lease: a stale worker records nothing. A value
        # recorded first stays (a parallel twin gets it); a failure is replaced by the next run's outcome.
        RECORD_STEP=r(
            "INSERT INTO nbqueue_steps (job_id, name, value, error, attempt, started_at, finished_at) "
            f"SELECT :id, :name, :value, :error, :attempt, :started, {now} FROM nbqueue_jobs "
            f"WHERE {LIVE_CLAIM} AND lease_until > {now} ON CONFLICT (job_id, name) DO UPDATE SET "
            "value = excluded.value, error = excluded.error, attempt = excluded.attempt, "
            "started_at = excluded.started_at, finished_at = excluded.finished_at "
            "WHERE nbqueue_steps.error IS NOT NULL RETURNING 1"
        ),
        STILL_CLAIMED=r(f"SELECT 1 FROM nbqueue_jobs WHERE {LIVE_CLAIM}"),
        STEP_OF=r("SELECT value FROM nbqueue_steps WHERE job_id = :id AND name = :name AND error IS NULL"),
        STEPS=r(
            "SELECT name, value, error, attempt, started_at, finished_at FROM nbqueue_steps "
            "WHERE job_id = :id ORDER BY finished_at, name"
        ),
        STEP_PREVIEWS=r(
            "SELECT name, substr(value, 1, :chars), error, attempt, started_at, finished_at "
            "FROM nbqueue_steps WHERE job_id = :id ORDER BY finished_at, name"
        ),
        FORGET_STEPS=r("DELETE FROM nbqueue_steps WHERE job_id = :id AND finished_at >= :since RETURNING 1"),
        # A file is written (or replaced) only under the caller's live lease: a stale worker writes nothing.
        SAVE_FILE=r(
            "INSERT INTO nbqueue_files (job_id, name, content, attempt, updated_at) "
            f"SELECT :id, :name, :content, :attempt, {now} FROM nbqueue_jobs "
            f"WHERE {LIVE_CLAIM} AND lease_until > {now} ON CONFLICT (job_id, name) DO UPDATE SET "
            "content = excluded.content, attempt = excluded.attempt, updated_at = excluded.updated_at "
            "RETURNING 1"
        ),
        LOAD_FILE=r("SELECT content FROM nbqueue_files WHERE job_id = :id AND name = :name"),
        FILE_NAMES=r(
            "SELECT job_id, name FROM nbqueue_files WHERE job_id IN [:ids::bigint] ORDER BY job_id, name"
        ),
        CLAIMED=r(f"{select} WHERE status = 'running' AND claim_token = :token"),
        INSERTED=r("SELECT id, created_at FROM nbqueue_jobs WHERE enqueue_token = :token ORDER BY id"),
        FAILED=r(f"{attempt_of} = :status"),
        SNOOZED=r(f"{attempt_of} = 'pending'"),
        RELEASED=r(f"{attempt_of} = 'pending'"),
        CANCELLED=r("SELECT id FROM nbqueue_jobs WHERE id IN [:ids::bigint] AND status = 'cancelled'"),
        REQUEUED=r(
            "SELECT id, 0 FROM nbqueue_jobs WHERE id IN [:ids::bigint] AND status = 'pending' AND retries = 0"
        ),
        PERIODIC_MOVED=r("SELECT 1 FROM nbqueue_periodic WHERE name = :name AND last_slot = :slot"),
        SIGNED_AS=r("SELECT 1 FROM nbqueue_jobs WHERE id = :id AND signature = :signature"),
        REPINNED=r("SELECT payload = :payload FROM nbqueue_jobs WHERE id = :id"),
        FILE_SAVED=r(
            "SELECT 1 FROM nbqueue_files WHERE job_id = :id AND name = :name AND attempt = :attempt "
            "AND content = :content"
        ),
        SCHEDULE_GONE=r("SELECT NOT EXISTS (SELECT 1 FROM nbqueue_schedules WHERE name = :name)"),
    )
