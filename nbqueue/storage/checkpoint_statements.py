"""The statements of LangGraph checkpoints (storage/checkpoints.py), written once for both
dialects and rendered by each backend's `Dialect` at import.

Three tables (schema 14): `nbqueue_checkpoints` (a checkpoint without its channel values),
`nbqueue_checkpoint_values` (each channel's value stored once per version, shared by every
checkpoint that reads that version) and `nbqueue_checkpoint_writes` (what tasks wrote after
a checkpoint). Each row is kept per thread and namespace.
"""

from __future__ import annotations

from dataclasses import dataclass

from .dialect import Dialect
from .rules import UNFINISHED_SQL

CHECKPOINT = "thread, ns, id, parent, kind, body, versions"
NO_LIMIT = 2**62  # `LIMIT :limit` for "all": SQLite and PostgreSQL read NULL differently


@dataclass(frozen=True, slots=True)
class CheckpointStatements:
    """Every checkpoint statement, in one dialect."""

    PUT: str
    PUT_VALUE: str
    GET: str
    LATEST: str
    LIST: str
    VALUES: str
    WRITES: str
    KEEP_WRITE: str  # a task's regular write: the first one stored stays
    REPLACE_WRITE: str  # an error, interrupt or resume write: the newest one stays
    HEADS: str
    UNFINISHED: str
    DROP: str
    DROP_WRITES: str
    KEPT_VERSIONS: str
    VALUE_KEYS: str
    DROP_VALUE: str
    OF_RUNS: str
    FORGET_THREADS: tuple[str, ...]
    COPY_THREAD: tuple[str, ...]
    LOCK_THREAD: str  # holds a thread's writers apart until the transaction ends ("": needless)


def build_checkpoints(d: Dialect, lock_thread: str) -> CheckpointStatements:
    """The checkpoint statements in `d`'s spelling; `lock_thread` its way to hold a thread."""
    r = d.render
    where = "thread = :thread AND ns = :ns"
    tables = ("nbqueue_checkpoints", "nbqueue_checkpoint_values", "nbqueue_checkpoint_writes")
    columns = {
        "nbqueue_checkpoints": "ns, id, parent, job_id, run_id, created_at, versions, kind, body",
        "nbqueue_checkpoint_values": "ns, channel, version, kind, value",
        "nbqueue_checkpoint_writes": "ns, checkpoint, task, idx, channel, kind, value, path",
    }
    write = (
        "INSERT INTO nbqueue_checkpoint_writes (thread, ns, checkpoint, task, idx, channel, kind, value, "
        "path) VALUES (:thread, :ns, :id, :task, :idx, :channel, :kind, :value::bytea, :path) "
        "ON CONFLICT (thread, ns, checkpoint, task, idx) DO "
    )
    return CheckpointStatements(
        PUT=r(
            "INSERT INTO nbqueue_checkpoints (thread, ns, id, parent, job_id, run_id, created_at, versions, "
            f"kind, body) VALUES (:thread, :ns, :id, :parent::text, :job::bigint, :run::text, {d.now}, "
            ":versions, :kind, :body::bytea) ON CONFLICT (thread, ns, id) DO UPDATE SET parent = "
            "excluded.parent, job_id = excluded.job_id, run_id = excluded.run_id, versions = "
            "excluded.versions, kind = excluded.kind, body = excluded.body"
        ),
        # Stored once: a version already stored is the same value (LangGraph never reuses one).
        PUT_VALUE=r(
            "INSERT INTO nbqueue_checkpoint_values (thread, ns, channel, version, kind, value) VALUES "
            "(:thread, :ns, :channel, :version, :kind, :value::bytea) ON CONFLICT DO NOTHING"
        ),
        GET=r(f"SELECT {CHECKPOINT} FROM nbqueue_checkpoints WHERE {where} AND id = :id"),
        LATEST=r(f"SELECT {CHECKPOINT} FROM nbqueue_checkpoints WHERE {where} ORDER BY id DESC LIMIT 1"),
        LIST=r(
            f"SELECT {CHECKPOINT} FROM nbqueue_checkpoints WHERE (:thread::text IS NULL OR thread = :thread) "
            "AND (:ns::text IS NULL OR ns = :ns) AND (:id::text IS NULL OR id = :id) "
            "AND (:before::text IS NULL OR id < :before) ORDER BY id DESC, thread, ns LIMIT :limit"
        ),
        # Every stored version of these channels among these versions: the caller keeps the pairs
        # it asked for (a few extra rows at most; both lists use the primary key).
        VALUES=r(
            "SELECT channel, version, kind, value FROM nbqueue_checkpoint_values WHERE "
            f"{where} AND channel IN [:channels::text] AND version IN [:versions::text]"
        ),
        WRITES=r(
            "SELECT task, idx, channel, kind, value, path FROM nbqueue_checkpoint_writes WHERE "
            f"{where} AND checkpoint = :id ORDER BY path, task, idx"
        ),
        KEEP_WRITE=r(write + "NOTHING"),
        REPLACE_WRITE=r(
            write + "UPDATE SET channel = excluded.channel, kind = excluded.kind, value = excluded.value, "
            "path = excluded.path"
        ),
        HEADS=r("SELECT ns, id, job_id, created_at FROM nbqueue_checkpoints WHERE thread = :thread"),
        UNFINISHED=r(f"SELECT id FROM nbqueue_jobs WHERE id IN [:ids::bigint] AND {UNFINISHED_SQL}"),
        DROP=r(f"DELETE FROM nbqueue_checkpoints WHERE {where} AND id IN [:ids::text] RETURNING 1"),
        # Writes whose checkpoint is gone (none is newer than the newest, which retention keeps:
        # a write may be stored before its checkpoint).
        DROP_WRITES=r(
            f"DELETE FROM nbqueue_checkpoint_writes WHERE {where} AND checkpoint < (SELECT id FROM "
            "nbqueue_checkpoints c WHERE c.thread = :thread AND c.ns = :ns ORDER BY id DESC LIMIT 1) "
            "AND NOT EXISTS (SELECT 1 FROM nbqueue_checkpoints c WHERE c.thread = :thread "
            "AND c.ns = :ns AND c.id = checkpoint)"
        ),
        KEPT_VERSIONS=r(f"SELECT versions FROM nbqueue_checkpoints WHERE {where}"),
        VALUE_KEYS=r(f"SELECT channel, version FROM nbqueue_checkpoint_values WHERE {where}"),
        DROP_VALUE=r(
            f"DELETE FROM nbqueue_checkpoint_values WHERE {where} AND channel = :channel "
            "AND version = :version"
        ),
        OF_RUNS=r("SELECT thread, ns, id FROM nbqueue_checkpoints WHERE run_id IN [:runs::text]"),
        FORGET_THREADS=tuple(r(f"DELETE FROM {t} WHERE thread IN [:threads::text]") for t in tables),
        COPY_THREAD=tuple(
            r(
                f"INSERT INTO {t} (thread, {columns[t]}) SELECT :target, {columns[t]} FROM {t} "
                "WHERE thread = :source ON CONFLICT DO NOTHING"
            )
            for t in tables
        ),
        LOCK_THREAD=r(lock_thread) if lock_thread else "",
    )
