"""QueueSaver: LangGraph checkpoints in the queue's own database (SQLite or PostgreSQL).

A checkpoint is stored without its channel values; each value is stored once per (thread,
namespace, channel, version) and read back by the versions the checkpoint names, so a long
thread grows with what changed, not with its whole state at every step. Retention
(`keep_last`, `max_age`) runs after each put, per thread and namespace, by the rule in
nbqueue.checkpoints. The async methods run the same calls on a thread.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import AsyncIterator, Iterable, Iterator, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    get_checkpoint_id,
    get_serializable_checkpoint_metadata,
)

from ... import context
from ...errors import InvalidArgument, StorageError
from ...records import CheckpointRow, PendingWriteRow, StoredValue
from .serde import SafeSerializer

if TYPE_CHECKING:
    from ...queue import Queue

STRATEGIES = ("keep_latest", "delete")
READS = 5  # reads of a thread's newest checkpoint while writers drop the one just read
DELTA = "counters_since_delta_snapshot"  # metadata of a thread that has a DeltaChannel
EMPTY = StoredValue("empty", b"")  # a channel that has a version but no value (LangGraph's own mark)


class QueueSaver(BaseCheckpointSaver[str]):
    """A LangGraph checkpointer that keeps threads in an nbqueue queue's database.

    Args:
        queue: the Queue whose database holds the checkpoints.
        keep_last: keep at most this many checkpoints per thread and namespace (None: all).
        max_age: drop checkpoints older than this (seconds or a timedelta; None: never).
        allowed: your own state types the serializer may build, beyond LangGraph's safe list.

    Retention never drops a namespace's newest checkpoint, nor the newest one a job that has
    not finished wrote (a waiting graph resumes from it).
    """

    def __init__(
        self,
        queue: Queue,
        *,
        keep_last: int | None = None,
        max_age: float | timedelta | None = None,
        allowed: Iterable[type | tuple[str, ...]] = (),
    ) -> None:
        super().__init__(serde=SafeSerializer(allowed))
        if keep_last is not None and (
            isinstance(keep_last, bool) or not isinstance(keep_last, int) or keep_last < 1
        ):
            raise InvalidArgument(f"keep_last is a whole number >= 1 or None, not {keep_last!r}")
        age = max_age.total_seconds() if isinstance(max_age, timedelta) else max_age
        if age is not None and (isinstance(age, bool) or not isinstance(age, int | float) or age <= 0):
            raise InvalidArgument(
                f"max_age is a positive number of seconds, a timedelta or None, not {max_age!r}"
            )
        self.queue = queue
        self.keep_last = keep_last
        self.max_age_us = None if age is None else int(age * 1_000_000)
        self._room = queue.manager.checkpoints

    # -- writing ----------------------------------------------------------------

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Store a checkpoint and the channel values that changed in it."""
        thread, ns, parent = _where(config)
        body: dict[str, Any] = dict(checkpoint)
        values: dict[str, Any] = body.pop("channel_values")
        stored = [
            (channel, str(version), self._dump(values[channel]) if channel in values else EMPTY)
            for channel, version in new_versions.items()
        ]
        meta = get_serializable_checkpoint_metadata(config, metadata)
        kind, data = self.serde.dumps_typed({"checkpoint": body, "metadata": meta})
        versions = json.dumps({str(c): str(v) for c, v in checkpoint["channel_versions"].items()})
        row = CheckpointRow(thread, ns, checkpoint["id"], parent, kind, data, versions)
        running = context.current()  # an unfinished job's newest checkpoint is kept (it resumes there)
        run_id = meta.get("run_id")
        job_id = running.job.id if running else None
        # LangGraph rebuilds a DeltaChannel (beta) from older checkpoints' writes: such a thread
        # is kept whole (its metadata counts the steps since each channel's last snapshot).
        whole = DELTA in meta
        keep_last, max_age_us = (None, None) if whole else (self.keep_last, self.max_age_us)
        self._room.put(row, stored, job_id, None if run_id is None else str(run_id), keep_last, max_age_us)
        return {"configurable": {"thread_id": thread, "checkpoint_ns": ns, "checkpoint_id": checkpoint["id"]}}

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Store a task's writes against a checkpoint (an error or interrupt replaces the last)."""
        thread, ns, checkpoint_id = _where(config)
        if checkpoint_id is None:
            raise InvalidArgument("put_writes needs a config that names its checkpoint (checkpoint_id)")
        rows = [
            (
                PendingWriteRow(
                    task_id, WRITES_IDX_MAP.get(channel, idx), channel, self._dump(value), task_path
                ),
                channel in WRITES_IDX_MAP,
            )
            for idx, (channel, value) in enumerate(writes)
        ]
        self._room.put_writes(thread, ns, checkpoint_id, rows)

    # -- reading ----------------------------------------------------------------

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """The checkpoint the config names, or its thread's newest in its namespace."""
        thread, ns, _ = _where(config)
        checkpoint_id = get_checkpoint_id(config)
        for _ in range(READS):
            row = self._room.get(thread, ns, checkpoint_id)
            found = None if row is None else self._tuple(row)
            if found is not None or row is None or checkpoint_id is not None:
                return found
        raise StorageError(f"thread {thread!r} changed under {READS} reads of its newest checkpoint")

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        """Checkpoints newest first: of a thread (and namespace) or of all, whose metadata holds
        `filter`, before another, at most `limit`."""
        conf = (config or {}).get("configurable", {})
        rows = self._room.find(
            conf.get("thread_id"),
            conf.get("checkpoint_ns"),
            conf.get("checkpoint_id"),
            get_checkpoint_id(before) if before else None,
            None if filter else limit,
        )
        left = limit
        for row in rows:
            if left is not None and left <= 0:
                return
            found = self._tuple(row)
            if found is None:  # dropped while it was read
                continue
            if filter and any(found.metadata.get(k) != v for k, v in filter.items()):
                continue
            if left is not None:
                left -= 1
            yield found

    # -- deleting and copying -----------------------------------------------------

    def delete_thread(self, thread_id: str) -> None:
        """Delete everything a thread stored."""
        self._room.delete_threads([str(thread_id)])

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Delete the checkpoints these runs wrote (with their writes and the values only they read)."""
        self._room.delete_runs([str(r) for r in run_ids])

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copy a thread's checkpoints, values and writes under another thread id."""
        self._room.copy_thread(str(source_thread_id), str(target_thread_id))

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """Either keep each namespace's newest checkpoint (and an unfinished job's newest):
        "keep_latest"; or delete the threads: "delete"."""
        if strategy not in STRATEGIES:
            raise InvalidArgument(f"prune's strategy is one of {', '.join(STRATEGIES)}, not {strategy!r}")
        if strategy == "delete":
            self._room.delete_threads([str(t) for t in thread_ids])
            return
        for thread in thread_ids:
            newest = self.get_tuple({"configurable": {"thread_id": str(thread)}})
            if newest is None or DELTA not in newest.metadata:  # (a DeltaChannel's is kept whole)
                self._room.retain(str(thread), 1, None)

    # -- async: the same calls, on a thread ------------------------------------------

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return await asyncio.to_thread(self.get_tuple, config)

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        def listed() -> list[CheckpointTuple]:
            return list(self.list(config, filter=filter, before=before, limit=limit))

        for item in await asyncio.to_thread(listed):
            yield item

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        return await asyncio.to_thread(self.put, config, checkpoint, metadata, new_versions)

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        await asyncio.to_thread(self.put_writes, config, writes, task_id, task_path)

    async def adelete_thread(self, thread_id: str) -> None:
        await asyncio.to_thread(self.delete_thread, thread_id)

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        await asyncio.to_thread(self.delete_for_runs, run_ids)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        await asyncio.to_thread(self.copy_thread, source_thread_id, target_thread_id)

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        await asyncio.to_thread(self.prune, thread_ids, strategy=strategy)

    def get_next_version(self, current: str | None, channel: None) -> str:
        """A version that sorts after `current` and is never reused: a fork's values get
        versions of their own, so a value stored once is never the wrong one."""
        number = 0 if current is None else int(str(current).split(".")[0])
        return f"{number + 1:032}.{random.random():016}"

    # -- rows -------------------------------------------------------------------

    def _dump(self, value: Any) -> StoredValue:
        kind, data = self.serde.dumps_typed(value)
        return StoredValue(kind, data)

    def _load(self, value: StoredValue) -> Any:
        return self.serde.loads_typed((value.kind, value.data))

    def _tuple(self, row: CheckpointRow) -> CheckpointTuple | None:
        """The checkpoint with its values and writes; None if retention dropped it meanwhile.
        (Its row, values and writes are three reads: a checkpoint whose values came back short
        is looked for again, and one gone since is not returned without them.)"""
        body = self._load(StoredValue(row.kind, row.body))
        checkpoint = body["checkpoint"]
        versions = json.loads(row.versions)
        values = self._room.values(row.thread, row.ns, versions)
        if len(values) < len(versions) and self._room.get(row.thread, row.ns, row.id) is None:
            return None
        checkpoint["channel_values"] = {
            channel: self._load(value) for channel, value in values.items() if value.kind != "empty"
        }
        stored = self._room.writes(row.thread, row.ns, row.id)
        writes = [(w.task, w.channel, self._load(w.value)) for w in stored]
        here = {"thread_id": row.thread, "checkpoint_ns": row.ns}
        return CheckpointTuple(
            config={"configurable": {**here, "checkpoint_id": row.id}},
            checkpoint=checkpoint,
            metadata=body["metadata"],
            parent_config={"configurable": {**here, "checkpoint_id": row.parent}} if row.parent else None,
            pending_writes=writes,
        )


def _where(config: RunnableConfig) -> tuple[str, str, str | None]:
    """(thread, namespace, checkpoint id) a config names."""
    conf = config.get("configurable") or {}
    if conf.get("thread_id") is None:
        raise InvalidArgument('a checkpoint config needs {"configurable": {"thread_id": ...}}')
    return str(conf["thread_id"]), str(conf.get("checkpoint_ns") or ""), conf.get("checkpoint_id")
