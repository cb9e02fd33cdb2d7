"""PostgreSQL: the schema's version history, the dialect, and the statements of its own.

Every connection sets `search_path` to the queue's schema, so statements name
tables without a schema and never change at run time. Parameters are named
(`%(now)s`); lists are passed as arrays. Time is the server's `now()` unless
the caller passes its own clock (`%(now)s` not null). The statements both
backends mean alike are in `storage.statements` (`SQL`, rendered in this
dialect); here are the claims (FOR UPDATE SKIP LOCKED), the batch that
completes and claims in one statement, and what PostgreSQL says its own way.
"""

from __future__ import annotations

from ..jobs import COLUMNS
from .checkpoint_statements import build_checkpoints
from .dialect import Dialect
from .rules import (
    ANY_STATE_SQL,
    ANY_STATE_V11_SQL,
    ATTEMPT_ERROR_SQL,
    ATTEMPT_ERROR_V12_SQL,
    ATTEMPT_OUTCOME_SQL,
    ATTEMPT_OUTCOME_V11_SQL,
    ATTEMPT_OUTCOME_V12_SQL,
    BRIEF_ERROR,
    CLAIM_ORDER,
    CLAIMABLE_SQL,
    FINISHED_SQL,
    HEADS,
    NO_LIMITS_NO_SCAN,
    RUN_ENDED_SQL,
    UNFINISHED_SQL,
    UNFINISHED_V11_SQL,
    signed_run,
)
from .statements import JOB_COLUMNS, NEW_COLUMNS, PARENT_NEEDED, Written, build

SCHEMA_VERSION = 15
SIGNED, NONCE = signed_run("new")
SERVER_NOW = "(extract(epoch from now()) * 1000000)::bigint"
NOW = f"coalesce(%(now)s::bigint, {SERVER_NOW})"  # the caller's clock if given, else the server's
CLOCK = f"c AS (SELECT {NOW} AS now)"


def _attempt_function(create: str, outcome: str, error: str = ATTEMPT_ERROR_SQL) -> str:
    """The function that records every attempt (version 8; made again in 11 with its outcome)."""
    return f"""{create} FUNCTION {{s}}.nbqueue_attempt() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF NEW.status = 'running' THEN
                INSERT INTO {{s}}.nbqueue_attempts (job_id, attempt, started_at, worker_id, host, pid)
                    VALUES (NEW.id, NEW.attempts, NEW.started_at, NEW.worker_id, NEW.worker_host,
                    NEW.worker_pid) ON CONFLICT (job_id, attempt) DO NOTHING;
            ELSE
                UPDATE {{s}}.nbqueue_attempts SET finished_at = NEW.updated_at,
                    outcome = {outcome}, error = {error}
                    WHERE job_id = OLD.id AND attempt = OLD.attempts;
            END IF;
            RETURN NULL;
        END $$"""


#: Each version's statements, run in order under an advisory lock. History: never edited.
#: `{s}` is the schema (quoted), filled in once per migration, never in a queue verb.
MIGRATIONS: dict[int, list[str]] = {
    1: [
        f"""CREATE TABLE {{s}}.nbqueue_jobs (
            id BIGSERIAL PRIMARY KEY,
            status TEXT NOT NULL CHECK ({ANY_STATE_V11_SQL}),
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
        f"WHERE key IS NOT NULL AND {UNFINISHED_V11_SQL}",
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
        "ALTER TABLE {s}.nbqueue_jobs ADD CONSTRAINT nbqueue_jobs_status_check "
        f"CHECK ({ANY_STATE_V11_SQL})",
        "ALTER TABLE {s}.nbqueue_jobs ADD COLUMN parents_left INTEGER NOT NULL DEFAULT 0, "
        "ADD COLUMN wait_when TEXT, ADD COLUMN root_cause BIGINT, "
        "ADD COLUMN has_children INTEGER NOT NULL DEFAULT 0, ADD COLUMN origin TEXT, "
        "ADD COLUMN workflow BIGINT",
        "DROP INDEX {s}.nbqueue_key",
        f"CREATE UNIQUE INDEX nbqueue_key ON {{s}}.nbqueue_jobs (key) "
        f"WHERE key IS NOT NULL AND {UNFINISHED_V11_SQL}",
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
        _attempt_function("CREATE", ATTEMPT_OUTCOME_SQL),
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
    # An attempt's outcome stored as a value (the same meaning as SQLite's version 11).
    11: [
        "ALTER TABLE {s}.nbqueue_jobs ADD COLUMN failed_as TEXT",
        _attempt_function("CREATE OR REPLACE", ATTEMPT_OUTCOME_V11_SQL),
    ],
    # Jobs that wait (the same meaning as SQLite's version 12). The widened CHECK is added NOT
    # VALID: it holds for every write from now on, and no old row can break it (it allows more).
    12: [
        "ALTER TABLE {s}.nbqueue_jobs DROP CONSTRAINT nbqueue_jobs_status_check",
        f"ALTER TABLE {{s}}.nbqueue_jobs ADD CONSTRAINT nbqueue_jobs_status_check CHECK ({ANY_STATE_SQL}) "
        "NOT VALID",
        "CREATE TABLE {s}.nbqueue_waits (job_id BIGINT NOT NULL, name TEXT NOT NULL, kind TEXT, prompt TEXT, "
        "choices TEXT, deadline BIGINT, value TEXT, sent_by TEXT, sent_at BIGINT, expired_at BIGINT, "
        "reached_at BIGINT, PRIMARY KEY (job_id, name))",
        "CREATE INDEX nbqueue_waking ON {s}.nbqueue_jobs (run_at) WHERE status = 'waiting'",
        "DROP INDEX {s}.nbqueue_key",
        "CREATE UNIQUE INDEX nbqueue_key ON {s}.nbqueue_jobs (key) "
        f"WHERE key IS NOT NULL AND {UNFINISHED_SQL}",
        _attempt_function("CREATE OR REPLACE", ATTEMPT_OUTCOME_V12_SQL, ATTEMPT_ERROR_V12_SQL),
    ],
    # What running jobs emit (the same meaning as SQLite's version 13; deleted with the job).
    13: [
        "CREATE TABLE {s}.nbqueue_stream (job_id BIGINT NOT NULL, attempt INTEGER NOT NULL, "
        "seq BIGINT NOT NULL, value TEXT NOT NULL, bytes INTEGER NOT NULL, "
        "PRIMARY KEY (job_id, attempt, seq))",
    ],
    # LangGraph checkpoints (the same meaning as SQLite's version 14).
    14: [
        "CREATE TABLE {s}.nbqueue_checkpoints (thread TEXT NOT NULL, ns TEXT NOT NULL, id TEXT NOT NULL, "
        "parent TEXT, job_id BIGINT, run_id TEXT, created_at BIGINT NOT NULL, versions TEXT NOT NULL, "
        "kind TEXT NOT NULL, body BYTEA NOT NULL, PRIMARY KEY (thread, ns, id))",
        "CREATE INDEX nbqueue_checkpoints_run ON {s}.nbqueue_checkpoints (run_id) WHERE run_id IS NOT NULL",
        "CREATE TABLE {s}.nbqueue_checkpoint_values (thread TEXT NOT NULL, ns TEXT NOT NULL, "
        "channel TEXT NOT NULL, version TEXT NOT NULL, kind TEXT NOT NULL, value BYTEA NOT NULL, "
        "PRIMARY KEY (thread, ns, channel, version))",
        "CREATE TABLE {s}.nbqueue_checkpoint_writes (thread TEXT NOT NULL, ns TEXT NOT NULL, "
        "checkpoint TEXT NOT NULL, task TEXT NOT NULL, idx INTEGER NOT NULL, channel TEXT NOT NULL, "
        "kind TEXT NOT NULL, value BYTEA NOT NULL, path TEXT NOT NULL, "
        "PRIMARY KEY (thread, ns, checkpoint, task, idx))",
    ],
    # SQLite's version 15 reorders a trigger's tests and writes the CHECK on status as comparisons
    # (its lists of constants built a table each time); PostgreSQL builds nothing for either.
    15: [],
}

SELECT_JOBS = f"SELECT {JOB_COLUMNS} FROM nbqueue_jobs"
# A run's items (two arrays: numbers and JSON texts), each stored once (a resumed run emits again
# from 0), none below the oldest kept (what the bound dropped stays dropped).
EMIT = (
    "INSERT INTO nbqueue_stream (job_id, attempt, seq, value, bytes) SELECT :id, :run, s.seq, s.value, "
    "octet_length(s.value) FROM unnest(CAST(:seqs AS bigint[]), CAST(:texts AS text[])) AS s(seq, value) "
    "WHERE s.seq >= coalesce((SELECT min(seq) FROM nbqueue_stream WHERE job_id = :id AND attempt = :run), 0) "
    "ON CONFLICT DO NOTHING"
)
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
# The jobs a batched claim under limits chose, those still claimable and held by no other claim.
TAKE_IDS = f"WITH {CLOCK} " + _take(
    f"(SELECT id FROM nbqueue_jobs WHERE id = ANY(%(ids)s::bigint[]) AND {CLAIMABLE_SQL} "
    "FOR UPDATE SKIP LOCKED)",
    "IN",
)
NEXT_OF_GATE = (
    f"SELECT id, limits FROM nbqueue_jobs WHERE {CLAIMABLE_SQL} AND queue = (SELECT queue FROM "
    "nbqueue_jobs WHERE id = %(head)s) AND gate = (SELECT gate FROM nbqueue_jobs WHERE id = %(head)s) "
    f"AND run_at <= %(moment)s AND {TASK_ALLOWED} ORDER BY {CLAIM_ORDER} LIMIT %(most)s"
)
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
_DEFINE_LIMIT = (
    f"WITH {CLOCK} INSERT INTO nbqueue_limits (key, concurrency, rate, burst, updated_at) "
    "SELECT %(key)s, %(concurrency)s, %(rate)s, %(burst)s, now FROM c ON CONFLICT (key) DO UPDATE SET "
    "concurrency = excluded.concurrency, rate = excluded.rate, burst = excluded.burst, "
    "updated_at = excluded.updated_at"
)
_LIMITS = (
    "SELECT key, concurrency, rate, burst, tat, paused_until, paused_why, "
    "(SELECT coalesce(sum(held.value::bigint), 0) FROM nbqueue_jobs, jsonb_each_text(limits::jsonb) AS held "
    "WHERE status = 'running' AND limits IS NOT NULL AND held.key = nbqueue_limits.key) "
    "FROM nbqueue_limits ORDER BY key"
)
_WAITING_PER_KEY = (
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

# Each new job's values as arrays, by NEW_COLUMNS (with the times: run_at_us or delay_us), typed.
_TYPES = {
    "priority": "bigint",
    "max_retries": "int",
    "timeout": "float8",
    "run_at_us": "bigint",
    "delay_us": "bigint",
}
NEW_FIELDS = (*NEW_COLUMNS, "run_at_us", "delay_us")
_ARRAYS = ", ".join(f"%({c})s::{_TYPES.get(c, 'text')}[]" for c in NEW_FIELDS)
# All rows in one INSERT ... SELECT FROM unnest: atomic, one round trip. A row whose key an
# unfinished job holds is skipped (the caller then reads that job's id).
INSERT = (
    f"WITH {CLOCK}, new AS (SELECT * FROM unnest({_ARRAYS}) WITH ORDINALITY AS r({', '.join(NEW_FIELDS)}, "
    "n)), "
    f"ins AS (INSERT INTO nbqueue_jobs (status, {', '.join(NEW_COLUMNS)}, run_at, created_at, updated_at, "
    f"enqueue_token) SELECT 'pending', {', '.join(NEW_COLUMNS)}, coalesce(run_at_us, c.now + delay_us), "
    "c.now, "
    "c.now, %(token)s FROM new, c ORDER BY n "
    f"ON CONFLICT (key) WHERE key IS NOT NULL AND {UNFINISHED_SQL} DO NOTHING RETURNING id, created_at), "
    "woke AS (SELECT pg_notify(%(channel)s, '') WHERE EXISTS (SELECT 1 FROM ins)) "
    "SELECT id, created_at FROM ins, (SELECT count(*) FROM woke) w ORDER BY id"
)
COMPLETED = "SELECT 1 FROM nbqueue_jobs WHERE id = %(id)s AND attempts = %(attempt)s AND status = 'completed'"
_FORGET_GONE = (
    "steps AS (DELETE FROM nbqueue_steps WHERE job_id IN (SELECT id FROM gone)), "
    "files AS (DELETE FROM nbqueue_files WHERE job_id IN (SELECT id FROM gone)), "
    "attempts AS (DELETE FROM nbqueue_attempts WHERE job_id IN (SELECT id FROM gone)), "
    "waits AS (DELETE FROM nbqueue_waits WHERE job_id IN (SELECT id FROM gone)), "
    "stream AS (DELETE FROM nbqueue_stream WHERE job_id IN (SELECT id FROM gone)), "
    "parents AS (DELETE FROM nbqueue_edges WHERE parent IN (SELECT id FROM gone)), "
    "children AS (DELETE FROM nbqueue_edges WHERE child IN (SELECT id FROM gone))"
)
_DELETE = (
    "WITH gone AS (DELETE FROM nbqueue_jobs WHERE id = ANY(%(ids)s::bigint[]) "
    f"AND {FINISHED_SQL} AND NOT {PARENT_NEEDED} RETURNING id), {_FORGET_GONE} SELECT count(*) FROM gone"
)
_PURGE = (
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
_COUNTS = (
    f"WITH {_COUNTED} SELECT status, sum(n) FROM counted "
    "WHERE (%(queue)s::text IS NULL OR queue = %(queue)s) GROUP BY status"
)
_QUEUES = f"WITH {_COUNTED} SELECT queue FROM counted GROUP BY queue HAVING sum(n) > 0 ORDER BY queue"
TIDY = f"WITH {_FOLD} SELECT count(*) FROM sums"
SERVER_TIME = f"SELECT {SERVER_NOW}"

DIALECT = Dialect(
    name="postgres",
    param="%({0})s",
    typed=True,
    lists={"IN": "= ANY({0}::{1}[])", "NOT IN": "<> ALL({0}::{1}[])", "EACH": "unnest({0}::{1}[]) AS value"},
    now=NOW,
    # Wakes the queue's listening workers when the transaction commits (once, however often).
    wake=", (SELECT count(*) FROM (SELECT pg_notify(%(channel)s, '') WHERE %(wake)s) n)",
    same="IS NOT DISTINCT FROM",
    greatest="greatest",
    tail_error=f"right(error, {BRIEF_ERROR})",
    ordered_join="JOIN",
    spawned_index="",
    # Other writers run at once: a cascade's children are locked (in id order) before their counts
    # are read (read committed re-reads a locked row), and a re-armed job's parents are held.
    lock_children=" FOR UPDATE OF c",
    lock_parents=" FOR SHARE OF p",
    # `(...) IS TRUE`, which no index answers: the planner never starts a cascade from every blocked
    # job in the state index (its statistics lag a workflow written a moment ago).
    unindexed="({}) IS TRUE",
    lock_row=" FOR UPDATE",
    like="ILIKE",
)
SQL = build(
    DIALECT,
    Written(
        COUNTS=_COUNTS,
        QUEUES=_QUEUES,
        DELETE=_DELETE,
        PURGE=_PURGE,
        DEFINE_LIMIT=_DEFINE_LIMIT,
        LIMITS=_LIMITS,
        WAITING_PER_KEY=_WAITING_PER_KEY,
        LIMITED_WAITING_IN_QUEUES=_limited_waiting(NAMED_QUEUES),
        LIMITED_WAITING_IN_ANY_QUEUE=_limited_waiting(EVERY_WAITING_QUEUE),
        NEXT_DUE_IN_QUEUES=_next_due(NAMED_QUEUES),
        NEXT_DUE_IN_ANY_QUEUE=_next_due(EVERY_WAITING_QUEUE),
        CLAIM_FROM_QUEUES=CLAIM_FROM_QUEUES,
        CLAIM_FROM_ANY_QUEUE=CLAIM_FROM_ANY_QUEUE,
        HEADS_IN_QUEUES=HEADS_IN_QUEUES,
        HEADS_IN_ANY_QUEUE=HEADS_IN_ANY_QUEUE,
        LOCK_KEYS=LOCK_KEYS,
        IN_FLIGHT=IN_FLIGHT,
        TAKE_ID=TAKE_ID,
        NEXT_OF_GATE=NEXT_OF_GATE,
        TAKE_IDS=TAKE_IDS,
        EMIT=EMIT,
    ),
)

#: The LangGraph checkpoint statements (storage/checkpoints.py), in this dialect.
CHECKPOINT_SQL = build_checkpoints(
    DIALECT,
    # A transaction-scoped advisory lock per thread, under a key of nbqueue's own ("nbqc").
    lock_thread=f"SELECT pg_advisory_xact_lock({0x6E627163}, hashtext(:thread::text))",
)
