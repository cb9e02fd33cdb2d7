"""QueueSaver, LangGraph's checkpointer in the queue's own database, on both backends (the contract:
design/AGENTS.md "Agent frameworks on nbqueue").

LangGraph's published conformance suite (async and sync API), retention per thread and namespace
(keep_last, max_age, unfinished jobs, prune, delete_for_runs) with writers and readers at once,
channel values stored once, a serializer that refuses rows someone planted, and the arguments it
refuses. Real graphs, real SQLite files and the real PostgreSQL server; stored rows are read and
planted straight in the database.
"""

from __future__ import annotations

import asyncio
import json
import pickle
import re
import shlex
import sqlite3
import threading
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import closing
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Annotated, Any, TypedDict

import ormsgpack
import psycopg
import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    empty_checkpoint,
)
from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.report import CapabilityReport
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.serde.jsonplus import (
    EXT_CONSTRUCTOR_KW_ARGS,
    EXT_CONSTRUCTOR_POS_ARGS,
    EXT_CONSTRUCTOR_SINGLE_ARG,
    EXT_METHOD_SINGLE_ARG,
    EXT_PYDANTIC_V2,
    JsonPlusSerializer,
)
from langgraph.graph import END, START, StateGraph

import nbqueue
from nbqueue import InvalidArgument, Queue
from nbqueue.checkpoints import doomed
from nbqueue.integrations.langgraph import QueueSaver, SafeSerializer, UnsafeCheckpoint
from tests.helpers import QUICK, MakeQueue, raw_rows, wait_until
from tests.test_migrations import postgres_at, sqlite_at

TABLES = ("nbqueue_checkpoints", "nbqueue_checkpoint_values", "nbqueue_checkpoint_writes")
BASE = {"put", "put_writes", "get_tuple", "list", "delete_thread"}
CAPABILITIES = BASE | {"prune", "copy_thread", "delete_for_runs"}  # LangGraph's extended ones


def config(thread: str, ns: str = "", checkpoint_id: str | None = None) -> RunnableConfig:
    conf: dict[str, Any] = {"thread_id": thread, "checkpoint_ns": ns}
    if checkpoint_id is not None:
        conf["checkpoint_id"] = checkpoint_id
    return {"configurable": conf}


class Db:
    """The queue's database read (and written) straight, beside nbqueue: a connection of its own."""

    def __init__(self, target: str, backend: str) -> None:
        self.target, self.backend = target, backend

    def rows(self, sql: str) -> list[tuple[Any, ...]]:
        return raw_rows(self.target, self.backend, sql)

    def ids(self, where: str = "TRUE") -> set[str]:
        return {str(i) for (i,) in self.rows(f"SELECT id FROM nbqueue_checkpoints WHERE {where}")}

    def counts(self, thread: str) -> tuple[int, ...]:
        """(checkpoints, values, writes) a thread holds."""
        return tuple(
            int(self.rows(f"SELECT count(*) FROM {t} WHERE thread = '{thread}'")[0][0]) for t in TABLES
        )

    def values_match_kept_checkpoints(self, thread: str) -> None:
        """The stored values are exactly those some kept checkpoint reads: none a dropped one alone
        read is left, none a kept one reads is gone; writes belong to kept checkpoints only."""
        kept = self.rows(f"SELECT ns, id, versions FROM nbqueue_checkpoints WHERE thread = '{thread}'")
        read = {(ns, c, v) for ns, _, versions in kept for c, v in json.loads(versions).items()}
        stored = self.rows(
            f"SELECT ns, channel, version FROM nbqueue_checkpoint_values WHERE thread = '{thread}'"
        )
        assert set(stored) == read
        writes = self.rows(f"SELECT ns, checkpoint FROM nbqueue_checkpoint_writes WHERE thread = '{thread}'")
        assert set(writes) <= {(ns, i) for ns, i, _ in kept}

    def plant(self, sql: str, *params: Any) -> None:
        """Write rows behind nbqueue's back, as anyone with access to the database could."""
        if self.backend == "sqlite":
            with closing(sqlite3.connect(self.target)) as conn, conn:
                assert conn.execute(sql, params).rowcount >= 1
            return
        server, schema = self.target.split("?schema=")
        with psycopg.connect(server, options=f"-c search_path={schema}") as pg:
            assert pg.execute(sql.replace("?", "%s"), params).rowcount >= 1  # type: ignore[arg-type]


@pytest.fixture
def db(queue_target: str, backend: str) -> Db:
    return Db(queue_target, backend)


class Thread:
    """Puts checkpoints one after another on a thread's namespace as a graph does: each put
    names the channels it changed, at versions the saver gives, the previous one its parent."""

    def __init__(self, saver: QueueSaver, thread: str, ns: str = "", run: str | None = None) -> None:
        self.saver, self.config, self.run = saver, config(thread, ns), run
        self.versions: dict[str, str] = {}
        self.values: dict[str, Any] = {}
        self.step = 0

    def put(self, **changed: Any) -> str:
        new: ChannelVersions = {c: self.saver.get_next_version(self.versions.get(c), None) for c in changed}
        self.versions.update({c: str(v) for c, v in new.items()})
        self.values.update(changed)
        checkpoint: Checkpoint = empty_checkpoint()
        checkpoint["channel_values"] = dict(self.values)
        checkpoint["channel_versions"] = dict(self.versions)
        metadata: CheckpointMetadata = {"source": "loop", "step": self.step, "parents": {}}
        if self.run is not None:
            metadata["run_id"] = self.run  # type: ignore[typeddict-unknown-key]
        self.step += 1
        self.config = self.saver.put(self.config, checkpoint, metadata, new)
        return str(self.config["configurable"]["checkpoint_id"])


class Counter(TypedDict):
    topic: str  # written once, by the input
    n: int  # changes every step
    until: int


def counter_graph() -> StateGraph[Counter]:
    """A loop: one node counting n up to `until`, a checkpoint per step."""

    def step(state: Counter) -> dict[str, int]:
        return {"n": state["n"] + 1}

    builder = StateGraph(Counter)
    builder.add_node("step", step)
    builder.add_edge(START, "step")
    builder.add_conditional_edges("step", lambda s: "step" if s["n"] < s["until"] else END)
    return builder


def run(saver: BaseCheckpointSaver[Any], thread: str, until: int, topic: str = "loops") -> dict[str, Any]:
    graph = counter_graph().compile(checkpointer=saver)
    cfg: RunnableConfig = {**config(thread), "recursion_limit": until + 10}
    return dict(graph.invoke({"topic": topic, "n": 0, "until": until}, cfg))


# -- LangGraph's conformance suite -----------------------------------------------------------------


class SyncDriven(QueueSaver):
    """The async methods call the sync ones directly (no thread): the suite checks the sync API."""

    async def alist(self, config: RunnableConfig | None, **options: Any) -> AsyncIterator[CheckpointTuple]:
        for found in self.list(config, **options):
            yield found


def _direct(verb: str) -> Callable[..., Awaitable[Any]]:
    async def call(self: QueueSaver, *args: Any, **kwargs: Any) -> Any:
        return getattr(self, verb)(*args, **kwargs)

    return call


for _verb in ("get_tuple", "put", "put_writes", "delete_thread", "delete_for_runs", "copy_thread", "prune"):
    setattr(SyncDriven, f"a{_verb}", _direct(_verb))


def conformance(
    saver_type: type[QueueSaver], where: Path, server: str, capabilities: set[str] | None = None
) -> tuple[CapabilityReport, list[str]]:
    """LangGraph's suite, each capability's part on a fresh queue (its own file, or its own schema
    dropped after); the report and the queues made."""
    made: list[str] = []

    @checkpointer_test(name=f"{saver_type.__name__}-{uuid.uuid4().hex[:6]}")
    async def fresh() -> AsyncIterator[QueueSaver]:
        name = f"nbq_test_lg_{uuid.uuid4().hex[:10]}"
        q = Queue(f"{server}?schema={name}" if server else str(where / f"{name}.db"))
        made.append(name)
        try:
            yield saver_type(q)
        finally:
            q.close()
            if server:
                with psycopg.connect(server, autocommit=True) as conn:
                    conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')

    return asyncio.run(validate(fresh, capabilities=capabilities)), made


@pytest.fixture
def server(backend: str, request: pytest.FixtureRequest) -> str:
    """The PostgreSQL server for the suite's fresh schemas ("" on SQLite)."""
    return str(request.getfixturevalue("pg_server")) if backend == "postgres" else ""


@pytest.mark.parametrize("saver_type", [QueueSaver, SyncDriven], ids=["async", "sync"])
def test_conformance_suite_passes(saver_type: type[QueueSaver], tmp_path: Path, server: str) -> None:
    report, made = conformance(saver_type, tmp_path, server)
    failures = {
        cap: (result.detected, result.passed, result.failures)
        for cap, result in report.results.items()
        if not (result.detected and result.passed is True)
    }
    assert not failures, "\n".join(
        f"{cap}: detected={d} passed={p}\n  " + "\n  ".join(f) for cap, (d, p, f) in failures.items()
    )
    assert set(report.results) == CAPABILITIES and len(made) == len(CAPABILITIES)
    assert report.passed_all_base() and {c for c, r in report.results.items() if r.passed} >= BASE
    assert all(r.tests_passed > 0 and r.tests_failed == 0 for r in report.results.values())


class KeepsEverything(QueueSaver):
    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        pass  # a prune that prunes nothing


def test_the_suite_as_driven_here_catches_a_capability_that_is_broken(tmp_path: Path, server: str) -> None:
    """The check above can fail: a saver whose prune does nothing fails the suite's prune part."""
    report, _ = conformance(KeepsEverything, tmp_path, server, {"prune"})
    assert report.results["prune"].detected and report.results["prune"].passed is False
    assert report.results["prune"].failures


# -- retention -------------------------------------------------------------------------------------


def test_keep_last_keeps_n_of_a_real_thread_and_the_values_they_read(queue: Queue, db: Db) -> None:
    kept = QueueSaver(queue, keep_last=5)
    final = run(kept, "kept", 30)
    run(QueueSaver(queue), "all", 30)  # the same thread, every checkpoint kept: what retention saves
    assert final["n"] == 30
    assert db.counts("kept")[0] == 5
    assert db.counts("all")[0] == 32  # the input's, then one per step
    db.values_match_kept_checkpoints("kept")
    assert db.counts("kept")[1] < db.counts("all")[1] / 3
    newest = kept.get_tuple(config("kept"))
    assert newest is not None and newest.checkpoint["channel_values"] == final  # topic: written at step 0
    assert counter_graph().compile(checkpointer=kept).get_state(config("kept")).values == final


def test_keep_last_counts_each_namespace_apart_and_keeps_each_ones_newest(queue: Queue, db: Db) -> None:
    saver = QueueSaver(queue, keep_last=2)
    outer, inner = Thread(saver, "t"), Thread(saver, "t", "inner:1")
    inner_ids = [inner.put(x=i) for i in range(3)]
    outer_ids = []
    for i in range(7):
        outer_ids.append(outer.put(x=i, **({"shared": "once"} if i == 0 else {})))
        saver.put_writes(outer.config, [("x", i * 10)], f"task-{i}")  # dropped with their checkpoint
    heads = db.rows("SELECT ns, id FROM nbqueue_checkpoints WHERE thread = 't'")
    assert sorted(heads) == sorted(
        [("", i) for i in outer_ids[-2:]] + [("inner:1", i) for i in inner_ids[1:]]
    )
    db.values_match_kept_checkpoints("t")
    assert db.counts("t")[2] == 2
    newest = saver.get_tuple(config("t"))  # "shared", written by a dropped checkpoint, still read
    assert newest is not None and newest.checkpoint["channel_values"] == {"x": 6, "shared": "once"}
    assert newest.pending_writes == [("task-6", "x", 60)]


def test_a_late_write_for_a_dropped_checkpoint_goes_at_the_next_retention(queue: Queue, db: Db) -> None:
    """LangGraph (durability="async", its default) stores a task's writes on its own threads, not
    after the next checkpoints: under load they can land once retention already dropped their
    checkpoint. Such writes are read by nothing: the next retention drops them."""
    saver = QueueSaver(queue, keep_last=1)
    writer = Thread(saver, "t")
    first = writer.put(x=0)
    writer.put(x=1)  # drops `first`
    saver.put_writes(config("t", "", first), [("x", "late")], "task-0")  # arrives late
    writer.put(x=2)
    assert db.ids() == {writer.config["configurable"]["checkpoint_id"]}
    assert db.rows(f"SELECT count(*) FROM nbqueue_checkpoint_writes WHERE checkpoint = '{first}'") == [(0,)]


def test_max_age_keeps_namespaces_newest(clocked_queue: Queue, clock: nbqueue.ManualClock, db: Db) -> None:
    saver = QueueSaver(clocked_queue, max_age=timedelta(minutes=1))
    outer, inner = Thread(saver, "t"), Thread(saver, "t", "inner:1")
    inner_newest = [inner.put(x=i) for i in range(2)][-1]
    for i in range(3):
        outer.put(x=i)
    clock.advance(30)
    recent = [outer.put(x=i) for i in range(3, 5)]
    assert len(db.ids()) == 7  # nothing is a minute old yet
    clock.advance(40)  # the first three are 70 s old, the last two 40 s
    newest = outer.put(x=5)
    assert db.ids() == {*recent, newest, inner_newest}  # inner's 70 s old newest: its namespace's newest
    clock.advance(3600)
    last = outer.put(x=6)
    assert db.ids() == {last, inner_newest}
    db.values_match_kept_checkpoints("t")
    found = saver.get_tuple(config("t"))
    assert found is not None and found.checkpoint["channel_values"] == {"x": 6}


def test_an_unfinished_jobs_newest_checkpoint_is_kept_until_it_finishes(queue: Queue, db: Db) -> None:
    """A waiting job resumes from the newest checkpoint it wrote: kept however far another writer
    moves the thread on, dropped by the first put after the job finished; its older ones go."""
    saver = QueueSaver(queue, keep_last=2)
    graph = counter_graph().compile(checkpointer=saver)

    @queue.task(name="lg.hold")
    def hold() -> Any:
        if saver.get_tuple(config("t")) is None:  # the first run; a resumed one only waits
            graph.invoke({"topic": "job", "n": 0, "until": 6}, config("t"))  # puts on LangGraph's threads
        return nbqueue.wait_for("go")

    job = hold.enqueue()
    with queue.worker(**QUICK) as worker:
        worker.run_until_idle()
    assert queue.get(job.id).status == "waiting"
    # What the graph wrote inside the job names the job (its puts ran on LangGraph's own threads).
    written = db.ids(f"job_id = {job.id}")
    assert len(written) == 2 and db.ids() == written  # 8 written, keep_last of them kept
    resumes_at = max(written)
    run(saver, "t", 3)  # another writer moves the thread on by 5 checkpoints
    assert db.ids(f"job_id = {job.id}") == {resumes_at} and len(db.ids()) == 3  # past keep_last, kept
    saver.prune(["t"])  # keep_latest keeps it too
    assert db.ids(f"job_id = {job.id}") == {resumes_at} and len(db.ids()) == 2
    queue.send(job, "go", "now")
    with queue.worker(**QUICK):
        assert job.result(timeout=10) == "now"
    assert db.ids(f"job_id = {job.id}") == {resumes_at}  # finishing drops nothing by itself
    Thread(saver, "t").put(n=1)  # the next put does
    assert not db.ids(f"job_id = {job.id}") and len(db.ids()) == 2
    db.values_match_kept_checkpoints("t")


def test_prune_keeps_each_namespaces_newest_or_deletes_the_thread(queue: Queue, db: Db) -> None:
    saver = QueueSaver(queue)
    for thread in ("a", "b", "other"):
        for ns in ("", "inner:1"):
            writer = Thread(saver, thread, ns)
            for i in range(4):
                writer.put(x=i, y=f"{thread}{ns}{i}")
                saver.put_writes(writer.config, [("x", i * 10)], f"task-{i}")
    whole = db.counts("other")
    assert whole == (8, 16, 8)
    with pytest.raises(InvalidArgument, match=r"strategy.*'latest'"):
        saver.prune(["a"], strategy="latest")
    assert db.counts("a") == whole  # refused before anything was dropped
    saver.prune(["a"], strategy="keep_latest")
    assert db.counts("a") == (2, 4, 2)  # each namespace's newest, its values and its writes
    db.values_match_kept_checkpoints("a")
    newest = saver.get_tuple(config("a", "inner:1"))
    assert newest is not None and newest.checkpoint["channel_values"] == {"x": 3, "y": "ainner:13"}
    assert newest.pending_writes == [("task-3", "x", 30)]
    saver.prune(["b"], strategy="delete")
    assert db.counts("b") == (0, 0, 0) and saver.get_tuple(config("b")) is None
    assert db.counts("other") == whole


def test_delete_for_runs_drops_the_values_only_their_checkpoints_read(queue: Queue, db: Db) -> None:
    saver = QueueSaver(queue)
    first, second = Thread(saver, "t", run="run-1"), Thread(saver, "t", run="run-2")
    for i in range(3):
        first.put(x=i, **({"topic": "once"} if i == 0 else {}))
    second.versions, second.values, second.config = dict(first.versions), dict(first.values), first.config
    for i in range(3, 5):
        second.put(x=i)
    saver.copy_thread("t", "u")
    assert db.counts("u") == db.counts("t") == (5, 6, 0)
    saver.delete_for_runs(["run-2"])
    for thread in ("t", "u"):
        assert db.counts(thread) == (3, 4, 0)  # the newest went too: the run that wrote it is gone
        db.values_match_kept_checkpoints(thread)
        found = saver.get_tuple(config(thread))
        assert found is not None and found.checkpoint["channel_values"] == {"x": 2, "topic": "once"}
    saver.delete_for_runs(["run-1"])
    assert db.counts("t") == db.counts("u") == (0, 0, 0)


def test_concurrent_writers_never_lose_a_kept_checkpoints_values(make_queue: MakeQueue, db: Db) -> None:
    """Four writers (each its own queue, so its own connection) put on one thread and namespace at
    once with retention on: every kept checkpoint still reads its values. (One writer's retention
    must not delete the values of a checkpoint another writer committed while it ran.)"""
    lost: list[tuple[int, int]] = []

    def writer(k: int) -> None:
        saver = QueueSaver(make_queue(), keep_last=20)
        thread = Thread(saver, "t")
        for i in range(60):
            checkpoint_id = thread.put(**{f"c{k}": i})
            found = saver.get_tuple(config("t", "", checkpoint_id))
            if found is None or found.checkpoint["channel_values"] == {f"c{k}": i}:
                continue  # (None: dropped already, the others put 20 since)
            # Read without its value: lost, if the checkpoint is still there and its value is not
            # (one statement, one snapshot; a checkpoint dropped meanwhile is no loss).
            version = thread.versions[f"c{k}"]
            still = db.rows(
                f"SELECT count(*) FROM nbqueue_checkpoints WHERE id = '{checkpoint_id}' AND NOT EXISTS "
                f"(SELECT 1 FROM nbqueue_checkpoint_values WHERE channel = 'c{k}' AND version = '{version}')"
            )
            if still == [(1,)]:
                lost.append((k, i))

    writers = [threading.Thread(target=writer, args=(k,)) for k in range(4)]
    for one in writers:
        one.start()
    for one in writers:
        one.join(60)
    assert not lost, f"{len(lost)} of 240 kept checkpoints lost their values (writer, step): {lost[:5]}"
    assert len(db.ids()) == 20
    db.values_match_kept_checkpoints("t")


def test_a_reader_never_sees_a_checkpoint_without_its_values(
    queue: Queue, make_queue: MakeQueue, db: Db, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The newest state read while a writer with keep_last=1 moves the thread on (a notebook's
    graph.get_state beside a running graph job) is whole: the checkpoint found with its values,
    or the writer's next one, never the one found without the values retention just dropped.
    (The writer's put is made to land between the reader's two reads, the checkpoint's row and
    its values, through the room both go through: the race, every time.)"""
    writer = Thread(QueueSaver(make_queue(), keep_last=1), "t")
    first = writer.put(n=0, topic="once")
    room = queue.manager.checkpoints  # the reader's
    read_values = room.values

    def values_after_a_put(thread: str, ns: str, versions: dict[str, str]) -> Any:
        if writer.step == 1:
            writer.put(n=1)  # drops `first`, and n's value only it read
        return read_values(thread, ns, versions)

    monkeypatch.setattr(room, "values", values_after_a_put)
    found = QueueSaver(queue).get_tuple(config("t"))
    assert writer.step == 2 and first not in db.ids()  # the race happened
    assert found is not None, "a thread with a checkpoint read as empty"
    n = 0 if found.checkpoint["id"] == first else 1
    assert found.checkpoint["channel_values"] == {"n": n, "topic": "once"}, "a partial checkpoint"


def extend(state: list[int] | None, writes: Sequence[list[int]]) -> list[int]:
    return [*(state or []), *(item for write in writes for item in write)]


def test_a_thread_with_a_delta_channel_is_kept_whole(queue: Queue, db: Db) -> None:
    """LangGraph rebuilds a DeltaChannel (beta) from the writes of older checkpoints: retention
    leaves such a thread whole (dropping them lost all but the last few items)."""
    from langgraph.channels.delta import DeltaChannel

    State = TypedDict("State", {"items": Annotated[list, DeltaChannel(extend)], "n": int})  # type: ignore[type-arg]  # noqa: UP013
    builder = StateGraph(State)
    builder.add_node("step", lambda s: {"items": [s["n"]], "n": s["n"] + 1})
    builder.add_edge(START, "step")
    builder.add_conditional_edges("step", lambda s: "step" if s["n"] < 40 else END)
    saver = QueueSaver(queue, keep_last=5)
    graph = builder.compile(checkpointer=saver)
    graph.invoke({"items": [], "n": 0}, {**config("delta"), "recursion_limit": 100})
    assert graph.get_state(config("delta")).values["items"] == list(range(40))
    saver.prune(["delta"])
    assert graph.get_state(config("delta")).values["items"] == list(range(40))
    assert len(db.ids()) > 5  # kept whole


# -- stored once -----------------------------------------------------------------------------------


def test_a_large_channel_is_stored_once_and_read_by_every_checkpoint(queue: Queue, db: Db) -> None:
    saver = QueueSaver(queue)
    big = "".join(f"{i:07d}" for i in range(50_000 // 7))  # ~50 KB
    run(saver, "short", 10, topic=big)
    run(saver, "long", 100, topic=big)

    def stored_bytes(thread: str) -> int:
        return sum(
            int(
                db.rows(f"SELECT coalesce(sum(length({column})), 0) FROM {table} WHERE thread = '{thread}'")[
                    0
                ][0]
            )
            for table, column in zip(TABLES, ("body", "value", "value"), strict=True)
        )

    for thread in ("short", "long"):
        sql = (
            f"SELECT count(*) FROM nbqueue_checkpoint_values WHERE thread = '{thread}' AND channel = 'topic'"
        )
        assert db.rows(sql) == [(1,)]
    # 90 more steps cost what changed in them (a counter, the bookkeeping), never the topic again.
    grown = stored_bytes("long") - stored_bytes("short")
    assert 0 < grown < 90 * 2_000 < len(big) * 4
    # LangGraph itself holds the topic three times (the input channel, the input task's write, the
    # channel), then 100 small steps: copied into every checkpoint it would be 100 times.
    assert stored_bytes("long") < 3 * len(big) + 102 * 2_000
    [(largest,)] = db.rows("SELECT max(length(body)) FROM nbqueue_checkpoints WHERE thread = 'long'")
    assert largest < 5_000  # a checkpoint's own row holds no channel value
    # Every checkpoint reads back what LangGraph's own in-memory saver holds for the same run.
    reference = InMemorySaver()
    run(reference, "long", 100, topic=big)
    expected = [t.checkpoint["channel_values"] for t in reference.list(config("long"))]
    history = list(saver.list(config("long")))
    assert len(history) == len(expected) == 102
    assert [t.checkpoint["channel_values"] for t in history] == expected
    assert all(t.checkpoint["channel_values"]["topic"] == big for t in history[:-1])  # (not the input's)
    oldest_with_topic = history[-2].config["configurable"]["checkpoint_id"]
    found = saver.get_tuple(config("long", "", oldest_with_topic))
    assert found is not None and found.checkpoint["channel_values"] == expected[-2]
    assert expected[-2]["topic"] == big and expected[-2]["n"] == 0


# -- a serializer that builds nothing it was not told it may build ---------------------------------


def ext(code: int, *fields: Any) -> ormsgpack.Ext:
    return ormsgpack.Ext(code, ormsgpack.packb(list(fields)))


def touch(marker: Path) -> ormsgpack.Ext:
    """An extension that, built by LangGraph's permissive default, runs `touch marker`."""
    return ext(EXT_CONSTRUCTOR_POS_ARGS, "os", "system", [f"touch {shlex.quote(str(marker))}"])


@pytest.mark.parametrize("where", ["value", "body", "write"])
def test_a_planted_row_naming_os_system_is_refused(queue: Queue, db: Db, tmp_path: Path, where: str) -> None:
    saver = QueueSaver(queue)
    writer = Thread(saver, "t")
    writer.put(note="hello", n=1)
    checkpoint_id = writer.put(n=2)
    saver.put_writes(writer.config, [("n", 3)], "task-1")
    marker = tmp_path / "ran"
    planted = ormsgpack.packb({"inner": [1, touch(marker)]})
    if where == "value":
        db.plant("UPDATE nbqueue_checkpoint_values SET value = ? WHERE channel = 'note'", planted)
    elif where == "write":
        db.plant("UPDATE nbqueue_checkpoint_writes SET value = ?", planted)
    else:  # the checkpoint's own row: its metadata gets the extension, the rest stays as written
        [(body,)] = db.rows(f"SELECT body FROM nbqueue_checkpoints WHERE id = '{checkpoint_id}'")
        raw = ormsgpack.unpackb(bytes(body), ext_hook=ormsgpack.Ext, option=ormsgpack.OPT_NON_STR_KEYS)
        raw["metadata"]["planted"] = touch(marker)
        db.plant("UPDATE nbqueue_checkpoints SET body = ? WHERE id = ?", ormsgpack.packb(raw), checkpoint_id)
    for read in (
        lambda: saver.get_tuple(config("t")),
        lambda: saver.get_tuple(config("t", "", checkpoint_id)),
        lambda: list(saver.list(config("t"))),
        lambda: list(saver.list(None)),
    ):
        with pytest.raises(UnsafeCheckpoint, match=r"os\.system"):
            read()
    assert not marker.exists()
    # The planted payload is live: LangGraph's permissive default would have run it.
    JsonPlusSerializer(allowed_msgpack_modules=True).loads_typed(("msgpack", planted))
    wait_until(marker.exists, 5, "the permissive serializer running the planted command")


# fmt: off
REFUSED = [  # (what a stored extension names, the refusal's words)
    (ext(EXT_CONSTRUCTOR_SINGLE_ARG, "os", "system", "true"), r"os\.system"),
    (ext(EXT_CONSTRUCTOR_KW_ARGS, "subprocess", "Popen", {"args": ["true"]}), r"subprocess\.Popen"),
    (ext(EXT_CONSTRUCTOR_SINGLE_ARG, "uuid", "UUID", ext(1, "os", "system", ["true"])), r"os\.system"),
    (ext(EXT_METHOD_SINGLE_ARG, "os", "system", "true", "__call__"), r"os\.system"),
    (ext(EXT_METHOD_SINGLE_ARG, "datetime", "datetime", "x", "fromtimestamp"), r"datetime\.datetime\.fromt"),
    (ext(EXT_PYDANTIC_V2, "builtins", "eval", {"x": 1}, "model_validate_json"), r"builtins\.eval"),
]
# fmt: on


@pytest.mark.parametrize(
    ("payload", "named"),
    REFUSED,
    ids=["single-arg", "kw-args", "nested-in-a-safe-type", "method-on-unsafe", "unsafe-method", "pydantic"],
)
def test_the_serializer_refuses_what_it_may_not_build(payload: ormsgpack.Ext, named: str) -> None:
    with pytest.raises(UnsafeCheckpoint, match=named):
        SafeSerializer().loads_typed(("msgpack", ormsgpack.packb({"a": payload})))
    assert issubclass(UnsafeCheckpoint, nbqueue.NbqueueError)


class Shell:
    """Unpickled, runs a command (the pickle row below)."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self) -> tuple[Any, ...]:
        import os

        return (os.system, (self.command,))


@pytest.mark.parametrize("kind", ["pickle", "json"])
def test_an_encoding_never_read_is_refused(queue: Queue, db: Db, tmp_path: Path, kind: str) -> None:
    saver = QueueSaver(queue)
    Thread(saver, "t").put(note="hello")
    command = f"touch {shlex.quote(str(tmp_path / 'ran'))}"
    lc = {"lc": 2, "type": "constructor", "id": ["os", "system"], "args": [command]}
    payload = pickle.dumps(Shell(command)) if kind == "pickle" else json.dumps(lc).encode()
    db.plant("UPDATE nbqueue_checkpoint_values SET kind = ?, value = ?", kind, payload)
    with pytest.raises(UnsafeCheckpoint, match=repr(kind)):
        saver.get_tuple(config("t"))
    assert not (tmp_path / "ran").exists()


@dataclass
class Note:
    text: str
    at: datetime


def test_a_users_own_state_type_is_built_only_when_allowed(queue: Queue) -> None:
    note = Note("remember", datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC))
    Thread(QueueSaver(queue), "t").put(note=note)
    with pytest.raises(UnsafeCheckpoint, match=r"Note.*allowed=\[Note\]"):
        QueueSaver(queue).get_tuple(config("t"))
    for allowed in ([Note], [(Note.__module__, "Note")]):
        found = QueueSaver(queue, allowed=allowed).get_tuple(config("t"))
        assert found is not None and found.checkpoint["channel_values"] == {"note": note}


def test_messages_datetimes_and_langgraphs_safe_types_round_trip_without_being_allowed(queue: Queue) -> None:
    state = {
        "messages": [
            HumanMessage("what time is it?", id="1"),
            AIMessage("", id="2", tool_calls=[{"name": "clock", "args": {}, "id": "call-1"}]),
            ToolMessage("noon", tool_call_id="call-1", id="3"),
        ],
        "at": datetime(2026, 12, 5, 12, 0, tzinfo=UTC),
        "every": timedelta(hours=1),
        "ids": {uuid.UUID(int=7)},
        "price": Decimal("1.10"),
    }
    saver = QueueSaver(queue)
    writer = Thread(saver, "t")
    writer.put(**state)
    saver.put_writes(writer.config, [("messages", [AIMessage("done", id="4")])], "task-1")
    found = saver.get_tuple(config("t"))
    assert found is not None and found.checkpoint["channel_values"] == state
    assert found.pending_writes == [("task-1", "messages", [AIMessage("done", id="4")])]
    [listed] = saver.list(config("t"))
    assert listed.checkpoint == found.checkpoint


# -- arguments refused -----------------------------------------------------------------------------

BAD_OPTIONS = [("keep_last", v) for v in (0, True, -3, 2.5, "3")] + [
    ("max_age", v) for v in (-1, 0, timedelta(0), timedelta(seconds=-5), True, "1h")
]


@pytest.mark.parametrize(("option", "value"), BAD_OPTIONS)
def test_bad_retention_options_are_refused_by_name(queue: Queue, option: str, value: Any) -> None:
    with pytest.raises(InvalidArgument, match=rf"{option}.*{re.escape(repr(value))}"):
        QueueSaver(queue, **{option: value})


def test_a_config_without_what_it_needs_is_refused_by_name(queue: Queue, db: Db) -> None:
    saver = QueueSaver(queue)
    bads: list[dict[str, Any]] = [{}, {"configurable": {}}, {"configurable": {"checkpoint_ns": ""}}]
    for bad in bads:
        with pytest.raises(InvalidArgument, match="thread_id"):
            saver.put(bad, empty_checkpoint(), {}, {})  # type: ignore[arg-type]
        with pytest.raises(InvalidArgument, match="thread_id"):
            saver.get_tuple(bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="checkpoint_id"):
        saver.put_writes(config("t"), [("x", 1)], "task-1")
    assert not db.ids() and db.counts("t") == (0, 0, 0)


# -- retention's rule, as a table ------------------------------------------------------------------

NOW, HOUR = 10_000_000_000, 3_600_000_000
OLD = 0

# fmt: off
RULE = [  # (heads as (ns, id, job, created_at), keep_last, max_age, unfinished jobs, dropped)
    # ids grow with time, whatever order the rows come in
    ([("", "c1", None, NOW), ("", "c3", None, NOW), ("", "c2", None, NOW)], None, None, set(), {}),
    ([("", "c1", None, NOW), ("", "c3", None, NOW), ("", "c2", None, NOW)], 1, None, set(),
     {"": ["c2", "c1"]}),
    ([("", "c1", None, NOW), ("", "c2", None, NOW)], 2, None, set(), {}),
    # the newest stays however old; exactly max_age old is not older than it
    ([("", "c1", None, OLD), ("", "c2", None, NOW - HOUR), ("", "c3", None, OLD)], None, HOUR, set(),
     {"": ["c1"]}),
    # each namespace keeps its own newest and counts apart
    ([("a", "c1", None, NOW), ("b", "c2", None, NOW), ("a", "c3", None, NOW)], 1, None, set(), {"a": ["c1"]}),
    # an unfinished job's newest in a namespace is kept past keep_last and max_age (taking its place
    # in the count); its older ones go as any others do, and a finished job's newest too
    ([("", "c1", 7, OLD), ("", "c2", 8, OLD), ("", "c3", None, NOW), ("", "c4", None, NOW)], 1, HOUR, {7},
     {"": ["c3", "c2"]}),
    ([("", "c1", None, NOW), ("", "c2", 7, NOW), ("", "c3", None, NOW)], 2, None, {7}, {"": ["c1"]}),
    ([("", "c1", 7, NOW), ("", "c2", 7, NOW), ("", "c3", 7, NOW), ("", "c4", None, NOW)], 1, None, {7},
     {"": ["c2", "c1"]}),
    ([("", "c1", 7, OLD), ("", "c2", 7, OLD), ("", "c3", None, NOW)], None, HOUR, {7}, {"": ["c1"]}),
    ([("a", "c1", 7, NOW), ("a", "c2", 7, NOW), ("b", "c3", 7, NOW), ("a", "c5", None, NOW),
      ("b", "c4", None, NOW)], 1, None, {7}, {"a": ["c1"]}),
]
# fmt: on


@pytest.mark.parametrize("case", RULE)
def test_doomed_drops_what_the_rule_says(case: tuple[Any, ...]) -> None:
    heads, keep_last, max_age, unfinished, dropped = case
    assert doomed(heads, keep_last, max_age, NOW, unfinished) == dropped


# -- an upgraded queue -----------------------------------------------------------------------------


def test_a_queue_upgraded_from_13_keeps_checkpoints(backend: str, tmp_path: Path, request: Any) -> None:
    if backend == "sqlite":
        sqlite_at(tmp_path / "old.db", 13)
        target = str(tmp_path / "old.db")
    else:
        server, schema = str(request.getfixturevalue("pg_server")), str(request.getfixturevalue("pg_schema"))
        postgres_at(server, schema, 13)
        target = f"{server}?schema={schema}"
    with Queue(target) as q:
        final = run(QueueSaver(q, keep_last=3), "t", 5)
        found = QueueSaver(q).get_tuple(config("t"))
        assert found is not None and found.checkpoint["channel_values"] == final
        assert len(list(QueueSaver(q).list(config("t")))) == 3
