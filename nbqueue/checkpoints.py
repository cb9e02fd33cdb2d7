"""LangGraph threads kept in the queue's own database: a room of the JobManager
(`manager.checkpoints`), and the retention rule both backends share.

The saver (nbqueue.integrations.langgraph) serializes; this room stores, reads and drops
rows through the storage's checkpoint verbs (storage/checkpoints.py), and decides which
checkpoints retention drops: never a thread's newest in a namespace, never the newest one a
job that has not finished wrote there (where it resumes, even after another writer moved the
thread on), and otherwise those past `keep_last` or older than `max_age`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from .records import CheckpointRow, PendingWriteRow, StoredValue
from .storage import Storage
from .storage.checkpoints import Head, Retain


def doomed(
    heads: Sequence[Head], keep_last: int | None, max_age_us: int | None, now_us: int, unfinished: set[int]
) -> dict[str, list[str]]:
    """The checkpoints retention drops, per namespace, from (ns, id, job, created_at) heads: past
    `keep_last` or older than `max_age`, but never a namespace's newest, nor the newest an
    unfinished job wrote there (where it resumes; its older ones go as any others do)."""
    by_ns: dict[str, list[Head]] = {}
    for head in heads:
        by_ns.setdefault(head[0], []).append(head)
    dropped: dict[str, list[str]] = {}
    for ns, rows in by_ns.items():
        rows.sort(key=lambda head: head[1], reverse=True)  # ids grow with time (uuid6)
        resumed_from: set[int] = set()  # unfinished jobs whose newest checkpoint was passed
        for place, (_, checkpoint_id, job, created_at) in enumerate(rows):
            if job in unfinished and job not in resumed_from:
                resumed_from.add(job)
                continue
            if place == 0:
                continue
            too_many = keep_last is not None and place >= keep_last
            too_old = max_age_us is not None and created_at < now_us - max_age_us
            if too_many or too_old:
                dropped.setdefault(ns, []).append(checkpoint_id)
    return dropped


class Checkpoints:
    """A queue's LangGraph threads: checkpoints, the values they read, pending writes."""

    def __init__(self, storage: Storage, now_us: Callable[[], int]) -> None:
        self._storage = storage
        self._now_us = now_us

    def put(
        self,
        row: CheckpointRow,
        values: Sequence[tuple[str, str, StoredValue]],
        job_id: int | None,
        run_id: str | None,
        keep_last: int | None = None,
        max_age_us: int | None = None,
    ) -> None:
        """Write a checkpoint with the channel values it stores anew (channel, version, value),
        and drop what retention drops of its thread, in one transaction."""
        retain = None if keep_last is None and max_age_us is None else self._rule(keep_last, max_age_us)
        self._storage.put_checkpoint(row, values, job_id, run_id, retain)

    def get(self, thread: str, ns: str, checkpoint_id: str | None) -> CheckpointRow | None:
        """One checkpoint, or the newest of a thread's namespace."""
        return self._storage.checkpoint(thread, ns, checkpoint_id)

    def find(
        self,
        thread: str | None,
        ns: str | None,
        checkpoint_id: str | None = None,
        before: str | None = None,
        limit: int | None = None,
    ) -> list[CheckpointRow]:
        """Checkpoints, newest first (None matches any thread, namespace or id)."""
        return self._storage.checkpoints(thread, ns, checkpoint_id, before, limit)

    def values(self, thread: str, ns: str, versions: dict[str, str]) -> dict[str, StoredValue]:
        """The stored value of each channel at its version."""
        return self._storage.checkpoint_values(thread, ns, versions)

    def writes(self, thread: str, ns: str, checkpoint_id: str) -> list[PendingWriteRow]:
        """A checkpoint's pending writes, in LangGraph's order."""
        return self._storage.pending_writes(thread, ns, checkpoint_id)

    def put_writes(
        self, thread: str, ns: str, checkpoint_id: str, writes: Sequence[tuple[PendingWriteRow, bool]]
    ) -> None:
        """Write a task's writes together (each with whether it replaces one stored)."""
        self._storage.put_pending_writes(thread, ns, checkpoint_id, writes)

    def retain(self, thread: str, keep_last: int | None, max_age_us: int | None) -> int:
        """Drop what retention drops in a thread (see `doomed`); how many checkpoints went."""
        if keep_last is None and max_age_us is None:
            return 0
        return self._storage.retain_checkpoints(thread, self._rule(keep_last, max_age_us))

    def _rule(self, keep_last: int | None, max_age_us: int | None) -> Retain:
        def retain(
            heads: list[Head], unfinished_of: Callable[[Sequence[int]], set[int]]
        ) -> dict[str, list[str]]:
            if max_age_us is None and keep_last is not None and len(heads) <= keep_last:
                return {}  # (each namespace has at most that many: nothing to ask)
            jobs = sorted({job for _, _, job, _ in heads if job is not None})
            return doomed(heads, keep_last, max_age_us, self._now_us(), unfinished_of(jobs))

        return retain

    def delete_threads(self, threads: Sequence[str]) -> None:
        """Delete everything these threads stored."""
        self._storage.forget_threads(threads)

    def delete_runs(self, run_ids: Sequence[str]) -> None:
        """Delete the checkpoints (and their writes and values) these LangGraph runs wrote."""
        self._storage.forget_runs(run_ids)

    def copy_thread(self, source: str, target: str) -> None:
        """Copy a thread under another id."""
        self._storage.copy_thread(source, target)
