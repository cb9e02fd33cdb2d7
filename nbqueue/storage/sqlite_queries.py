"""SQLite: the schema's version history, the dialect, and the statements of its own.

Parameters are named (`:now`). Lists (ids, queues, tasks, states) are passed
as one JSON array and read with `json_each`, so no statement is edited to fit
a list. The statements both backends mean alike are in `storage.statements`
(`SQL`, rendered in this dialect); here are the claims, which take jobs in
`BEGIN IMMEDIATE`, and what SQLite says its own way.
"""

from __future__ import annotations

from ..jobs import State
from .checkpoint_statements import build_checkpoints
from .dialect import Dialect
from .rules import (
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
    RUN_ENDED_SQL,
    UNFINISHED_SQL,
    UNFINISHED_V11_SQL,
    signed_run,
    status_in,
)
from .statements import JOB_COLUMNS, NEW_COLUMNS, PARENT_NEEDED, Written, build

SCHEMA_VERSION = 15
APPLICATION_ID = 0x6E627175  # "nbqu": marks a file as an nbqueue database
# The job columns as of version 5, copied when version 6 rebuilds the table.
COLS_V5 = (
    "id, status, queue, task, payload, priority, key, retries, max_retries, attempts, error, run_at, "
    "created_at, updated_at, started_at, finished_at, lease_until, lease_us, worker_id, timeout, output, "
    "backoff, result, progress_done, progress_total, progress_message, signature, enqueue_token, "
    "claim_token, limits, gate, snoozes"
)
SIGNED, NONCE = signed_run("new")
NEXT_DUE_SCAN = 10_000  # claim-index entries per queue read to find the earliest due job

#: Each version's script, applied in order inside one write transaction. History: never edited.
MIGRATIONS: dict[int, str] = {
    1: f"""
    CREATE TABLE nbqueue_jobs (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        status TEXT NOT NULL CHECK ({ANY_STATE_V11_SQL}),
        queue TEXT NOT NULL,
        task TEXT,
        payload TEXT NOT NULL,
        priority INTEGER NOT NULL DEFAULT 0,
        key TEXT,
        retries INTEGER NOT NULL DEFAULT 0,
        max_retries INTEGER NOT NULL,
        attempts INTEGER NOT NULL DEFAULT 0,
        error TEXT,
        run_at INTEGER NOT NULL,
        created_at INTEGER NOT NULL,
        updated_at INTEGER NOT NULL,
        started_at INTEGER,
        finished_at INTEGER,
        lease_until INTEGER,
        lease_us INTEGER,
        worker_id TEXT,
        timeout REAL,
        output TEXT,
        backoff TEXT,
        result TEXT
    );
    CREATE INDEX nbqueue_claim_queue ON nbqueue_jobs (queue, {CLAIM_ORDER}) WHERE {CLAIMABLE_SQL};
    CREATE INDEX nbqueue_claim_any ON nbqueue_jobs ({CLAIM_ORDER}) WHERE {CLAIMABLE_SQL};
    CREATE INDEX nbqueue_due ON nbqueue_jobs (run_at) WHERE {CLAIMABLE_SQL};
    CREATE UNIQUE INDEX nbqueue_key ON nbqueue_jobs (key) WHERE key IS NOT NULL AND {UNFINISHED_V11_SQL};
    CREATE INDEX nbqueue_lease ON nbqueue_jobs (lease_until) WHERE status = 'running';
    CREATE INDEX nbqueue_status ON nbqueue_jobs (status, id);
    -- Counts per (queue, status), kept by triggers so the board never scans the table.
    CREATE TABLE nbqueue_counts (
        queue TEXT NOT NULL, status TEXT NOT NULL, n INTEGER NOT NULL,
        PRIMARY KEY (queue, status)
    ) WITHOUT ROWID;
    CREATE TRIGGER nbqueue_count_insert AFTER INSERT ON nbqueue_jobs BEGIN
        INSERT INTO nbqueue_counts VALUES (new.queue, new.status, 1)
            ON CONFLICT (queue, status) DO UPDATE SET n = n + 1;
    END;
    CREATE TRIGGER nbqueue_count_delete AFTER DELETE ON nbqueue_jobs BEGIN
        UPDATE nbqueue_counts SET n = n - 1 WHERE queue = old.queue AND status = old.status;
    END;
    CREATE TRIGGER nbqueue_count_update AFTER UPDATE OF status ON nbqueue_jobs
        WHEN old.status != new.status BEGIN
        UPDATE nbqueue_counts SET n = n - 1 WHERE queue = old.queue AND status = old.status;
        INSERT INTO nbqueue_counts VALUES (new.queue, new.status, 1)
            ON CONFLICT (queue, status) DO UPDATE SET n = n + 1;
    END;
    """,
    # Fewer indexes, faster writes: every claim seeks the per-queue claim index.
    2: """
    DROP INDEX nbqueue_claim_any;
    DROP INDEX nbqueue_due;
    """,
    # Progress reported from inside a job; periodic schedules' last enqueued slot.
    3: """
    ALTER TABLE nbqueue_jobs ADD COLUMN progress_done REAL;
    ALTER TABLE nbqueue_jobs ADD COLUMN progress_total REAL;
    ALTER TABLE nbqueue_jobs ADD COLUMN progress_message TEXT;
    CREATE TABLE nbqueue_periodic (name TEXT PRIMARY KEY, last_slot INTEGER NOT NULL) WITHOUT ROWID;
    """,
    # Signatures of code jobs (nbqueue.signing). Tokens a client writes so that it can tell,
    # after losing a reply, whether its write committed: a PostgreSQL client can lose a
    # reply; a SQLite one cannot, and leaves them empty.
    4: """
    ALTER TABLE nbqueue_jobs ADD COLUMN signature TEXT;
    ALTER TABLE nbqueue_jobs ADD COLUMN enqueue_token INTEGER;
    ALTER TABLE nbqueue_jobs ADD COLUMN claim_token INTEGER;
    CREATE INDEX nbqueue_enqueue_token ON nbqueue_jobs (enqueue_token) WHERE enqueue_token IS NOT NULL;
    """,
    # Limits: the keys (and units) a job holds; the claim index groups jobs by their set of
    # keys (the gate), so a full key's waiting jobs never stand in the way of other work.
    5: f"""
    ALTER TABLE nbqueue_jobs ADD COLUMN limits TEXT;
    ALTER TABLE nbqueue_jobs ADD COLUMN gate TEXT NOT NULL DEFAULT '';
    ALTER TABLE nbqueue_jobs ADD COLUMN snoozes INTEGER NOT NULL DEFAULT 0;
    DROP INDEX nbqueue_claim_queue;
    CREATE INDEX nbqueue_claim ON nbqueue_jobs (queue, gate, {CLAIM_ORDER}) WHERE {CLAIMABLE_SQL};
    CREATE TABLE nbqueue_limits (
        key TEXT PRIMARY KEY, concurrency INTEGER, rate REAL, burst REAL NOT NULL DEFAULT 0,
        tat INTEGER NOT NULL DEFAULT 0, paused_until INTEGER, paused_why TEXT, updated_at INTEGER NOT NULL
    ) WITHOUT ROWID;
    """,
    # Dependencies between jobs and durable steps: the states blocked and upstream_failed
    # (a CHECK constraint SQLite cannot alter: the table is rebuilt, ids and all), a child's
    # wait (parents_left, wait_when, root_cause), the edges, steps and workflows. An older
    # nbqueue refuses the file (SchemaTooNew) instead of running blocked jobs.
    6: f"""
    CREATE TEMP TABLE nbqueue_v6_sequence AS SELECT seq FROM sqlite_sequence WHERE name = 'nbqueue_jobs';
    CREATE TABLE nbqueue_jobs_v6 (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        status TEXT NOT NULL CHECK ({ANY_STATE_V11_SQL}),
        queue TEXT NOT NULL, task TEXT, payload TEXT NOT NULL, priority INTEGER NOT NULL DEFAULT 0, key TEXT,
        retries INTEGER NOT NULL DEFAULT 0, max_retries INTEGER NOT NULL, attempts INTEGER NOT NULL DEFAULT 0,
        error TEXT, run_at INTEGER NOT NULL, created_at INTEGER NOT NULL, updated_at INTEGER NOT NULL,
        started_at INTEGER, finished_at INTEGER, lease_until INTEGER, lease_us INTEGER, worker_id TEXT,
        timeout REAL, output TEXT, backoff TEXT, result TEXT, progress_done REAL, progress_total REAL,
        progress_message TEXT, signature TEXT, enqueue_token INTEGER, claim_token INTEGER, limits TEXT,
        gate TEXT NOT NULL DEFAULT '', snoozes INTEGER NOT NULL DEFAULT 0,
        parents_left INTEGER NOT NULL DEFAULT 0, wait_when TEXT, root_cause INTEGER,
        has_children INTEGER NOT NULL DEFAULT 0, origin TEXT, workflow INTEGER
    );
    INSERT INTO nbqueue_jobs_v6 ({COLS_V5}) SELECT {COLS_V5} FROM nbqueue_jobs;
    DROP TABLE nbqueue_jobs;
    ALTER TABLE nbqueue_jobs_v6 RENAME TO nbqueue_jobs;
    UPDATE sqlite_sequence SET seq = max(seq, coalesce((SELECT seq FROM nbqueue_v6_sequence), 0))
        WHERE name = 'nbqueue_jobs';
    DROP TABLE nbqueue_v6_sequence;
    CREATE INDEX nbqueue_claim ON nbqueue_jobs (queue, gate, {CLAIM_ORDER}) WHERE {CLAIMABLE_SQL};
    CREATE UNIQUE INDEX nbqueue_key ON nbqueue_jobs (key) WHERE key IS NOT NULL AND {UNFINISHED_V11_SQL};
    CREATE INDEX nbqueue_lease ON nbqueue_jobs (lease_until) WHERE status = 'running';
    CREATE INDEX nbqueue_status ON nbqueue_jobs (status, id);
    CREATE INDEX nbqueue_enqueue_token ON nbqueue_jobs (enqueue_token) WHERE enqueue_token IS NOT NULL;
    CREATE UNIQUE INDEX nbqueue_origin ON nbqueue_jobs (origin) WHERE origin IS NOT NULL;
    CREATE TRIGGER nbqueue_count_insert AFTER INSERT ON nbqueue_jobs BEGIN
        INSERT INTO nbqueue_counts VALUES (new.queue, new.status, 1)
            ON CONFLICT (queue, status) DO UPDATE SET n = n + 1;
    END;
    CREATE TRIGGER nbqueue_count_delete AFTER DELETE ON nbqueue_jobs BEGIN
        UPDATE nbqueue_counts SET n = n - 1 WHERE queue = old.queue AND status = old.status;
    END;
    CREATE TRIGGER nbqueue_count_update AFTER UPDATE OF status ON nbqueue_jobs
        WHEN old.status != new.status BEGIN
        UPDATE nbqueue_counts SET n = n - 1 WHERE queue = old.queue AND status = old.status;
        INSERT INTO nbqueue_counts VALUES (new.queue, new.status, 1)
            ON CONFLICT (queue, status) DO UPDATE SET n = n + 1;
    END;
    CREATE TABLE nbqueue_edges (
        parent INTEGER NOT NULL, child INTEGER NOT NULL, PRIMARY KEY (parent, child)
    ) WITHOUT ROWID;
    CREATE INDEX nbqueue_edges_child ON nbqueue_edges (child, parent);
    CREATE TABLE nbqueue_steps (
        job_id INTEGER NOT NULL, name TEXT NOT NULL, value TEXT, error TEXT, attempt INTEGER NOT NULL,
        started_at INTEGER NOT NULL, finished_at INTEGER NOT NULL, PRIMARY KEY (job_id, name)
    ) WITHOUT ROWID;
    CREATE TABLE nbqueue_workflows (
        id INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT NOT NULL, created_at INTEGER NOT NULL
    );
    CREATE TRIGGER nbqueue_forget AFTER DELETE ON nbqueue_jobs BEGIN
        DELETE FROM nbqueue_steps WHERE job_id = old.id;
        DELETE FROM nbqueue_edges WHERE parent = old.id;
        DELETE FROM nbqueue_edges WHERE child = old.id;
    END;
    """,
    # Files a job keeps (a notebook job's executed notebook), written under its claim; they
    # go with the job, so nbqueue_forget is made again to delete them too.
    7: """
    CREATE TABLE nbqueue_files (
        job_id INTEGER NOT NULL, name TEXT NOT NULL, content TEXT NOT NULL, attempt INTEGER NOT NULL,
        updated_at INTEGER NOT NULL, PRIMARY KEY (job_id, name)
    ) WITHOUT ROWID;
    CREATE TABLE nbqueue_schedules (
        name TEXT PRIMARY KEY, task TEXT NOT NULL, payload TEXT NOT NULL, spec TEXT NOT NULL,
        options TEXT NOT NULL, signature TEXT, updated_at INTEGER NOT NULL
    );
    DROP TRIGGER nbqueue_forget;
    CREATE TRIGGER nbqueue_forget AFTER DELETE ON nbqueue_jobs BEGIN
        DELETE FROM nbqueue_steps WHERE job_id = old.id;
        DELETE FROM nbqueue_files WHERE job_id = old.id;
        DELETE FROM nbqueue_edges WHERE parent = old.id;
        DELETE FROM nbqueue_edges WHERE child = old.id;
    END;
    """,
    # Every attempt recorded: a row when a claim takes the job, finished when the claim ends
    # (by triggers, so every path that claims or ends a claim writes it in its own transaction);
    # the claiming worker's host and process on the job, so a gone process's job is recovered
    # at once. The attempts go with the job (nbqueue_forget is made again).
    8: f"""
    ALTER TABLE nbqueue_jobs ADD COLUMN worker_host TEXT;
    ALTER TABLE nbqueue_jobs ADD COLUMN worker_pid INTEGER;
    CREATE TABLE nbqueue_attempts (
        job_id INTEGER NOT NULL, attempt INTEGER NOT NULL, started_at INTEGER NOT NULL,
        finished_at INTEGER, worker_id TEXT, host TEXT, pid INTEGER, outcome TEXT, error TEXT,
        PRIMARY KEY (job_id, attempt)
    ) WITHOUT ROWID;
    CREATE INDEX nbqueue_attempts_finished ON nbqueue_attempts (finished_at) WHERE finished_at IS NOT NULL;
    CREATE TRIGGER nbqueue_attempt_start AFTER UPDATE OF status ON nbqueue_jobs
        WHEN new.status = 'running' AND old.status != 'running' BEGIN
        INSERT OR REPLACE INTO nbqueue_attempts (job_id, attempt, started_at, worker_id, host, pid)
            VALUES (new.id, new.attempts, new.started_at, new.worker_id, new.worker_host, new.worker_pid);
    END;
    CREATE TRIGGER nbqueue_attempt_end AFTER UPDATE OF status ON nbqueue_jobs
        WHEN old.status = 'running' AND new.status != 'running' BEGIN
        UPDATE nbqueue_attempts SET finished_at = new.updated_at, outcome = {ATTEMPT_OUTCOME_SQL},
            error = {ATTEMPT_ERROR_SQL} WHERE job_id = old.id AND attempt = old.attempts;
    END;
    DROP TRIGGER nbqueue_forget;
    CREATE TRIGGER nbqueue_forget AFTER DELETE ON nbqueue_jobs BEGIN
        DELETE FROM nbqueue_steps WHERE job_id = old.id;
        DELETE FROM nbqueue_files WHERE job_id = old.id;
        DELETE FROM nbqueue_attempts WHERE job_id = old.id;
        DELETE FROM nbqueue_edges WHERE parent = old.id;
        DELETE FROM nbqueue_edges WHERE child = old.id;
    END;
    """,
    # Signed jobs bound to one run (nbqueue.trust): the database's random identity, which
    # signatures cover; each signature's nonce bound to the first job that claims it, with
    # when that run ended and the MAC of its result, kept by triggers (every claim and every
    # end, in its own transaction). Rows stay when jobs are deleted: a copy never runs later.
    9: f"""
    CREATE TABLE nbqueue_info (name TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID;
    INSERT INTO nbqueue_info VALUES ('identity', lower(hex(randomblob(16))));
    CREATE TABLE nbqueue_runs (
        nonce TEXT PRIMARY KEY, job_id INTEGER NOT NULL, finished_at INTEGER, result_mac TEXT
    ) WITHOUT ROWID;
    CREATE TRIGGER nbqueue_run_start AFTER UPDATE OF status ON nbqueue_jobs
        WHEN new.status = 'running' AND old.status != 'running' AND {SIGNED} BEGIN
        INSERT OR IGNORE INTO nbqueue_runs (nonce, job_id) VALUES ({NONCE}, new.id);
    END;
    CREATE TRIGGER nbqueue_run_end AFTER UPDATE OF status ON nbqueue_jobs
        WHEN old.status != new.status AND {RUN_ENDED_SQL} AND {SIGNED} BEGIN
        INSERT INTO nbqueue_runs (nonce, job_id, finished_at) VALUES ({NONCE}, new.id, new.updated_at)
            ON CONFLICT (nonce) DO UPDATE SET finished_at = excluded.finished_at
            WHERE job_id = excluded.job_id;
    END;
    """,
    # Families: the job that made a job while it ran (its origin names it), and the first job of
    # its line (the family), whose family_size counts the jobs made in the family (at most the
    # queue's family_limit). Cancelling a job cancels what it made, found by spawned_by.
    10: """
    ALTER TABLE nbqueue_jobs ADD COLUMN spawned_by INTEGER;
    ALTER TABLE nbqueue_jobs ADD COLUMN family INTEGER;
    ALTER TABLE nbqueue_jobs ADD COLUMN family_size INTEGER NOT NULL DEFAULT 0;
    UPDATE nbqueue_jobs SET spawned_by = CAST(substr(origin, 1, instr(origin, ':') - 1) AS INTEGER)
        WHERE origin IS NOT NULL;
    CREATE INDEX nbqueue_spawned_by ON nbqueue_jobs (spawned_by) WHERE spawned_by IS NOT NULL;
    """,
    # An attempt's outcome stored as a value: the write that fails a job says whether the attempt
    # was lost or timed out (failed_as), instead of the trigger reading it from the error text.
    11: f"""
    ALTER TABLE nbqueue_jobs ADD COLUMN failed_as TEXT;
    DROP TRIGGER nbqueue_attempt_end;
    CREATE TRIGGER nbqueue_attempt_end AFTER UPDATE OF status ON nbqueue_jobs
        WHEN old.status = 'running' AND new.status != 'running' BEGIN
        UPDATE nbqueue_attempts SET finished_at = new.updated_at, outcome = {ATTEMPT_OUTCOME_V11_SQL},
            error = {ATTEMPT_ERROR_SQL} WHERE job_id = old.id AND attempt = old.attempts;
    END;
    """,
    # Jobs that wait (nbqueue.wait_for, sleep, wait_for_jobs): the state `waiting` (the CHECK on
    # status is widened in place first, by `widen_states`: no row is rewritten), what each job
    # waits for and what was sent to it, the due wake-ups found by index, the idempotency key
    # held while a job waits, and a run that ends in a wait recorded as "suspended".
    12: f"""
    CREATE TABLE nbqueue_waits (
        job_id INTEGER NOT NULL, name TEXT NOT NULL, kind TEXT, prompt TEXT, choices TEXT,
        deadline INTEGER, value TEXT, sent_by TEXT, sent_at INTEGER, expired_at INTEGER,
        reached_at INTEGER, PRIMARY KEY (job_id, name)
    ) WITHOUT ROWID;
    CREATE INDEX nbqueue_waking ON nbqueue_jobs (run_at) WHERE status = 'waiting';
    DROP INDEX nbqueue_key;
    CREATE UNIQUE INDEX nbqueue_key ON nbqueue_jobs (key) WHERE key IS NOT NULL AND {UNFINISHED_SQL};
    DROP TRIGGER nbqueue_attempt_end;
    CREATE TRIGGER nbqueue_attempt_end AFTER UPDATE OF status ON nbqueue_jobs
        WHEN old.status = 'running' AND new.status != 'running' BEGIN
        UPDATE nbqueue_attempts SET finished_at = new.updated_at, outcome = {ATTEMPT_OUTCOME_V12_SQL},
            error = {ATTEMPT_ERROR_V12_SQL} WHERE job_id = old.id AND attempt = old.attempts;
    END;
    DROP TRIGGER nbqueue_forget;
    CREATE TRIGGER nbqueue_forget AFTER DELETE ON nbqueue_jobs BEGIN
        DELETE FROM nbqueue_steps WHERE job_id = old.id;
        DELETE FROM nbqueue_files WHERE job_id = old.id;
        DELETE FROM nbqueue_attempts WHERE job_id = old.id;
        DELETE FROM nbqueue_waits WHERE job_id = old.id;
        DELETE FROM nbqueue_edges WHERE parent = old.id;
        DELETE FROM nbqueue_edges WHERE child = old.id;
    END;
    """,
    # What running jobs emit (nbqueue.emit): items numbered per attempt, kept with the job.
    13: """
    CREATE TABLE nbqueue_stream (
        job_id INTEGER NOT NULL, attempt INTEGER NOT NULL, seq INTEGER NOT NULL, value TEXT NOT NULL,
        bytes INTEGER NOT NULL, PRIMARY KEY (job_id, attempt, seq)
    ) WITHOUT ROWID;
    DROP TRIGGER nbqueue_forget;
    CREATE TRIGGER nbqueue_forget AFTER DELETE ON nbqueue_jobs BEGIN
        DELETE FROM nbqueue_steps WHERE job_id = old.id;
        DELETE FROM nbqueue_files WHERE job_id = old.id;
        DELETE FROM nbqueue_attempts WHERE job_id = old.id;
        DELETE FROM nbqueue_waits WHERE job_id = old.id;
        DELETE FROM nbqueue_stream WHERE job_id = old.id;
        DELETE FROM nbqueue_edges WHERE parent = old.id;
        DELETE FROM nbqueue_edges WHERE child = old.id;
    END;
    """,
    # LangGraph checkpoints (nbqueue.checkpoints): a channel's value stored once per version.
    14: """
    CREATE TABLE nbqueue_checkpoints (
        thread TEXT NOT NULL, ns TEXT NOT NULL, id TEXT NOT NULL, parent TEXT, job_id INTEGER,
        run_id TEXT, created_at INTEGER NOT NULL, versions TEXT NOT NULL, kind TEXT NOT NULL,
        body BLOB NOT NULL, PRIMARY KEY (thread, ns, id)
    );
    CREATE INDEX nbqueue_checkpoints_run ON nbqueue_checkpoints (run_id) WHERE run_id IS NOT NULL;
    CREATE TABLE nbqueue_checkpoint_values (
        thread TEXT NOT NULL, ns TEXT NOT NULL, channel TEXT NOT NULL, version TEXT NOT NULL,
        kind TEXT NOT NULL, value BLOB NOT NULL, PRIMARY KEY (thread, ns, channel, version)
    );
    CREATE TABLE nbqueue_checkpoint_writes (
        thread TEXT NOT NULL, ns TEXT NOT NULL, checkpoint TEXT NOT NULL, task TEXT NOT NULL,
        idx INTEGER NOT NULL, channel TEXT NOT NULL, kind TEXT NOT NULL, value BLOB NOT NULL,
        path TEXT NOT NULL, PRIMARY KEY (thread, ns, checkpoint, task, idx)
    );
    """,
    # nbqueue_run_end tests the signature first. Its test of the new state against three values
    # built a small table in every run of the trigger (an IN list of more than two constants),
    # for every change of state of every job, signed or not: 1.5 us per change, measured.
    15: f"""
    DROP TRIGGER nbqueue_run_end;
    CREATE TRIGGER nbqueue_run_end AFTER UPDATE OF status ON nbqueue_jobs
        WHEN {SIGNED} AND old.status != new.status AND {RUN_ENDED_SQL} BEGIN
        INSERT INTO nbqueue_runs (nonce, job_id, finished_at) VALUES ({NONCE}, new.id, new.updated_at)
            ON CONFLICT (nonce) DO UPDATE SET finished_at = excluded.finished_at
            WHERE job_id = excluded.job_id;
    END;
    """,
}
#: The CHECK on status as versions 1 to 11 wrote it ends with this state, and then with it
#: and `waiting` (SQL string literals: quotes doubled).
LAST_STATE_BEFORE_12 = "'upstream_failed')"
WIDENED = "'upstream_failed', 'waiting')"
#: The CHECK on status as version 12 left it, and as version 15 writes it: a list of more than
#: two values built a small table in every statement that wrote a state (2.2 us of a one-row
#: update, measured), where as many comparisons cost next to nothing.
LISTED_STATES = f"CHECK ({status_in(State)})"  # (`waiting`, the last state, as 12 appended it)
COMPARED_STATES = f"CHECK ({' OR '.join(f'status = {state.value!r}' for state in State)})"
#: Edits of the CHECK on status (the table's stored text, before the version's script runs): no
#: row is rewritten (storage.sqlite._edit_check).
CHECK_EDITS = {12: (LAST_STATE_BEFORE_12, WIDENED), 15: (LISTED_STATES, COMPARED_STATES)}

RETURNING_JOB = f"RETURNING {JOB_COLUMNS}"
CLAIM_INDEX = "nbqueue_jobs INDEXED BY nbqueue_claim"
CLAIM_AS_J = "nbqueue_jobs AS j INDEXED BY nbqueue_claim"
# Tasks this claim may take; of `signed` tasks, only jobs that carry a signature (checked after).
TASK_ALLOWED = (
    "(:tasks IS NULL OR task IN (SELECT value FROM json_each(:tasks))) AND (signature IS NOT NULL "
    "OR :signed IS NULL OR task NOT IN (SELECT value FROM json_each(:signed)))"
)
IDS = "(SELECT value FROM json_each(:ids))"

# -- the queues to look in: named ones, or every queue that has claimable jobs ------------

NAMED_QUEUES = "waiting(name) AS (SELECT value FROM json_each(:queues))"
# A skip scan of the claim index: one seek per distinct queue, however many jobs wait.
EVERY_WAITING_QUEUE = (
    f"waiting(name) AS (SELECT (SELECT min(queue) FROM {CLAIM_INDEX} WHERE {CLAIMABLE_SQL}) "
    f"UNION ALL SELECT (SELECT min(queue) FROM {CLAIM_INDEX} WHERE {CLAIMABLE_SQL} AND queue > waiting.name) "
    "FROM waiting WHERE waiting.name IS NOT NULL)"
)


TAKE = (
    "UPDATE nbqueue_jobs SET status = 'running', attempts = attempts + 1, worker_id = :worker, "
    "worker_host = :host, worker_pid = :pid, lease_until = :now + :lease, lease_us = :lease, "
    "started_at = :now, updated_at = :now, "
    "progress_done = NULL, progress_total = NULL, progress_message = NULL"
)


def _claim(waiting: str) -> str:
    # One index seek per queue for its best due job that holds no limit key, then the best.
    return (
        f"WITH RECURSIVE {waiting}, heads(id) AS (SELECT (SELECT id FROM {CLAIM_INDEX} "
        f"WHERE {CLAIMABLE_SQL} AND queue = waiting.name AND gate = '' AND run_at <= :now AND {TASK_ALLOWED} "
        f"ORDER BY {CLAIM_ORDER} LIMIT 1) FROM waiting WHERE waiting.name IS NOT NULL) "
        f"{TAKE} WHERE id = (SELECT id FROM nbqueue_jobs WHERE id IN (SELECT id FROM heads) "
        f"ORDER BY {CLAIM_ORDER} LIMIT 1) {RETURNING_JOB}"
    )


def _heads(waiting: str) -> str:
    # Every (queue, gate) with claimable jobs, by skip scans of the claim index, and the best
    # due job of each: the few candidates a claim under limits chooses from.
    pairs = (
        "pairs(queue, gate) AS (SELECT name, (SELECT min(gate) FROM "
        f"{CLAIM_INDEX} WHERE {CLAIMABLE_SQL} AND queue = waiting.name) FROM waiting WHERE name IS NOT NULL "
        f"UNION ALL SELECT queue, (SELECT min(gate) FROM {CLAIM_AS_J} WHERE {CLAIMABLE_SQL} "
        "AND j.queue = pairs.queue AND j.gate > pairs.gate) FROM pairs WHERE gate IS NOT NULL)"
    )
    return (
        f"WITH RECURSIVE {waiting}, {pairs}, heads(id) AS (SELECT (SELECT id FROM {CLAIM_AS_J} "
        f"WHERE {CLAIMABLE_SQL} AND j.queue = pairs.queue AND j.gate = pairs.gate AND run_at <= :now "
        f"AND {TASK_ALLOWED} ORDER BY {CLAIM_ORDER} LIMIT 1) FROM pairs WHERE gate IS NOT NULL) "
        f"SELECT :now, id, limits FROM nbqueue_jobs WHERE id IN (SELECT id FROM heads) "
        f"ORDER BY {CLAIM_ORDER} LIMIT {HEADS}"
    )


def _limited_waiting(waiting: str) -> str:
    return (
        f"WITH RECURSIVE {waiting} SELECT count(*) FROM waiting WHERE name IS NOT NULL AND EXISTS "
        f"(SELECT 1 FROM {CLAIM_AS_J} WHERE {CLAIMABLE_SQL} AND j.queue = waiting.name AND j.gate > '')"
    )


def _next_due(waiting: str) -> str:
    # Exact unless a queue holds over NEXT_DUE_SCAN waiting jobs; the worker re-checks anyway.
    return (
        f"WITH RECURSIVE {waiting} SELECT min((SELECT min(run_at) FROM (SELECT run_at FROM {CLAIM_INDEX} "
        f"WHERE {CLAIMABLE_SQL} AND queue = waiting.name AND {TASK_ALLOWED} LIMIT {NEXT_DUE_SCAN}))) "
        "FROM waiting WHERE waiting.name IS NOT NULL"
    )


CLAIM_FROM_QUEUES = _claim(NAMED_QUEUES)
CLAIM_FROM_ANY_QUEUE = _claim(EVERY_WAITING_QUEUE)
HEADS_IN_QUEUES = _heads(NAMED_QUEUES)
HEADS_IN_ANY_QUEUE = _heads(EVERY_WAITING_QUEUE)
TAKE_ID = f"{TAKE} WHERE id = :chosen AND {CLAIMABLE_SQL} {RETURNING_JOB}"
# (found by id: through the state index, the claim would collect the rows first, then write them)
TAKE_IDS = f"{TAKE} WHERE id IN {IDS} AND +{CLAIMABLE_SQL} {RETURNING_JOB}"
NEXT_OF_GATE = (
    f"SELECT id, limits FROM {CLAIM_INDEX} WHERE {CLAIMABLE_SQL} AND queue = (SELECT queue FROM "
    "nbqueue_jobs WHERE id = :head) AND gate = (SELECT gate FROM nbqueue_jobs WHERE id = :head) "
    f"AND run_at <= :moment AND {TASK_ALLOWED} ORDER BY {CLAIM_ORDER} LIMIT :most"
)
# A batch's further claims from one queue, when no other queue holds claimable jobs (two seeks
# of the claim index tell): that queue's next jobs in claim order are the next ones overall.
OTHER_QUEUE_WAITING = (
    f"SELECT EXISTS (SELECT 1 FROM {CLAIM_INDEX} WHERE {CLAIMABLE_SQL} AND queue < :queue) "
    f"OR EXISTS (SELECT 1 FROM {CLAIM_INDEX} WHERE {CLAIMABLE_SQL} AND queue > :queue)"
)
CLAIM_MORE_IN_QUEUE = (
    f"{TAKE} WHERE id IN (SELECT id FROM {CLAIM_INDEX} WHERE {CLAIMABLE_SQL} AND queue = :queue "
    f"AND gate = '' AND run_at <= :now AND {TASK_ALLOWED} ORDER BY {CLAIM_ORDER} LIMIT :claims) "
    f"{RETURNING_JOB}"
)

# -- streams (nbqueue.emit) ----------------------------------------------------------------

# A run's items, [[seq, JSON text], ...], each stored once (a resumed run emits again from 0),
# none below the oldest kept (what the bound dropped stays dropped).
EMIT = (
    "INSERT INTO nbqueue_stream (job_id, attempt, seq, value, bytes) SELECT :id, :run, "
    "json_extract(e.value, '$[0]'), json_extract(e.value, '$[1]'), "
    "length(CAST(json_extract(e.value, '$[1]') AS BLOB)) FROM json_each(:items) AS e "
    "WHERE json_extract(e.value, '$[0]') >= coalesce((SELECT min(seq) FROM nbqueue_stream "
    "WHERE job_id = :id AND attempt = :run), 0) ON CONFLICT DO NOTHING"
)

# -- limits --------------------------------------------------------------------------------

KEYS = "(SELECT value FROM json_each(:keys))"
# (Not locked: BEGIN IMMEDIATE already holds every write.)
LOCK_KEYS = f"SELECT key, concurrency, rate, burst, tat, paused_until FROM nbqueue_limits WHERE key IN {KEYS}"
# Units of each key that running jobs hold, counted from the jobs themselves (a crashed
# worker's units come back with its lease): only the running jobs are read.
IN_FLIGHT = (
    "SELECT held.key, sum(held.value) FROM nbqueue_jobs INDEXED BY nbqueue_lease, "
    f"json_each(nbqueue_jobs.limits) AS held WHERE status = 'running' AND held.key IN {KEYS} "
    "GROUP BY held.key"
)
# All of a batch in one statement when no job has a key (executemany), in NEW_COLUMNS order.
INSERT = (
    f"INSERT INTO nbqueue_jobs (status, {', '.join(NEW_COLUMNS)}, run_at, created_at, updated_at) "
    f"VALUES ('pending', {', '.join('?' * (len(NEW_COLUMNS) + 3))})"
)
# A batch of successes in one statement, each under its own live claim: :done is a JSON array
# of [id, attempt, result, output]. It returns the ids it completed, and whether each has children.
# `+status` keeps SQLite off the state index: from it, the plan read every running job and, for
# each, the whole array (running jobs x batch); from the array, each job is one rowid lookup.
COMPLETE_MANY = (
    "UPDATE nbqueue_jobs SET status = 'completed', result = d.result, output = d.output, finished_at = :now, "
    "updated_at = :now, lease_until = NULL FROM (SELECT json_extract(value, '$[0]') AS id, "
    "json_extract(value, '$[1]') AS attempt, json_extract(value, '$[2]') AS result, "
    "json_extract(value, '$[3]') AS output FROM json_each(:done)) AS d WHERE nbqueue_jobs.id = d.id "
    "AND +status = 'running' AND attempts = d.attempt AND lease_until > :now "
    "RETURNING nbqueue_jobs.id, has_children"
)

# The file's identity and version, read in one snapshot.
IDENTITY = (
    "SELECT (SELECT application_id FROM pragma_application_id), "
    "(SELECT user_version FROM pragma_user_version), "
    "(SELECT count(*) FROM sqlite_master WHERE name NOT LIKE 'sqlite_%')"
)

DIALECT = Dialect(
    name="sqlite",
    param=":{0}",
    typed=False,
    lists={
        "IN": "IN (SELECT value FROM json_each({0}))",
        "NOT IN": "NOT IN (SELECT value FROM json_each({0}))",
        "EACH": "json_each({0})",
    },
    now=":now",  # SQLite has no server clock: the storage stamps every write
    wake="",  # waiters in other processes see the commit (PRAGMA data_version)
    same="IS",
    greatest="max",
    tail_error=f"substr(error, -{BRIEF_ERROR})",
    # CROSS JOIN keeps the written order (else SQLite starts from every blocked job in the status
    # index, each level of a chain); BEGIN IMMEDIATE already holds the only write lock.
    ordered_join="CROSS JOIN",
    spawned_index=" INDEXED BY nbqueue_spawned_by",
    lock_children="",
    lock_parents="",
    unindexed="+{}",
    lock_row="",
    like="LIKE",  # ASCII letters match either case (a search's LIKE, not case_sensitive_like)
)
_STATUS_IN = "status IN (SELECT value FROM json_each(:statuses))"
SQL = build(
    DIALECT,
    Written(
        COUNTS="SELECT status, sum(n) FROM nbqueue_counts WHERE :queue IS NULL OR queue = :queue "
        "GROUP BY status",
        QUEUES="SELECT DISTINCT queue FROM nbqueue_counts WHERE n > 0 ORDER BY queue",
        # A deleted job's steps, files, attempts and edges go with it (the nbqueue_forget trigger).
        DELETE=f"DELETE FROM nbqueue_jobs WHERE id IN {IDS} AND {FINISHED_SQL} AND NOT {PARENT_NEEDED}",
        PURGE=(
            "DELETE FROM nbqueue_jobs WHERE id IN (SELECT id FROM nbqueue_jobs WHERE updated_at < :now - "
            ":age "
            f"AND {_STATUS_IN} AND {FINISHED_SQL} AND NOT {PARENT_NEEDED} ORDER BY id LIMIT coalesce(:limit, "
            "-1))"
        ),
        DEFINE_LIMIT=(
            "INSERT INTO nbqueue_limits (key, concurrency, rate, burst, updated_at) "
            "VALUES (:key, :concurrency, :rate, :burst, :now) ON CONFLICT (key) DO UPDATE SET "
            "concurrency = excluded.concurrency, rate = excluded.rate, burst = excluded.burst, "
            "updated_at = excluded.updated_at, "
            # a TAT or pause written by hand as no integer (PostgreSQL's BIGINT refuses one) is mended
            "tat = iif(typeof(tat) = 'integer', tat, 0), "
            "paused_until = iif(typeof(paused_until) IN ('integer', 'null'), paused_until, NULL)"
        ),
        LIMITS=(
            "SELECT key, concurrency, rate, burst, tat, paused_until, paused_why, "
            "(SELECT coalesce(sum(held.value), 0) "
            "FROM nbqueue_jobs INDEXED BY nbqueue_lease, json_each(CASE WHEN json_valid(nbqueue_jobs.limits) "
            "THEN nbqueue_jobs.limits END) AS held "  # a row written by hand with no JSON there: none held
            "WHERE status = 'running' AND held.key = nbqueue_limits.key) FROM nbqueue_limits ORDER BY key"
        ),
        WAITING_PER_KEY=(
            # With no limit defined, the outer loop has no row and no job is read (SQLite keeps the
            # order of a CROSS JOIN; it evaluates an EXISTS term row by row).
            "SELECT held.key, count(*) FROM (SELECT 1 FROM nbqueue_limits LIMIT 1) AS defined "
            "CROSS JOIN nbqueue_jobs CROSS JOIN json_each(CASE WHEN json_valid(nbqueue_jobs.limits) "
            "THEN nbqueue_jobs.limits END) AS held "
            f"WHERE {CLAIMABLE_SQL} AND gate > '' GROUP BY held.key"
        ),
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
CHECKPOINT_SQL = build_checkpoints(DIALECT, lock_thread="")  # a write holds the whole file
