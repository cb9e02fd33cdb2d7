"""The statements of jobs that wait (storage/waits.py), written once for both dialects: a part
of `statements.build`, kept here so that each module stays one screenful of ideas."""

from __future__ import annotations

from collections.abc import Callable


def wait_statements(
    r: Callable[[str], str],
    now: str,
    lock_row: str,
    wake: str,
    unindexed: str,
    LIVE_CLAIM: str,
) -> dict[str, str]:
    """Reaching a wait, suspending, sending and waking, rendered by `r` with the dialect's clock
    (`now`), row lock, wake-up and state test that no index answers (statements.Dialect);
    `LIVE_CLAIM`: the condition that a claim (:id, :attempt) still holds the job."""
    # A batch's rows are found by their ids: the state index would make SQLite collect them
    # first and write them in a second pass (the index it walks is the one the update changes).
    running, waiting = "status = 'running'", "status = 'waiting'"
    return {
        # Jobs that wait: the claim (or the job) locked first, so a send and a suspension of the same
        # job run one after the other (storage/waits.py says why that loses no wake-up).
        "LOCK_CLAIM": r(f"SELECT 1 FROM nbqueue_jobs WHERE {LIVE_CLAIM} AND lease_until > {now}{lock_row}"),
        # One job (q.send) by its id, many (send_many) by a list: a list costs SQLite a JSON parse.
        "LOCK_JOB": r(f"SELECT id, status FROM nbqueue_jobs WHERE id = :id{lock_row}"),
        "LOCK_JOBS": r(
            f"SELECT id, status FROM nbqueue_jobs WHERE id IN [:ids::bigint] ORDER BY id{lock_row}"
        ),
        "WAIT_OF": r(
            "SELECT kind, choices, deadline, value, expired_at FROM nbqueue_waits WHERE job_id = :id AND "
            "name = :name"
        ),
        # What the jobs claimed together recorded of their waits (a read, once for all of them
        # when the first reaches a wait), and the names of their steps.
        "PEEK_WAITS": r(
            "SELECT job_id, name, kind, choices, deadline, value, expired_at FROM nbqueue_waits "
            "WHERE job_id IN [:ids::bigint] UNION ALL SELECT job_id, name, 'step', NULL, NULL, NULL, NULL "
            "FROM nbqueue_steps WHERE job_id IN [:ids::bigint] AND error IS NULL"
        ),
        # A send's look at the wait it answers, for the job or every job sent to.
        "WAIT_NAMED": r(
            "SELECT job_id, kind, choices, value, expired_at FROM nbqueue_waits WHERE job_id = :id "
            "AND name = :name"
        ),
        "WAITS_NAMED": r(
            "SELECT job_id, kind, choices, value, expired_at FROM nbqueue_waits "
            "WHERE job_id IN [:ids::bigint] AND name = :name"
        ),
        # The deadline is fixed when the wait is first reached; a later run keeps it.
        "REACH": r(
            "INSERT INTO nbqueue_waits (job_id, name, kind, prompt, choices, deadline, reached_at) SELECT "
            f"value, :name::text, :kind::text, :prompt::text, :choices::text, :deadline::bigint, {now} FROM "
            "EACH [:ids::bigint] WHERE true ON CONFLICT (job_id, name) DO UPDATE SET kind = excluded.kind, "
            "prompt = excluded.prompt, choices = excluded.choices, "
            "deadline = coalesce(nbqueue_waits.deadline, excluded.deadline), "
            "reached_at = coalesce(nbqueue_waits.reached_at, excluded.reached_at) RETURNING job_id, value"
        ),
        "DROP_SENT": r(
            "UPDATE nbqueue_waits SET value = NULL, sent_by = NULL, sent_at = NULL WHERE job_id = :id "
            "AND name = :name"
        ),
        "EXPIRE": r(f"UPDATE nbqueue_waits SET expired_at = {now} WHERE job_id = :id AND name = :name"),
        "SEND": r(
            "INSERT INTO nbqueue_waits (job_id, name, value, sent_by, sent_at) VALUES "
            f"(:id, :name, :value, :by, {now}) ON CONFLICT (job_id, name) DO UPDATE SET "
            "value = excluded.value, sent_by = excluded.sent_by, sent_at = excluded.sent_at"
        ),
        "SEND_MANY": r(
            "INSERT INTO nbqueue_waits (job_id, name, value, sent_by, sent_at) SELECT value, :name::text, "
            f":value::text, :by::text, {now} FROM EACH [:ids::bigint] WHERE true ON CONFLICT (job_id, name) "
            "DO UPDATE SET value = excluded.value, sent_by = excluded.sent_by, sent_at = excluded.sent_at"
        ),
        # Fenced like a completion; the lease, the worker's slot and the limit units (counted from
        # running jobs) are released with the state.
        "SUSPEND": r(
            f"UPDATE nbqueue_jobs SET status = 'waiting', run_at = :wake, lease_until = NULL, updated_at = "
            f"{now}, parents_left = :left, wait_when = coalesce(:when::text, wait_when) WHERE {LIVE_CLAIM} "
            f"AND lease_until > {now} RETURNING 1"
        ),
        # The same for jobs that wait alike (one attempt, one wake-up, no parents): a worker's batch.
        "SUSPEND_MANY": r(
            "UPDATE nbqueue_jobs SET status = 'waiting', run_at = :wake::bigint, lease_until = NULL, "
            f"updated_at = {now}, parents_left = 0 WHERE id IN [:ids::bigint] "
            f"AND {unindexed.format(running)} AND attempts = :attempt AND lease_until > {now} RETURNING id"
        ),
        "WAKE_SENT": r(
            f"UPDATE nbqueue_jobs SET status = 'pending', run_at = {now}, updated_at = {now} "
            f"WHERE id = :id AND status = 'waiting' RETURNING id{wake}"
        ),
        "WAKE_SENT_MANY": r(
            f"UPDATE nbqueue_jobs SET status = 'pending', run_at = {now}, updated_at = {now} "
            f"WHERE id IN [:ids::bigint] AND {unindexed.format(waiting)} RETURNING id{wake}"
        ),
        "WAKE_DUE": r(
            f"UPDATE nbqueue_jobs SET status = 'pending', updated_at = {now} WHERE id IN (SELECT id FROM "
            f"nbqueue_jobs WHERE status = 'waiting' AND run_at <= {now} ORDER BY run_at LIMIT :limit) "
            f"AND status = 'waiting' RETURNING id{wake}"
        ),
        "NEXT_WAKE": r("SELECT min(run_at) FROM nbqueue_jobs WHERE status = 'waiting'"),
        "WAITS": r(
            "SELECT job_id, name, kind, prompt, choices, deadline, value, sent_by, sent_at, expired_at, "
            "reached_at FROM nbqueue_waits WHERE job_id IN [:ids::bigint] "
            "ORDER BY job_id, coalesce(reached_at, sent_at), name"
        ),
        # A fresh start (requeue) forgets recorded expiries: the wait is reached anew.
        "FORGET_EXPIRIES": r(
            "UPDATE nbqueue_waits SET expired_at = NULL, deadline = NULL WHERE job_id IN [:ids::bigint] "
            "AND expired_at IS NOT NULL"
        ),
        "FORGET_WAITS": r(
            "DELETE FROM nbqueue_waits WHERE job_id = :id AND coalesce(reached_at, sent_at) >= :since"
        ),
    }
