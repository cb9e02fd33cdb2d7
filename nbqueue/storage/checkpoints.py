"""LangGraph checkpoints in the queue's own database: the verbs both SQL backends share.

Storage keeps rows and decides nothing: the serializer and the config belong to the saver
(nbqueue.integrations.langgraph), which checkpoints to drop to the retention rule
(nbqueue.checkpoints). A channel's value is stored once per version and shared by every
checkpoint that reads that version; dropping checkpoints drops the values and writes only
they used, in the same transaction.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

from ..records import CheckpointRow, PendingWriteRow, StoredValue
from .checkpoint_statements import NO_LIMIT, CheckpointStatements
from .statements import Params, Tx

T = TypeVar("T")
Head = tuple[str, str, int | None, int]  # ns, checkpoint id, the job that wrote it, created_at (µs)
#: What retention drops, per namespace, given a thread's heads and a way to ask which of some
#: jobs are unfinished (nbqueue.checkpoints decides; the storage runs it in its transaction).
Retain = Callable[[list[Head], Callable[[Sequence[int]], set[int]]], dict[str, list[str]]]


class CheckpointStorage(Protocol):
    """The checkpoint verbs a backend speaks. Each is atomic."""

    def put_checkpoint(
        self,
        row: CheckpointRow,
        values: Sequence[tuple[str, str, StoredValue]],
        job_id: int | None,
        run_id: str | None,
        retain: Retain | None,
    ) -> None:
        """Write a checkpoint and the (channel, version, value)s it stores anew, then drop what
        `retain` says of its thread, in one transaction."""
        ...

    def checkpoint(self, thread: str, ns: str, checkpoint_id: str | None) -> CheckpointRow | None:
        """One checkpoint, or the newest of its thread and namespace (None if there is none)."""
        ...

    def checkpoints(
        self,
        thread: str | None,
        ns: str | None,
        checkpoint_id: str | None,
        before: str | None,
        limit: int | None,
    ) -> list[CheckpointRow]:
        """Checkpoints, newest first; None matches any thread, namespace or id."""
        ...

    def checkpoint_values(self, thread: str, ns: str, versions: dict[str, str]) -> dict[str, StoredValue]:
        """The stored values of these (channel: version)s; a channel with none is left out."""
        ...

    def pending_writes(self, thread: str, ns: str, checkpoint_id: str) -> list[PendingWriteRow]:
        """A checkpoint's pending writes, in (path, task, idx) order."""
        ...

    def put_pending_writes(
        self, thread: str, ns: str, checkpoint_id: str, writes: Sequence[tuple[PendingWriteRow, bool]]
    ) -> None:
        """Write a task's writes together; each (write, replace): a replaced one overwrites what
        is stored under its (task, idx), another keeps the first stored."""
        ...

    def retain_checkpoints(self, thread: str, retain: Retain) -> int:
        """Drop what `retain` says of a thread (with the writes and values only they read); how
        many checkpoints went."""
        ...

    def forget_threads(self, threads: Sequence[str]) -> None:
        """Delete everything these threads stored."""
        ...

    def forget_runs(self, run_ids: Sequence[str]) -> None:
        """Delete the checkpoints these LangGraph runs wrote, with their writes and values."""
        ...

    def copy_thread(self, source: str, target: str) -> None:
        """Copy a thread's checkpoints, values and writes under another thread id."""
        ...


class SqlCheckpoints:
    """The checkpoint verbs over SQL (a part of storage.sql.SqlStorage)."""

    checkpoint_sql: CheckpointStatements

    def _read(self, statement: str, params: Params | None = None) -> list[Any]:
        raise NotImplementedError

    def _transaction(self, work: Callable[[Tx], T], committed: Callable[[], T | None] | None = None) -> T:
        raise NotImplementedError

    def stamp(self) -> int | None:
        raise NotImplementedError

    def put_checkpoint(
        self,
        row: CheckpointRow,
        values: Sequence[tuple[str, str, StoredValue]],
        job_id: int | None,
        run_id: str | None,
        retain: Retain | None,
    ) -> None:
        sql = self.checkpoint_sql
        where = {"thread": row.thread, "ns": row.ns}
        params: Params = {**where, "id": row.id, "parent": row.parent, "job": job_id, "run": run_id}
        params |= {"now": self.stamp(), "versions": row.versions, "kind": row.kind, "body": row.body}

        def work(tx: Tx) -> None:
            _lock(tx, sql, row.thread)
            for channel, version, value in values:
                tx(sql.PUT_VALUE, {**where, "channel": channel, "version": version, **_value(value)})
            tx(sql.PUT, params)
            if retain is not None:
                _retain(tx, sql, row.thread, retain)

        self._transaction(work)

    def checkpoint(self, thread: str, ns: str, checkpoint_id: str | None) -> CheckpointRow | None:
        sql = self.checkpoint_sql
        params = {"thread": thread, "ns": ns, "id": checkpoint_id}
        rows = self._read(sql.LATEST if checkpoint_id is None else sql.GET, params)
        return _checkpoint(rows[0]) if rows else None

    def checkpoints(
        self,
        thread: str | None,
        ns: str | None,
        checkpoint_id: str | None,
        before: str | None,
        limit: int | None,
    ) -> list[CheckpointRow]:
        params = {"thread": thread, "ns": ns, "id": checkpoint_id, "before": before}
        rows = self._read(self.checkpoint_sql.LIST, {**params, "limit": NO_LIMIT if limit is None else limit})
        return [_checkpoint(row) for row in rows]

    def checkpoint_values(self, thread: str, ns: str, versions: dict[str, str]) -> dict[str, StoredValue]:
        if not versions:
            return {}
        params = {"thread": thread, "ns": ns, "channels": list(versions), "versions": list(versions.values())}
        return {
            str(channel): StoredValue(str(kind), bytes(data))
            for channel, version, kind, data in self._read(self.checkpoint_sql.VALUES, params)
            if versions.get(str(channel)) == str(version)
        }

    def pending_writes(self, thread: str, ns: str, checkpoint_id: str) -> list[PendingWriteRow]:
        params = {"thread": thread, "ns": ns, "id": checkpoint_id}
        return [
            PendingWriteRow(str(task), int(idx), str(channel), StoredValue(str(kind), bytes(data)), str(path))
            for task, idx, channel, kind, data, path in self._read(self.checkpoint_sql.WRITES, params)
        ]

    def put_pending_writes(
        self, thread: str, ns: str, checkpoint_id: str, writes: Sequence[tuple[PendingWriteRow, bool]]
    ) -> None:
        sql = self.checkpoint_sql
        where = {"thread": thread, "ns": ns, "id": checkpoint_id}

        def work(tx: Tx) -> None:
            for write, replace in writes:
                fields = {"task": write.task, "idx": write.idx, "channel": write.channel, "path": write.path}
                statement = sql.REPLACE_WRITE if replace else sql.KEEP_WRITE
                tx(statement, {**where, **fields, **_value(write.value)})

        self._transaction(work)

    def retain_checkpoints(self, thread: str, retain: Retain) -> int:
        sql = self.checkpoint_sql

        def work(tx: Tx) -> int:
            _lock(tx, sql, thread)
            return _retain(tx, sql, thread, retain)

        return self._transaction(work)

    def forget_threads(self, threads: Sequence[str]) -> None:
        if threads:
            self._each(self.checkpoint_sql.FORGET_THREADS, {"threads": list(threads)})

    def forget_runs(self, run_ids: Sequence[str]) -> None:
        sql = self.checkpoint_sql

        def work(tx: Tx) -> None:
            found: dict[tuple[str, str], list[str]] = {}
            for thread, ns, checkpoint_id in tx(sql.OF_RUNS, {"runs": list(run_ids)}):
                found.setdefault((str(thread), str(ns)), []).append(str(checkpoint_id))
            for (thread, ns), ids in sorted(found.items()):  # (threads locked in one order)
                _lock(tx, sql, thread)
                _drop(tx, sql, thread, ns, ids)

        if run_ids:
            self._transaction(work)

    def copy_thread(self, source: str, target: str) -> None:
        self._each(self.checkpoint_sql.COPY_THREAD, {"source": source, "target": target})

    def _each(self, statements: Sequence[str], params: Params) -> None:
        def work(tx: Tx) -> None:
            for statement in statements:
                tx(statement, params)

        self._transaction(work)


def _value(value: StoredValue) -> Params:
    return {"kind": value.kind, "value": value.data}


def _checkpoint(row: Any) -> CheckpointRow:
    thread, ns, checkpoint_id, parent, kind, body, versions = row
    return CheckpointRow(
        str(thread), str(ns), str(checkpoint_id), parent, str(kind), bytes(body), str(versions)
    )


def _lock(tx: Tx, sql: CheckpointStatements, thread: str) -> None:
    """Writers of one thread, one after the other (PostgreSQL; a SQLite write holds the file):
    a drop that read which values are still read must not miss a checkpoint put meanwhile."""
    if sql.LOCK_THREAD:
        tx(sql.LOCK_THREAD, {"thread": thread})


def _retain(tx: Tx, sql: CheckpointStatements, thread: str, retain: Retain) -> int:
    heads = [
        (str(ns), str(i), None if job is None else int(job), int(at))
        for ns, i, job, at in tx(sql.HEADS, {"thread": thread})
    ]

    def unfinished(job_ids: Sequence[int]) -> set[int]:
        return {int(i) for (i,) in tx(sql.UNFINISHED, {"ids": list(job_ids)})} if job_ids else set()

    return sum(_drop(tx, sql, thread, ns, ids) for ns, ids in retain(heads, unfinished).items() if ids)


def _drop(tx: Tx, sql: CheckpointStatements, thread: str, ns: str, ids: list[str]) -> int:
    """Checkpoints dropped, then the writes of checkpoints gone (also those written late, after
    their checkpoint was dropped: LangGraph writes on threads of its own), then every value
    that no checkpoint left reads."""
    where = {"thread": thread, "ns": ns}
    dropped = len(tx(sql.DROP, {**where, "ids": ids}))
    tx(sql.DROP_WRITES, where)
    read: set[tuple[str, str]] = set()
    for (versions,) in tx(sql.KEPT_VERSIONS, where):
        read.update((str(c), str(v)) for c, v in json.loads(versions).items())
    for channel, version in tx(sql.VALUE_KEYS, where):
        if (str(channel), str(version)) not in read:
            tx(sql.DROP_VALUE, {**where, "channel": channel, "version": version})
    return dropped
