"""PostgreSQL: the schema's version history and every statement, fixed text made once at import.

Every connection sets `search_path` to the queue's schema, so statements name
tables without a schema and never change at run time. Parameters are named
(`%(now)s`); lists are passed as arrays. Time is the server's `now()` unless
the caller passes its own clock (`%(now)s` not null). The rules shared with
SQLite come from `storage.rules`.
"""

from __future__ import annotations

from ..jobs import COLUMNS, UNFINISHED, State
from .rules import (
    ANY_STATE_SQL,
    ATTEMPT_ERROR_SQL,
    ATTEMPT_OUTCOME_SQL,
    BRIEF_ERROR,
    CANCELLABLE_SQL,
    CLAIM_ORDER,
    CLAIMABLE_SQL,
    FAILED_OUTCOMES_SQL,
    FINISHED_SQL,
    HEADS,
    NO_LIMITS_NO_SCAN,
    REPLAYABLE_SQL,
    REQUEUEABLE_SQL,
    RUN_ENDED_SQL,
    UNFINISHED_SQL,
    key_is_free,
    signed_run,
    status_in,
)

SCHEMA_VERSION = 10
SIGNED, NONCE = signed_run("new")
SERVER_NOW = "(extract(epoch from now()) * 1000000)::bigint"
NOW = f"coalesce(%(now)s::bigint, {SERVER_NOW})"  # the caller's clock if given, else the server's
CLOCK = f"c AS (SELECT {NOW} AS now)"
# Wakes the queue's listening workers when the transaction commits (once, however often).
_WAKE = "(SELECT count(*) FROM (SELECT pg_notify(%(channel)s, '') WHERE %(wake)s) n)"

#: Each version's statements, run in order under an advisory lock. History: never edited.
#: `{s}` is the schema (quoted), filled in once per migration, never in a queue verb.
MIGRATIONS: dict[int, list[str]] = {
    1: [
        f"""CREATE TABLE {{s}}.nbqueue_jobs (
            id BIGSERIAL PRIMARY KEY,
            status TEXT NOT NULL CHECK ({ANY_STATE_SQL}),
            queue TEXT NOT NULL,
            task TEXT,
            payload TEXT NOT NULL,
            priority BIGINT NOT NULL DEFAULT 0,
            key TEXT,
            retries INTEGER NOT NULL DEFAULT 0,
            max_retries INTEGER NOT NULL,
            attempts INTEGER NOT NULL DEFAULT 0,
            error TEXT,
            run_at BIGINT NOT NULL,
            created_at BIGINT NOT NULL,
            updated_at BIGINT NOT NULL,
            started_at BIGINT,
            finished_at BIGINT,
            lease_until BIGINT,
            lease_us BIGINT,
            worker_id TEXT,
            timeout DOUBLE PRECISION,
            output TEXT,
            backoff TEXT,
            result TEXT
        )""",
        f"CREATE INDEX nbqueue_claim_queue ON {{s}}.nbqueue_jobs (queue, {CLAIM_ORDER}) "
        f"WHERE {CLAIMABLE_SQL}",
        f"CREATE INDEX nbqueue_claim_any ON {{s}}.nbqueue_jobs ({CLAIM_ORDER}) WHERE {CLAIMABLE_SQL}",
        f"CREATE INDEX nbqueue_due ON {{s}}.nbqueue_jobs (run_at) WHERE {CLAIMABLE_SQL}",
        f"CREATE UNIQUE INDEX nbqueue_key ON {{s}}.nbqueue_jobs (key) "
        f"WHERE key IS NOT NULL AND {UNFINISHED_SQL}",
        "CREATE INDEX nbqueue_lease ON {s}.nbqueue_jobs (lease_until) WHERE status = 'running'",
        "CREATE INDEX nbqueue_status ON {s}.nbqueue_jobs (status, queue, id)",
    ],
    # Progress reported from inside a job; periodic schedules' last enqueued slot.
    2: [
        "ALTER TABLE {s}.nbqueue_jobs ADD COLUMN progress_done DOUBLE PRECISION, "
        "ADD COLUMN progress_total DOUBLE PRECISION, ADD COLUMN progress_message TEXT",
        "CREATE TABLE {s}.nbqueue_periodic (name TEXT PRIMARY KEY, last_slot BIGINT NOT NULL)",
    ],
    # The same meaning as SQLite's version 3: claims seek only the per-queue index, pages by
    # (status, id), and counts are kept as jobs change. Counts are kept without a hot row:
    # each change appends to nbqueue_count_changes, and readers fold those into nbqueue_counts.
    3: [
        "DROP INDEX {s}.nbqueue_claim_any",
        "DROP INDEX {s}.nbqueue_due",
        "DROP INDEX {s}.nbqueue_status",
        "CREATE INDEX nbqueue_status ON {s}.nbqueue_jobs (status, id)",
        "CREATE TABLE {s}.nbqueue_counts (queue TEXT NOT NULL, status TEXT NOT NULL, n BIGINT NOT NULL, "
        "PRIMARY KEY (queue, status))",
        "CREATE TABLE {s}.nbqueue_count_changes "
        "(queue TEXT NOT NULL, status TEXT NOT NULL, n INTEGER NOT NULL)",
        "LOCK TABLE {s}.nbqueue_jobs IN SHARE MODE",
        "INSERT INTO {s}.nbqueue_counts SELECT queue, status, count(*) FROM {s}.nbqueue_jobs GROUP BY 1, 2",
        """CREATE FUNCTION {s}.nbqueue_count_change() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF TG_OP = 'INSERT' THEN
                INSERT INTO {s}.nbqueue_count_changes VALUES (NEW.queue, NEW.status, 1);
            ELSIF TG_OP = 'DELETE' THEN
                INSERT INTO {s}.nbqueue_count_changes VALUES (OLD.queue, OLD.status, -1);
            ELSE
                INSERT INTO {s}.nbqueue_count_changes
                    VALUES (OLD.queue, OLD.status, -1), (NEW.queue, NEW.status, 1);
            END IF;
            RETURN NULL;
        END $$""",
        "CREATE TRIGGER nbqueue_count_insert AFTER INSERT ON {s}.nbqueue_jobs "
        "FOR EACH ROW EXECUTE FUNCTION {s}.nbqueue_count_change()",
        "CREATE TRIGGER nbqueue_count_delete AFTER DELETE ON {s}.nbqueue_jobs "
        "FOR EACH ROW EXECUTE FUNCTION {s}.nbqueue_count_change()",
        "CREATE TRIGGER nbqueue_count_update AFTER UPDATE OF status ON {s}.nbqueue_jobs "
        "FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status) "
        "EXECUTE FUNCTION {s}.nbqueue_count_change()",
    ],
    # Signatures of code jobs (nbqueue.signing). Tokens the client writes so that, having lost
    # a reply, it can tell whether its write committed before doing it again (a lost reply
    # must never duplicate or strand a job).
    4: [
        "ALTER TABLE {s}.nbqueue_jobs ADD COLUMN signature TEXT, ADD COLUMN enqueue_token BIGINT, "
        "ADD COLUMN claim_token BIGINT",
        "CREATE INDEX nbqueue_enqueue_token ON {s}.nbqueue_jobs (enqueue_token) "
        "WHERE enqueue_token IS NOT NULL",
    ],
    # Limits: the keys (and units) a job holds; the claim index groups jobs by their set of
    # keys (the gate), so a full key's waiting jobs never stand in the way of other work.
    5: [
        "ALTER TABLE {s}.nbqueue_jobs ADD COLUMN limits TEXT, ADD COLUMN gate TEXT NOT NULL DEFAULT '', "
        "ADD COLUMN snoozes INTEGER NOT NULL DEFAULT 0",
        "DROP INDEX {s}.nbqueue_claim_queue",
        f"CREATE INDEX nbqueue_claim ON {{s}}.nbqueue_jobs (queue, gate, {CLAIM_ORDER}) "
        f"WHERE {CLAIMABLE_SQL}",
        "CREATE TABLE {s}.nbqueue_limits (key TEXT PRIMARY KEY, concurrency INTEGER, rate DOUBLE PRECISION, "
        "burst DOUBLE PRECISION NOT NULL DEFAULT 0, tat BIGINT NOT NULL DEFAULT 0, paused_until BIGINT, "
        "paused_why TEXT, updated_at BIGINT NOT NULL)",
    ],
    # Dependencies between jobs and durable steps (the same meaning as SQLite's version 6).
    6: [
        "ALTER TABLE {s}.nbqueue_jobs DROP CONSTRAINT nbqueue_jobs_status_check",
        f"ALTER TABLE {{s}}.nbqueue_jobs ADD CONSTRAINT nbqueue_jobs_status_check CHECK ({ANY_STATE_SQL})",
        "ALTER TABLE {s}.nbqueue_jobs ADD COLUMN parents_left INTEGER NOT NULL DEFAULT 0, "
        "ADD COLUMN wait_when TEXT, ADD COLUMN root_cause BIGINT, "
        "ADD COLUMN has_children INTEGER NOT NULL DEFAULT 0, ADD COLUMN origin TEXT, "
        "ADD COLUMN workflow BIGINT",
        "DROP INDEX {s}.nbqueue_key",
        f"CREATE UNIQUE INDEX nbqueue_key ON {{s}}.nbqueue_jobs (key) "
        f"WHERE key IS NOT NULL AND {UNFINISHED_SQL}",
        "CREATE UNIQUE INDEX nbqueue_origin ON {s}.nbqueue_jobs (origin) WHERE origin IS NOT NULL",
        "CREATE TABLE {s}.nbqueue_edges "
        "(parent BIGINT NOT NULL, child BIGINT NOT NULL, PRIMARY KEY (parent, child))",
        "CREATE INDEX nbqueue_edges_child ON {s}.nbqueue_edges (child, parent)",
        "CREATE TABLE {s}.nbqueue_steps (job_id BIGINT NOT NULL, name TEXT NOT NULL, value TEXT, error TEXT, "
        "attempt INTEGER NOT NULL, started_at BIGINT NOT NULL, finished_at BIGINT NOT NULL, "
        "PRIMARY KEY (job_id, name))",
        "CREATE TABLE {s}.nbqueue_workflows "
        "(id BIGSERIAL PRIMARY KEY, name TEXT NOT NULL, created_at BIGINT NOT NULL)",
    ],
    # Files a job keeps (the same meaning as SQLite's version 7); deleted with the job.
    7: [
        "CREATE TABLE {s}.nbqueue_files (job_id BIGINT NOT NULL, name TEXT NOT NULL, content TEXT NOT NULL, "
        "attempt INTEGER NOT NULL, updated_at BIGINT NOT NULL, PRIMARY KEY (job_id, name))",
        "CREATE TABLE {s}.nbqueue_schedules (name TEXT PRIMARY KEY, task TEXT NOT NULL, "
        "payload TEXT NOT NULL, spec TEXT NOT NULL, options TEXT NOT NULL, signature TEXT, "
        "updated_at BIGINT NOT NULL)",
    ],
    # Every attempt recorded, and the claiming worker's host and process on the job (the same
    # meaning as SQLite's version 8); the attempts are deleted with the job (_FORGET_GONE).
    8: [
        "ALTER TABLE {s}.nbqueue_jobs ADD COLUMN worker_host TEXT, ADD COLUMN worker_pid INTEGER",
        "CREATE TABLE {s}.nbqueue_attempts (job_id BIGINT NOT NULL, attempt INTEGER NOT NULL, "
        "started_at BIGINT NOT NULL, finished_at BIGINT, worker_id TEXT, host TEXT, pid INTEGER, "
        "outcome TEXT, error TEXT, PRIMARY KEY (job_id, attempt))",
        "CREATE INDEX nbqueue_attempts_finished ON {s}.nbqueue_attempts (finished_at) "
        "WHERE finished_at IS NOT NULL",
        f"""CREATE FUNCTION {{s}}.nbqueue_attempt() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF NEW.status = 'running' THEN
                INSERT INTO {{s}}.nbqueue_attempts (job_id, attempt, started_at, worker_id, host, pid)
                    VALUES (NEW.id, NEW.attempts, NEW.started_at, NEW.worker_id, NEW.worker_host,
                    NEW.worker_pid) ON CONFLICT (job_id, attempt) DO NOTHING;
            ELSE
                UPDATE {{s}}.nbqueue_attempts SET finished_at = NEW.updated_at,
                    outcome = {ATTEMPT_OUTCOME_SQL}, error = {ATTEMPT_ERROR_SQL}
                    WHERE job_id = OLD.id AND attempt = OLD.attempts;
            END IF;
            RETURN NULL;
        END $$""",
        "CREATE TRIGGER nbqueue_attempt AFTER UPDATE OF status ON {s}.nbqueue_jobs FOR EACH ROW "
        "WHEN (OLD.status IS DISTINCT FROM NEW.status "
        "AND (OLD.status = 'running' OR NEW.status = 'running')) "
        "EXECUTE FUNCTION {s}.nbqueue_attempt()",
    ],
    # Signed jobs bound to one run (the same meaning as SQLite's version 9); a signature also
    # covers the schema's name, so a row copied into another schema never verifies.
    9: [
        "CREATE TABLE {s}.nbqueue_info (name TEXT PRIMARY KEY, value TEXT NOT NULL)",
        "INSERT INTO {s}.nbqueue_info "
        "VALUES ('identity', md5(random()::text || clock_timestamp()::text || pg_backend_pid()::text))",
        "CREATE TABLE {s}.nbqueue_runs (nonce TEXT PRIMARY KEY, job_id BIGINT NOT NULL, finished_at BIGINT, "
        "result_mac TEXT)",
        # As its owner: a role allowed to change jobs (cancel one) needs no right on nbqueue_runs,
        # so the owner can keep others from rewriting it (which would let a run start again).
        f"""CREATE FUNCTION {{s}}.nbqueue_run() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER
        SET search_path = pg_catalog, pg_temp AS $$
        BEGIN
            IF NEW.status = 'running' THEN
                INSERT INTO {{s}}.nbqueue_runs (nonce, job_id) VALUES ({NONCE}, NEW.id)
                    ON CONFLICT (nonce) DO NOTHING;
            ELSE
                INSERT INTO {{s}}.nbqueue_runs AS r (nonce, job_id, finished_at)
                    VALUES ({NONCE}, NEW.id, NEW.updated_at)
                    ON CONFLICT (nonce) DO UPDATE SET finished_at = EXCLUDED.finished_at
                    WHERE r.job_id = EXCLUDED.job_id;
            END IF;
            RETURN NULL;
        END $$""",
        "CREATE TRIGGER nbqueue_run AFTER UPDATE OF status ON {s}.nbqueue_jobs FOR EACH ROW "
        f"WHEN (OLD.status IS DISTINCT FROM NEW.status AND (NEW.status = 'running' OR {RUN_ENDED_SQL}) "
        f"AND {SIGNED}) EXECUTE FUNCTION {{s}}.nbqueue_run()",
    ],
    # Families: the job that made a job while it ran (its origin names it), and the first job of
    # its line (the family), whose family_size counts the jobs made in the family (at most the
    # queue's family_limit). Cancelling a job cancels what it made, found by spawned_by.
    10: [
        "ALTER TABLE {s}.nbqueue_jobs ADD COLUMN spawned_by BIGINT, ADD COLUMN family BIGINT, "
        "ADD COLUMN family_size INTEGER NOT NULL DEFAULT 0",
        "UPDATE {s}.nbqueue_jobs SET spawned_by = split_part(origin, ':', 1)::bigint "
        "WHERE origin IS NOT NULL",
        "CREATE INDEX nbqueue_spawned_by ON {s}.nbqueue_jobs (spawned_by) WHERE spawned_by IS NOT NULL",
    ],
}

SELECT_JOBS = f"SELECT {', '.join(COLUMNS)} FROM nbqueue_jobs"
# What a listing shows: no payload, result or output, and only the end of the error text.
BRIEF = {"payload": "'null'", "result": "NULL", "output": "NULL", "error": f"right(error, {BRIEF_ERROR})"}
SELECT_BRIEF = f"SELECT {', '.join(BRIEF.get(c, c) for c in COLUMNS)} FROM nbqueue_jobs"
RETURNING_JOB = "RETURNING " + ", ".join(f"nbqueue_jobs.{c}" for c in COLUMNS)
# Tasks this claim may take; of `signed` tasks, only jobs that carry a signature (checked after).
TASK_ALLOWED = (
    "(%(tasks)s::text[] IS NULL OR task = ANY(%(tasks)s::text[])) AND (signature IS NOT NULL "
    "OR %(signed)s::text[] IS NULL OR NOT task = ANY(%(signed)s::text[]))"
)

# -- the queues to look in: named ones, or every queue that has claimable jobs ------------

NAMED_QUEUES = "waiting(name) AS (SELECT unnest(%(queues)s::text[]))"
# A skip scan of the claim index: one seek per distinct queue, however many jobs wait.
EVERY_WAITING_QUEUE = (
    f"waiting(name) AS (SELECT (SELECT min(queue) FROM nbqueue_jobs WHERE {CLAIMABLE_SQL}) "
    f"UNION ALL SELECT (SELECT min(queue) FROM nbqueue_jobs WHERE {CLAIMABLE_SQL} AND queue > waiting.name) "
    "FROM waiting WHERE waiting.name IS NOT NULL)"
)


def _pick(waiting: str, gate: str = "", limit: str = "1") -> str:
    """CTEs that pick the best due jobs (`limit` of them): each queue's first ones (locked,
    skipping locked rows), then the best of those."""
    return (
        f"{waiting}, pick AS (SELECT k.id FROM waiting CROSS JOIN LATERAL (SELECT id, priority, run_at "
        f"FROM nbqueue_jobs WHERE {CLAIMABLE_SQL} AND queue = waiting.name AND gate = '' "
        f"AND run_at <= (SELECT now FROM c) AND {TASK_ALLOWED}{gate} ORDER BY {CLAIM_ORDER} LIMIT {limit} "
        "FOR UPDATE SKIP LOCKED) k "
        f"WHERE waiting.name IS NOT NULL ORDER BY k.priority DESC, k.run_at, k.id LIMIT {limit})"
    )


def _take(chosen: str, match: str = "=") -> str:
    """The claim's UPDATE of the `chosen` job (a SQL expression for its id; with `match`
    "IN", for the ids of several)."""
    return (
        "UPDATE nbqueue_jobs SET status = 'running', attempts = attempts + 1, worker_id = %(worker)s, "
        "worker_host = %(host)s, worker_pid = %(pid)s, claim_token = %(token)s, "
        "lease_until = c.now + %(lease)s, lease_us = %(lease)s, started_at = c.now, updated_at = c.now, "
        "progress_done = NULL, progress_total = NULL, progress_message = NULL "
        f"FROM c WHERE id {match} {chosen} {RETURNING_JOB}"
    )


TAKE = _take("(SELECT id FROM pick)")
LIVE_CLAIM = "id = %(id)s AND status = 'running' AND attempts = %(attempt)s"

# -- dependencies and steps (storage/cascade.py runs these by name) ------------------------

IDS = "ANY(%(ids)s::bigint[])"
# A parent a child still needs (to be waited for, or for its result at the claim): kept by purge.
PARENT_NEEDED = (
    "EXISTS (SELECT 1 FROM nbqueue_edges e JOIN nbqueue_jobs c ON c.id = e.child "
    f"WHERE e.parent = nbqueue_jobs.id AND {status_in(UNFINISHED, 'c.status')})"
)
LINK_PARENTS = f"UPDATE nbqueue_jobs SET has_children = 1 WHERE id = {IDS} RETURNING id, status, root_cause"
ORIGIN_HELD = "SELECT id FROM nbqueue_jobs WHERE origin = %(origin)s"
NEW_WORKFLOW = f"INSERT INTO nbqueue_workflows (name, created_at) VALUES (%(name)s, {NOW}) RETURNING id"
INSERT_LINKED = (
    f"WITH {CLOCK} INSERT INTO nbqueue_jobs (status, queue, task, payload, priority, key, max_retries, "
    "run_at, created_at, updated_at, timeout, backoff, signature, limits, gate, parents_left, wait_when, "
    "root_cause, error, finished_at, origin, workflow, enqueue_token, spawned_by, family) SELECT %(status)s, "
    "%(queue)s, "
    "%(task)s, %(payload)s, %(priority)s, %(key)s, %(max_retries)s, coalesce(%(run_at_us)s, c.now + "
    "%(delay_us)s), c.now, c.now, %(timeout)s, %(backoff)s, %(signature)s, %(limits)s, %(gate)s, %(left)s, "
    "%(wait_when)s, %(root)s, %(error)s, CASE WHEN %(status)s = 'upstream_failed' THEN c.now END, "
    "%(origin)s, %(workflow)s, %(token)s, %(spawner)s, %(family)s FROM c RETURNING id"
)
# A job made by a running job joins that job's family, counted on the family's first job (its
# row locked until the transaction ends: two jobs joining at once are counted one after the other).
FAMILY_OF = "SELECT coalesce(family, id), status FROM nbqueue_jobs WHERE id = %(spawner)s"
GROW_FAMILY = (
    "UPDATE nbqueue_jobs SET family_size = family_size + 1 WHERE id = %(family)s AND family_size < %(most)s "
    "RETURNING family_size"
)
FAMILY_SIZE = "SELECT family_size FROM nbqueue_jobs WHERE id = %(family)s"
# Every job made by these jobs while they ran, and by those, however deep (spawned_by's index).
MADE_BY = (
    "WITH RECURSIVE made(id) AS (SELECT unnest(%(ids)s::bigint[]) UNION SELECT j.id FROM made "
    f"JOIN nbqueue_jobs j ON j.spawned_by = made.id) SELECT id FROM made WHERE NOT id = {IDS}"
)
INSERT_EDGE = (
    "INSERT INTO nbqueue_edges (parent, child) VALUES (%(parent)s, %(child)s) ON CONFLICT DO NOTHING"
)
# The children are locked (in id order) before their counts are read: two parents finishing at
# once queue up on the child, and the second reads the count the first left (read committed
# re-reads a locked row), so no count-down is lost.
# A cascade walks the edges from the parents, then each child by its id: the state is tested as
# `(...) IS TRUE`, which no index answers, so the planner never starts from every blocked job in
# the state index (its statistics lag a workflow written a moment ago), each level of a chain.
CHILDREN = "nbqueue_edges e JOIN nbqueue_jobs c ON c.id = e.child"
CHILDREN_BLOCKED = (
    f"SELECT e.parent, c.id, c.wait_when, c.parents_left FROM {CHILDREN} WHERE e.parent = {IDS} "
    "AND (c.status = 'blocked') IS TRUE ORDER BY c.id, e.parent FOR UPDATE OF c"
)
# Children that wait for their parents, or were let go by them and have not started: a parent
# that comes back (requeue, replay) makes them count afresh. Locked like CHILDREN_BLOCKED.
CHILDREN_WAITING = (
    f"SELECT c.id FROM {CHILDREN} WHERE e.parent = {IDS} AND (c.status IN ('blocked', 'pending')) IS TRUE "
    "ORDER BY c.id FOR UPDATE OF c"
)
SET_LEFT = "UPDATE nbqueue_jobs SET parents_left = %(left)s WHERE id = %(id)s AND status = 'blocked'"
UNBLOCK = (
    f"WITH {CLOCK} UPDATE nbqueue_jobs SET status = 'pending', parents_left = %(left)s, "
    "run_at = greatest(run_at, c.now), updated_at = c.now FROM c WHERE id = %(id)s AND status = 'blocked' "
    f"RETURNING {_WAKE}"
)
DOOM = (
    f"WITH {CLOCK} UPDATE nbqueue_jobs SET status = 'upstream_failed', parents_left = %(left)s, "
    "root_cause = %(root)s, error = %(error)s, finished_at = c.now, updated_at = c.now FROM c "
    "WHERE id = %(id)s AND status = 'blocked' RETURNING has_children"
)
WAITS_FOR = "SELECT wait_when FROM nbqueue_jobs WHERE id = %(id)s"
# A re-armed job's parents are held (shared) while it is settled: a parent finishing meanwhile
# either commits first (and is read finished) or waits, then sees the job blocked and counts down.
PARENTS_OF = (
    "SELECT p.id, p.status, p.root_cause FROM nbqueue_edges e JOIN nbqueue_jobs p ON p.id = e.parent "
    "WHERE e.child = %(id)s ORDER BY p.id FOR SHARE OF p"
)
SETTLE = (
    f"WITH {CLOCK} UPDATE nbqueue_jobs SET status = %(status)s, parents_left = %(left)s, "
    "root_cause = %(root)s, error = coalesce(%(error)s, error), "
    "finished_at = CASE WHEN %(status)s = 'upstream_failed' THEN c.now END, updated_at = c.now FROM c "
    f"WHERE id = %(id)s RETURNING {_WAKE}"
)
DOOMED_BY = (
    f"SELECT c.id FROM {CHILDREN} WHERE e.parent = {IDS} AND (c.status = 'upstream_failed') IS TRUE "
    "AND c.root_cause = %(root)s"
)
REARM = (
    f"WITH {CLOCK} UPDATE nbqueue_jobs SET status = 'blocked', root_cause = NULL, error = NULL, "
    "finished_at = NULL, "
    "updated_at = c.now FROM c WHERE id = %(id)s AND status = 'upstream_failed'"
)
EDGES_OF = (
    f"SELECT parent, child FROM nbqueue_edges WHERE child = {IDS} OR parent = {IDS} ORDER BY child, parent"
)
IN_WORKFLOW = "SELECT id FROM nbqueue_jobs WHERE workflow = %(workflow)s ORDER BY id"
STEP_VALUES = "SELECT name, value FROM nbqueue_steps WHERE job_id = %(id)s AND error IS NULL"
# A step is recorded only under the caller's live lease: a stale worker records nothing. A value
# recorded first stays (a parallel twin gets it); a failure is replaced by the next run's outcome.
RECORD_STEP = (
    f"WITH {CLOCK} INSERT INTO nbqueue_steps (job_id, name, value, error, attempt, started_at, finished_at) "
    "SELECT %(id)s, %(name)s, %(value)s, %(error)s, %(attempt)s, %(started)s, c.now FROM nbqueue_jobs, c "
    f"WHERE {LIVE_CLAIM} AND lease_until > c.now ON CONFLICT (job_id, name) DO UPDATE SET "
    "value = excluded.value, error = excluded.error, attempt = excluded.attempt, "
    "started_at = excluded.started_at, finished_at = excluded.finished_at "
    "WHERE nbqueue_steps.error IS NOT NULL RETURNING 1"
)
STILL_CLAIMED = f"SELECT 1 FROM nbqueue_jobs WHERE {LIVE_CLAIM}"
STEP_OF = "SELECT value FROM nbqueue_steps WHERE job_id = %(id)s AND name = %(name)s AND error IS NULL"
STEPS = (
    "SELECT name, value, error, attempt, started_at, finished_at FROM nbqueue_steps WHERE job_id = %(id)s "
    "ORDER BY finished_at, name"
)
STEP_PREVIEWS = (
    "SELECT name, left(value, %(chars)s), error, attempt, started_at, finished_at "
    "FROM nbqueue_steps WHERE job_id = %(id)s ORDER BY finished_at, name"
)
FORGET_STEPS = "DELETE FROM nbqueue_steps WHERE job_id = %(id)s AND finished_at >= %(since)s RETURNING 1"
# A file is written (or replaced) only under the caller's live lease: a stale worker writes nothing.
SAVE_FILE = (
    f"WITH {CLOCK} INSERT INTO nbqueue_files (job_id, name, content, attempt, updated_at) "
    "SELECT %(id)s, %(name)s, %(content)s, %(attempt)s, c.now FROM nbqueue_jobs, c "
    f"WHERE {LIVE_CLAIM} AND lease_until > c.now ON CONFLICT (job_id, name) DO UPDATE SET "
    "content = excluded.content, attempt = excluded.attempt, updated_at = excluded.updated_at RETURNING 1"
)
# After a lost reply: is the file there as that write left it?
FILE_SAVED = (
    "SELECT 1 FROM nbqueue_files WHERE job_id = %(id)s AND name = %(name)s AND attempt = %(attempt)s "
    "AND content = %(content)s"
)
LOAD_FILE = "SELECT content FROM nbqueue_files WHERE job_id = %(id)s AND name = %(name)s"
# Schedules kept in the database (notebook schedules): any worker allowed to run them keeps them.
SAVE_SCHEDULE = (
    f"INSERT INTO nbqueue_schedules VALUES (%(name)s, %(task)s, %(payload)s, %(spec)s, %(options)s, "
    f"%(signature)s, {NOW}) ON CONFLICT (name) DO UPDATE SET task = excluded.task, "
    "payload = excluded.payload, spec = excluded.spec, options = excluded.options, "
    "signature = excluded.signature, updated_at = excluded.updated_at"
)
SCHEDULES = "SELECT name, task, payload, spec, options, signature FROM nbqueue_schedules ORDER BY name"
DELETE_SCHEDULE = (
    "WITH slot AS (DELETE FROM nbqueue_periodic WHERE name = 'schedule:' || %(name)s) "
    "DELETE FROM nbqueue_schedules WHERE name = %(name)s RETURNING 1"
)
SCHEDULE_GONE = "SELECT NOT EXISTS (SELECT 1 FROM nbqueue_schedules WHERE name = %(name)s)"
# A finished job's pinned input replaced (requeue with the current notebook), re-signed with it.
REPIN = (
    "UPDATE nbqueue_jobs SET payload = %(payload)s, signature = %(signature)s WHERE id = %(id)s "
    "AND payload = %(old)s AND status IN ('dead', 'cancelled') RETURNING 1"
)
REPINNED = "SELECT payload = %(payload)s FROM nbqueue_jobs WHERE id = %(id)s"
FILE_NAMES = f"SELECT job_id, name FROM nbqueue_files WHERE job_id = {IDS} ORDER BY job_id, name"
# A job with children finishes in a transaction that also resolves them (storage/cascade.py):
# the one-statement paths below leave it alone (`has_children = 0`), and the storage then
# takes the transactional path (the *_LINKED statements).
CHILDLESS = " AND has_children = 0"


def _done(guard: str) -> str:
    return (
        "done AS (UPDATE nbqueue_jobs SET status = 'completed', result = %(result)s, output = %(output)s, "
        f"finished_at = c.now, updated_at = c.now, lease_until = NULL FROM c WHERE {LIVE_CLAIM} "
        f"AND lease_until > c.now{guard} RETURNING nbqueue_jobs.id, nbqueue_jobs.has_children)"
    )


DONE = _done(CHILDLESS)


def _claim(waiting: str) -> str:
    return f"WITH RECURSIVE {CLOCK}, {_pick(waiting)} {TAKE}"


_DONE_EACH = (
    "unnest(%(ids)s::bigint[], %(attempts)s::int[], %(results)s::text[], %(outputs)s::text[]) "
    "AS d(id, attempt, result, output)"
)
# A batch of successes, each under its own live claim (needs `c`, the CLOCK).
_COMPLETE_EACH = (
    "UPDATE nbqueue_jobs AS j SET status = 'completed', result = d.result, output = d.output, "
    f"finished_at = c.now, updated_at = c.now, lease_until = NULL FROM c, {_DONE_EACH} "
    "WHERE j.id = d.id AND j.status = 'running' AND j.attempts = d.attempt AND j.lease_until > c.now"
)


def _complete_many_then_claim(waiting: str) -> str:
    # A worker's batch in one statement (one round trip, one commit): its successes that have
    # no children (those settle their children in a transaction of their own), then its next
    # %(claims)s claims. Each row: the ids completed, then a claimed job (or NULLs).
    return (
        f"WITH RECURSIVE {CLOCK}, done AS ({_COMPLETE_EACH} AND j.has_children = 0 RETURNING j.id), "
        f"{_pick(waiting, limit='%(claims)s')}, next AS ({_take('(SELECT id FROM pick)', 'IN')}) "
        "SELECT (SELECT coalesce(array_agg(id), '{}') FROM done), next.* FROM (SELECT 1) one "
        "LEFT JOIN next ON TRUE"
    )


def _next_due(waiting: str) -> str:
    return (
        f"WITH RECURSIVE {waiting} SELECT min(k.run_at) FROM waiting CROSS JOIN LATERAL (SELECT run_at "
        f"FROM nbqueue_jobs WHERE {CLAIMABLE_SQL} AND queue = waiting.name AND {TASK_ALLOWED} "
        "ORDER BY run_at LIMIT 1) k WHERE waiting.name IS NOT NULL"
    )


def _heads(waiting: str) -> str:
    # Every (queue, gate) with claimable jobs, by skip scans of the claim index, and the best
    # due job of each: the few candidates a claim under limits chooses from.
    pairs = (
        "pairs(queue, gate) AS (SELECT name, (SELECT min(gate) FROM nbqueue_jobs "
        f"WHERE {CLAIMABLE_SQL} AND queue = waiting.name) FROM waiting WHERE name IS NOT NULL "
        f"UNION ALL SELECT queue, (SELECT min(j.gate) FROM nbqueue_jobs j WHERE {CLAIMABLE_SQL} "
        "AND j.queue = pairs.queue AND j.gate > pairs.gate) FROM pairs WHERE gate IS NOT NULL)"
    )
    return (
        f"WITH RECURSIVE {CLOCK}, {waiting}, {pairs} SELECT (SELECT now FROM c), h.id, h.limits FROM pairs "
        "CROSS JOIN LATERAL (SELECT id, limits, priority, run_at FROM nbqueue_jobs j "
        f"WHERE {CLAIMABLE_SQL} AND j.queue = pairs.queue AND j.gate = pairs.gate "
        f"AND j.run_at <= (SELECT now FROM c) AND {TASK_ALLOWED} ORDER BY {CLAIM_ORDER} LIMIT 1) h "
        f"WHERE pairs.gate IS NOT NULL ORDER BY h.priority DESC, h.run_at, h.id LIMIT {HEADS}"
    )


def _limited_waiting(waiting: str) -> str:
    return (
        f"WITH RECURSIVE {waiting} SELECT count(*) FROM waiting WHERE name IS NOT NULL AND EXISTS "
        f"(SELECT 1 FROM nbqueue_jobs j WHERE {CLAIMABLE_SQL} AND j.queue = waiting.name AND j.gate > '')"
    )


CLAIM_FROM_QUEUES = _claim(NAMED_QUEUES)
CLAIM_FROM_ANY_QUEUE = _claim(EVERY_WAITING_QUEUE)
COMPLETE_MANY_THEN_CLAIM_FROM_QUEUES = _complete_many_then_claim(NAMED_QUEUES)
COMPLETE_MANY_THEN_CLAIM_FROM_ANY_QUEUE = _complete_many_then_claim(EVERY_WAITING_QUEUE)
HEADS_IN_QUEUES = _heads(NAMED_QUEUES)
HEADS_IN_ANY_QUEUE = _heads(EVERY_WAITING_QUEUE)
LIMITED_WAITING_IN_QUEUES = _limited_waiting(NAMED_QUEUES)
LIMITED_WAITING_IN_ANY_QUEUE = _limited_waiting(EVERY_WAITING_QUEUE)
# The job a claim under limits chose, if it is still claimable and no other claim holds it.
TAKE_ID = f"WITH {CLOCK} " + _take(
    f"(SELECT id FROM nbqueue_jobs WHERE id = %(chosen)s AND {CLAIMABLE_SQL} FOR UPDATE SKIP LOCKED)"
)

# -- limits --------------------------------------------------------------------------------

# The keys a claim weighs, locked in a fixed order (no deadlock): claims under one key take turns.
LOCK_KEYS = (
    "SELECT key, concurrency, rate, burst, tat, paused_until FROM nbqueue_limits "
    "WHERE key = ANY(%(keys)s::text[]) ORDER BY key FOR UPDATE"
)
# Units of each key that running jobs hold, counted from the jobs themselves (a crashed
# worker's units come back with its lease): only the running jobs are read.
IN_FLIGHT = (
    "SELECT held.key, sum(held.value::bigint) FROM nbqueue_jobs, jsonb_each_text(limits::jsonb) AS held "
    "WHERE status = 'running' AND limits IS NOT NULL AND held.key = ANY(%(keys)s::text[]) GROUP BY held.key"
)
SET_TAT = "UPDATE nbqueue_limits SET tat = %(tat)s WHERE key = %(key)s"
DEFINE_LIMIT = (
    f"WITH {CLOCK} INSERT INTO nbqueue_limits (key, concurrency, rate, burst, updated_at) "
    "SELECT %(key)s, %(concurrency)s, %(rate)s, %(burst)s, now FROM c ON CONFLICT (key) DO UPDATE SET "
    "concurrency = excluded.concurrency, rate = excluded.rate, burst = excluded.burst, "
    "updated_at = excluded.updated_at"
)
PAUSE = (
    f"WITH {CLOCK} INSERT INTO nbqueue_limits (key, paused_until, paused_why, updated_at) "
    "SELECT key, c.now + %(delay)s, %(why)s, c.now FROM c, unnest(%(keys)s::text[]) AS key "
    "ON CONFLICT (key) DO UPDATE SET "
    "paused_until = greatest(nbqueue_limits.paused_until, excluded.paused_until), "
    "paused_why = excluded.paused_why, updated_at = excluded.updated_at"
)
RESUME = (
    f"WITH {CLOCK} UPDATE nbqueue_limits SET paused_until = NULL, paused_why = NULL, updated_at = c.now "
    "FROM c WHERE key = %(key)s RETURNING 1"
)
LIMITS = (
    "SELECT key, concurrency, rate, burst, tat, paused_until, paused_why, "
    "(SELECT coalesce(sum(held.value::bigint), 0) FROM nbqueue_jobs, jsonb_each_text(limits::jsonb) AS held "
    "WHERE status = 'running' AND limits IS NOT NULL AND held.key = nbqueue_limits.key) "
    "FROM nbqueue_limits ORDER BY key"
)
WAITING_PER_KEY = (
    "SELECT held.key, count(*) FROM nbqueue_jobs, jsonb_each_text(limits::jsonb) AS held "
    f"WHERE {NO_LIMITS_NO_SCAN} AND {CLAIMABLE_SQL} AND gate > '' GROUP BY held.key"
)
COMPLETE = f"WITH {CLOCK}, {DONE} SELECT count(*) FROM done"
COMPLETE_LINKED = f"WITH {CLOCK}, {_done('')} SELECT has_children FROM done"
# A worker's batch of successes, each under its own live claim; and, after a lost reply, which
# of them are completed by that claim.
COMPLETE_MANY = f"WITH {CLOCK} {_COMPLETE_EACH} RETURNING j.id, j.has_children"
COMPLETED_MANY = (
    "SELECT j.id FROM nbqueue_jobs AS j, unnest(%(ids)s::bigint[], %(attempts)s::int[]) AS d(id, attempt) "
    "WHERE j.id = d.id AND j.attempts = d.attempt AND j.status = 'completed'"
)
NEXT_DUE_IN_QUEUES = _next_due(NAMED_QUEUES)
NEXT_DUE_IN_ANY_QUEUE = _next_due(EVERY_WAITING_QUEUE)

_NEW_COLUMNS = (
    "queue, task, payload, priority, key, max_retries, delay_us, run_at_us, timeout, backoff, signature, "
    "limits, gate"
)
# All rows in one INSERT ... SELECT FROM unnest: atomic, one round trip. A row whose key an
# unfinished job holds is skipped (the caller then reads that job's id).
INSERT = (
    f"WITH {CLOCK}, new AS (SELECT * FROM unnest(%(queue)s::text[], %(task)s::text[], "
    "%(payload)s::text[], %(priority)s::bigint[], %(key)s::text[], %(max_retries)s::int[], "
    "%(delay_us)s::bigint[], %(run_at_us)s::bigint[], %(timeout)s::float8[], %(backoff)s::text[], "
    "%(signature)s::text[], %(limits)s::text[], %(gate)s::text[]) "
    f"WITH ORDINALITY AS r({_NEW_COLUMNS}, n)), "
    "ins AS (INSERT INTO nbqueue_jobs (status, queue, task, payload, priority, key, max_retries, run_at, "
    "created_at, updated_at, timeout, backoff, signature, limits, gate, enqueue_token) SELECT 'pending', "
    "queue, task, payload, priority, key, max_retries, coalesce(run_at_us, c.now + delay_us), c.now, c.now, "
    "timeout, backoff, signature, limits, gate, %(token)s FROM new, c ORDER BY n "
    f"ON CONFLICT (key) WHERE key IS NOT NULL AND {UNFINISHED_SQL} DO NOTHING RETURNING id, created_at), "
    "woke AS (SELECT pg_notify(%(channel)s, '') WHERE EXISTS (SELECT 1 FROM ins)) "
    "SELECT id, created_at FROM ins, (SELECT count(*) FROM woke) w ORDER BY id"
)
HELD_KEY = f"SELECT id FROM nbqueue_jobs WHERE key = %(key)s AND {UNFINISHED_SQL}"

# After a lost reply: did the write commit? Each reads back what its write leaves behind, with
# the same parameters; a first value that is true means it did (and is the write's answer).
INSERTED = "SELECT id, created_at FROM nbqueue_jobs WHERE enqueue_token = %(token)s ORDER BY id"
CLAIMED = f"{SELECT_JOBS} WHERE status = 'running' AND claim_token = %(token)s"
COMPLETED = "SELECT 1 FROM nbqueue_jobs WHERE id = %(id)s AND attempts = %(attempt)s AND status = 'completed'"
FAILED = "SELECT 1 FROM nbqueue_jobs WHERE id = %(id)s AND attempts = %(attempt)s AND status = %(status)s"
RELEASED = "SELECT 1 FROM nbqueue_jobs WHERE id = %(id)s AND attempts = %(attempt)s AND status = 'pending'"
CANCELLED = "SELECT id FROM nbqueue_jobs WHERE id = ANY(%(ids)s::bigint[]) AND status = 'cancelled'"
REQUEUED = (
    "SELECT id, 0 FROM nbqueue_jobs WHERE id = ANY(%(ids)s::bigint[]) AND status = 'pending' AND retries = 0"
)
PERIODIC_MOVED = "SELECT 1 FROM nbqueue_periodic WHERE name = %(name)s AND last_slot = %(slot)s"

HEARTBEAT = (
    f"WITH {CLOCK} UPDATE nbqueue_jobs SET lease_until = c.now + coalesce(%(lease)s, lease_us), "
    f"updated_at = c.now FROM c WHERE {LIVE_CLAIM} AND lease_until > c.now RETURNING lease_until"
)


def _fail(lease_test: str, guard: str = "") -> str:
    failed = f"(%(status)s = '{State.FAILED.value}')"
    return (
        f"WITH {CLOCK} UPDATE nbqueue_jobs SET status = %(status)s, error = %(error)s, output = %(output)s, "
        f"retries = retries + {failed}::int, "
        f"run_at = CASE WHEN {failed} THEN c.now + %(delay)s ELSE run_at END, "
        f"finished_at = CASE WHEN {failed} THEN NULL ELSE c.now END, updated_at = c.now, lease_until = NULL "
        f"FROM c WHERE {LIVE_CLAIM} AND {lease_test}{guard} RETURNING {_WAKE}, nbqueue_jobs.has_children"
    )


FAIL = _fail("lease_until > c.now", f" AND (has_children = 0 OR %(status)s = '{State.FAILED.value}')")
FAIL_LINKED = _fail("lease_until > c.now")
FAIL_EXPIRED = _fail("lease_until <= c.now")
SNOOZE = (
    f"WITH {CLOCK} UPDATE nbqueue_jobs SET status = 'pending', error = %(error)s, output = %(output)s, "
    "snoozes = snoozes + 1, run_at = c.now + %(delay)s, lease_until = NULL, worker_id = NULL, "
    f"updated_at = c.now FROM c WHERE {LIVE_CLAIM} AND lease_until > c.now RETURNING {_WAKE}"
)
SNOOZED = "SELECT 1 FROM nbqueue_jobs WHERE id = %(id)s AND attempts = %(attempt)s AND status = 'pending'"
RELEASE = (
    f"WITH {CLOCK} UPDATE nbqueue_jobs SET status = 'pending', lease_until = NULL, worker_id = NULL, "
    f"updated_at = c.now FROM c WHERE {LIVE_CLAIM} RETURNING {_WAKE}"
)
# A claim undone (its job never started): the attempt it counted, and the record of it, go.
UNCLAIM = (
    f"WITH {CLOCK} UPDATE nbqueue_jobs SET status = 'pending', attempts = attempts - 1, "
    "lease_until = NULL, worker_id = NULL, worker_host = NULL, worker_pid = NULL, started_at = NULL, "
    f"updated_at = c.now FROM c WHERE {LIVE_CLAIM} AND started_at = %(started)s RETURNING {_WAKE}"
)
FORGET_ATTEMPT = "DELETE FROM nbqueue_attempts WHERE job_id = %(id)s AND attempt = %(attempt)s"
REFUSE = (
    f"WITH {CLOCK} UPDATE nbqueue_jobs SET status = 'pending', signature = NULL, error = %(error)s, "
    f"lease_until = NULL, worker_id = NULL, updated_at = c.now FROM c WHERE {LIVE_CLAIM} RETURNING 1"
)
SIGN = (
    "UPDATE nbqueue_jobs SET signature = %(signature)s WHERE id = %(id)s AND payload = %(payload)s "
    "AND signature IS NOT DISTINCT FROM %(old)s::text RETURNING 1"
)
SIGNED_AS = "SELECT true FROM nbqueue_jobs WHERE id = %(id)s AND signature = %(signature)s"  # a lost reply
IDENTITY_VALUE = "SELECT value FROM nbqueue_info WHERE name = 'identity'"
RUNS = "SELECT nonce, job_id, finished_at, result_mac FROM nbqueue_runs WHERE nonce = ANY(%(nonces)s::text[])"
VOUCH = "UPDATE nbqueue_runs SET result_mac = %(mac)s WHERE nonce = %(nonce)s AND job_id = %(id)s RETURNING 1"
BURY = (
    f"WITH {CLOCK} UPDATE nbqueue_jobs SET status = 'dead', error = %(error)s, lease_until = NULL, "
    "finished_at = c.now, updated_at = c.now FROM c WHERE id = %(id)s AND status = 'running' "
    "RETURNING has_children"
)
CANCEL = (
    f"WITH {CLOCK} UPDATE nbqueue_jobs SET status = 'cancelled', updated_at = c.now, lease_until = NULL, "
    f"finished_at = c.now FROM c WHERE id = ANY(%(ids)s::bigint[]) AND {CANCELLABLE_SQL} "
    "RETURNING id, has_children"
)
_REQUEUE_SET = (
    f"WITH {CLOCK}, moved AS (UPDATE nbqueue_jobs SET status = 'pending', updated_at = c.now, retries = 0, "
    "run_at = c.now, lease_until = NULL, worker_id = NULL, finished_at = NULL FROM c"
)
_REQUEUED = f"RETURNING nbqueue_jobs.id) SELECT id, {_WAKE} FROM moved"
REPLAY = (
    f"{_REQUEUE_SET} WHERE id = ANY(%(ids)s::bigint[]) AND {REPLAYABLE_SQL} "
    f"AND {key_is_free('twin.id = ANY(%(ids)s::bigint[])')} {_REQUEUED}"
)
REQUEUE_IDS = (
    f"{_REQUEUE_SET} WHERE id = ANY(%(ids)s::bigint[]) AND {REQUEUEABLE_SQL} "
    f"AND {key_is_free('twin.id = ANY(%(ids)s::bigint[])')} {_REQUEUED}"
)
_EVERY_DEAD = "twin.status = 'dead'"
REQUEUE_DEAD = f"{_REQUEUE_SET} WHERE status = 'dead' AND {key_is_free(_EVERY_DEAD)} {_REQUEUED}"
PROGRESS = (
    f"WITH {CLOCK} UPDATE nbqueue_jobs SET progress_done = %(done)s, progress_total = %(total)s, "
    f"progress_message = %(message)s, updated_at = c.now FROM c WHERE {LIVE_CLAIM} RETURNING 1"
)

PERIODIC_SLOT = "SELECT last_slot FROM nbqueue_periodic WHERE name = %(name)s"
PERIODIC_START = "INSERT INTO nbqueue_periodic VALUES (%(name)s, %(slot)s) ON CONFLICT DO NOTHING RETURNING 1"
PERIODIC_MOVE = (
    "UPDATE nbqueue_periodic SET last_slot = %(slot)s WHERE name = %(name)s AND last_slot = %(last)s "
    "RETURNING 1"
)

GET = f"{SELECT_JOBS} WHERE id = %(id)s"
GET_MANY = f"{SELECT_JOBS} WHERE id = ANY(%(ids)s::bigint[])"
EXPIRED = (
    f"{SELECT_JOBS} WHERE status = 'running' AND lease_until <= {NOW} ORDER BY lease_until LIMIT %(limit)s"
)
# A deleted job's steps, files, attempts and edges go with it.
_FORGET_GONE = (
    "steps AS (DELETE FROM nbqueue_steps WHERE job_id IN (SELECT id FROM gone)), "
    "files AS (DELETE FROM nbqueue_files WHERE job_id IN (SELECT id FROM gone)), "
    "attempts AS (DELETE FROM nbqueue_attempts WHERE job_id IN (SELECT id FROM gone)), "
    "parents AS (DELETE FROM nbqueue_edges WHERE parent IN (SELECT id FROM gone)), "
    "children AS (DELETE FROM nbqueue_edges WHERE child IN (SELECT id FROM gone))"
)
DELETE = (
    "WITH gone AS (DELETE FROM nbqueue_jobs WHERE id = ANY(%(ids)s::bigint[]) "
    f"AND {FINISHED_SQL} AND NOT {PARENT_NEEDED} RETURNING id), {_FORGET_GONE} SELECT id FROM gone"
)
PURGE = (
    "WITH gone AS (DELETE FROM nbqueue_jobs WHERE id IN (SELECT id FROM nbqueue_jobs "
    f"WHERE updated_at < {NOW} - %(age)s AND status = ANY(%(statuses)s::text[]) AND {FINISHED_SQL} "
    f"AND NOT {PARENT_NEEDED} ORDER BY id LIMIT %(limit)s) RETURNING id), {_FORGET_GONE} "
    "SELECT count(*) FROM gone"
)

# Counts: fold the appended changes into nbqueue_counts (one folder at a time), atomically,
# so that a reader of both tables sees the changes in one place or the other, never twice.
_FOLD = (
    "got AS (SELECT pg_try_advisory_xact_lock(hashtext('nbqueue-counts:' || current_schema())) AS lock), "
    "moved AS (DELETE FROM nbqueue_count_changes WHERE (SELECT lock FROM got) RETURNING queue, status, n), "
    "sums AS (SELECT queue, status, sum(n)::bigint AS n FROM moved GROUP BY queue, status), "
    "saved AS (INSERT INTO nbqueue_counts SELECT queue, status, n FROM sums "
    "ON CONFLICT (queue, status) DO UPDATE SET n = nbqueue_counts.n + excluded.n RETURNING 1)"
)
# Reading counts never writes (a read-only session can read them): both tables in one snapshot.
_COUNTED = (
    "counted AS (SELECT queue, status, n FROM nbqueue_counts "
    "UNION ALL SELECT queue, status, n FROM nbqueue_count_changes)"
)
COUNTS = (
    f"WITH {_COUNTED} SELECT status, sum(n) FROM counted "
    "WHERE (%(queue)s::text IS NULL OR queue = %(queue)s) GROUP BY status"
)
QUEUES = f"WITH {_COUNTED} SELECT queue FROM counted GROUP BY queue HAVING sum(n) > 0 ORDER BY queue"
TIDY = f"WITH {_FOLD} SELECT count(*) FROM sums"
TASK_NAMES = (
    "SELECT DISTINCT task FROM nbqueue_jobs WHERE task IS NOT NULL AND status = ANY(%(statuses)s::text[]) "
    "AND (signature IS NOT NULL OR NOT %(signed)s) ORDER BY task"
)

# A page of jobs, newest first: one statement per filter, so each can use its index.
_STATUS_IN = "status = ANY(%(statuses)s::text[])"
_PAGE = "ORDER BY id DESC LIMIT %(limit)s OFFSET %(offset)s"
_WHERE = {
    (False, False): "",
    (True, False): f"WHERE {_STATUS_IN}",
    (False, True): "WHERE queue = %(queue)s",
    (True, True): f"WHERE {_STATUS_IN} AND queue = %(queue)s",
}
#: (by status, by queue, brief) -> statement
ROWS = {
    (*filters, brief): f"{SELECT_BRIEF if brief else SELECT_JOBS} {where} {_PAGE}"
    for filters, where in _WHERE.items()
    for brief in (False, True)
}

SERVER_TIME = f"SELECT {SERVER_NOW}"
WAKE = "SELECT pg_notify(%(channel)s, '')"

# -- attempts --------------------------------------------------------------------------------

ATTEMPTS = (
    "SELECT attempt, started_at, finished_at, worker_id, host, pid, outcome, error FROM nbqueue_attempts "
    "WHERE job_id = %(id)s ORDER BY attempt"
)
# Attempts that ended since then, per minute: read by the finished_at index only.
ACTIVITY = (
    "SELECT finished_at / 60000000, sum(CASE WHEN outcome = 'completed' THEN 1 ELSE 0 END), "
    f"sum(CASE WHEN {FAILED_OUTCOMES_SQL} THEN 1 ELSE 0 END) FROM nbqueue_attempts "
    "WHERE finished_at >= %(since)s AND finished_at IS NOT NULL GROUP BY 1"
)
FAILURES = (
    f"SELECT job_id, count(*) FROM nbqueue_attempts WHERE job_id = {IDS} AND {FAILED_OUTCOMES_SQL} "
    "GROUP BY job_id"
)
# The running jobs a host's workers claimed (with the claiming process): recovered when it is gone.
RUNNING_ON = (
    f"SELECT {', '.join(COLUMNS)}, worker_pid FROM nbqueue_jobs "
    "WHERE status = 'running' AND worker_host = %(host)s"
)
CLAIMS = (
    f"SELECT id, status, worker_host, worker_pid, lease_until, lease_us FROM nbqueue_jobs WHERE id = {IDS}"
)
