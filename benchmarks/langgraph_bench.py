"""`bench.py --only langgraph`: nbqueue's QueueSaver next to langgraph-checkpoint-sqlite's
SqliteSaver on the same LangGraph thread, in the same rounds.

The thread: a compiled StateGraph looping STEPS steps over an agent's kind of state: `messages`
grows by one short message a step (add_messages: every checkpoint holds the whole list, as
without LangGraph's beta DeltaChannel), `document` (~20 KB) is set once, `count` changes every
step. LangGraph runs it as it ships (durability "async"). Each round runs it on a fresh store
for: SqliteSaver on its own file (its connection set to synchronous=NORMAL, nbqueue's default;
SqliteSaver leaves SQLite's, FULL), QueueSaver on an nbqueue SQLite file, the same with
keep_last=10, and QueueSaver on PostgreSQL (a fresh schema, dropped after). Per saver: puts/s
over the run (every put counted by a subclass), get_tuple of the newest checkpoint and of random
older ones still kept (keep_last=10: only the newest few, not the others' work), and the bytes
stored: the SQLite file after wal_checkpoint(TRUNCATE) (nbqueue's holds its empty queue tables
too), on PostgreSQL pg_total_relation_size of the checkpoint tables. Then a direct put loop with
no graph (the 20 KB value kept, one small channel changed a put): the saver's own cost and what
a value stored once saves, apart from LangGraph's per-step work. Speeds are QueueSaver/SqliteSaver
within a round, the median over the rounds, by wall time and by this process's CPU time.
"""

from __future__ import annotations

import random
import sqlite3
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import nbqueue

STEPS = 1_000
DIRECT_PUTS = 1_000
GETS = 100  # get_tuple calls per kind (newest, older) per saver and round
KEEP_LAST = 10
THREAD = "agent"
DOCUMENT = "".join(f"Paragraph {i}: the contract's terms, as the agent read them once. " for i in range(300))
PG_TABLES = ("nbqueue_checkpoints", "nbqueue_checkpoint_values", "nbqueue_checkpoint_writes")
HERE = {"configurable": {"thread_id": THREAD, "checkpoint_ns": ""}}

Store = tuple[Any, Callable[[], int]]  # a counted saver, and what it has stored in bytes
Opener = Callable[[str], AbstractContextManager[Store]]  # a fresh store, by a tag


def installed() -> str | None:
    """langgraph-checkpoint-sqlite's version, or None when it (or LangGraph) is not installed."""
    import importlib.metadata
    import importlib.util

    if importlib.util.find_spec("langgraph") is None:
        return None
    try:
        return importlib.metadata.version("langgraph-checkpoint-sqlite")
    except importlib.metadata.PackageNotFoundError:
        return None


def counted(cls: type) -> type:
    """`cls` that records the id of each checkpoint it puts and counts put_writes calls."""

    class Counted(cls):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **options: Any) -> None:
            super().__init__(*args, **options)
            self.ids: list[str] = []
            self.writes = 0

        def put(self, config: Any, checkpoint: Any, metadata: Any, new_versions: Any) -> Any:
            done = super().put(config, checkpoint, metadata, new_versions)
            self.ids.append(done["configurable"]["checkpoint_id"])
            return done

        def put_writes(self, config: Any, writes: Any, task_id: str, task_path: str = "") -> None:
            self.writes += 1
            super().put_writes(config, writes, task_id, task_path)

    Counted.__name__ = f"Counted{cls.__name__}"
    return Counted


# -- the stores: each a fresh file or schema ------------------------------------------------


def sqlite_bytes(path: Path, conn: sqlite3.Connection | None = None) -> int:
    """The file's size once its WAL is checkpointed into it and truncated."""
    own = conn is None
    conn = conn or sqlite3.connect(path)
    try:
        busy, _, _ = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        assert busy == 0, f"{path.name}: the WAL checkpoint was blocked"
    finally:
        if own:
            conn.close()
    wal = path.with_name(path.name + "-wal")
    return path.stat().st_size + (wal.stat().st_size if wal.exists() else 0)


@contextmanager
def sqlite_saver(folder: Path, tag: str) -> Iterator[Store]:
    from langgraph.checkpoint.sqlite import SqliteSaver

    path = folder / f"langgraph-sqlite-{tag}-{time.monotonic_ns()}.db"
    conn = sqlite3.connect(path, check_same_thread=False)
    conn.execute("PRAGMA synchronous = NORMAL")
    try:
        yield counted(SqliteSaver)(conn), lambda: sqlite_bytes(path, conn)
    finally:
        conn.close()


@contextmanager
def queue_saver(folder: Path, tag: str, **options: Any) -> Iterator[Store]:
    from nbqueue.integrations.langgraph import QueueSaver

    path = folder / f"langgraph-nbqueue-{tag}-{time.monotonic_ns()}.db"
    q = nbqueue.Queue(path)
    try:
        yield counted(QueueSaver)(q, **options), lambda: sqlite_bytes(path)
    finally:
        q.close()


@contextmanager
def postgres_saver(server: str, tag: str) -> Iterator[Store]:
    import psycopg

    from nbqueue.integrations.langgraph import QueueSaver

    schema = f"nbq_langgraph_{tag}_{time.monotonic_ns()}"
    q = nbqueue.Queue(f"{server}?schema={schema}")

    def stored() -> int:
        with psycopg.connect(server, autocommit=True) as conn:
            sizes = [
                conn.execute("SELECT pg_total_relation_size(%s::regclass)", (f'"{schema}".{t}',)).fetchone()
                for t in PG_TABLES
            ]
        return sum(int(row[0]) for row in sizes if row)

    try:
        yield counted(QueueSaver)(q), stored
    finally:
        q.close()
        with psycopg.connect(server, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def contestants(folder: Path, server: str | None) -> list[tuple[str, Opener]]:
    """(label, opener) in the order a round measures them; SqliteSaver first, the reference."""
    out: list[tuple[str, Opener]] = [
        ("SqliteSaver, NORMAL", lambda tag: sqlite_saver(folder, tag)),
        ("QueueSaver, SQLite", lambda tag: queue_saver(folder, tag)),
        (f"QueueSaver, keep_last={KEEP_LAST}", lambda tag: queue_saver(folder, tag, keep_last=KEEP_LAST)),
    ]
    if server is not None:
        out.append(("QueueSaver, PostgreSQL", lambda tag: postgres_saver(server, tag)))
    return out


# -- the work -------------------------------------------------------------------------------


def build_graph(steps: int) -> Any:
    """The agent-shaped loop: one node adds a message and counts, until `count` reaches `steps`."""
    from typing import Annotated, TypedDict

    from langchain_core.messages import AIMessage, AnyMessage
    from langgraph.graph import END, START, StateGraph
    from langgraph.graph.message import add_messages

    # The functional form: the annotations are objects, not strings for get_type_hints to find.
    State = TypedDict(  # noqa: UP013
        "State", {"messages": Annotated[list[AnyMessage], add_messages], "document": str, "count": int}
    )

    def step(state: Any) -> dict[str, Any]:
        done = state["count"] + 1
        return {"messages": [AIMessage(f"step {done}: read the document again; nothing new")], "count": done}

    def route(state: Any) -> str:
        return "step" if state["count"] < steps else END

    graph = StateGraph(State)
    graph.add_node("step", step)
    graph.add_edge(START, "step")
    graph.add_conditional_edges("step", route)
    return graph


Rates = tuple[float, float]  # per second of wall time, per CPU second of this process


def clocks() -> tuple[float, float]:
    return time.perf_counter(), time.process_time()


def rates(n: int, began: tuple[float, float]) -> Rates:
    """n over the wall seconds and over this process's CPU seconds (all its threads) since `began`:
    the second is what other load on a shared machine changes least (not PostgreSQL's share)."""
    wall, cpu = clocks()
    return n / (wall - began[0]), n / (cpu - began[1])


def run_thread(builder: Any, saver: Any, steps: int) -> Rates:
    """The whole thread, one invoke; puts per second."""
    from langchain_core.messages import HumanMessage

    graph = builder.compile(checkpointer=saver)
    config = {"configurable": {"thread_id": THREAD}, "recursion_limit": steps + 100}
    began = clocks()
    final = graph.invoke(
        {"messages": [HumanMessage("Read this and work on it.")], "document": DOCUMENT, "count": 0}, config
    )
    done = rates(len(saver.ids), began)
    assert final["count"] == steps and len(final["messages"]) == steps + 1, final["count"]
    return done


def gets(saver: Any, ids: list[str | None]) -> Rates:
    """get_tuple of each id (None: the newest), per second."""
    began = clocks()
    for checkpoint_id in ids:
        config = (
            HERE
            if checkpoint_id is None
            else {"configurable": {**HERE["configurable"], "checkpoint_id": checkpoint_id}}
        )
        got = saver.get_tuple(config)
        assert got is not None and len(got.checkpoint["channel_values"]["document"]) == len(DOCUMENT)
    return rates(len(ids), began)


def direct_puts(saver: Any, n: int) -> Rates:
    """n puts of synthetic checkpoints: `document` (~20 KB) at one version throughout, `count`
    at a new one each put; puts/s."""
    from langgraph.checkpoint.base.id import uuid6

    config: Any = {"configurable": {"thread_id": "direct", "checkpoint_ns": ""}}
    document = saver.get_next_version(None, None)
    count = document
    began = clocks()
    for i in range(n):
        count = saver.get_next_version(count, None)
        versions = {"document": document, "count": count}
        checkpoint = {
            "v": 4,
            "id": str(uuid6(clock_seq=i)),
            "ts": datetime.now(UTC).isoformat(),
            "channel_values": {"document": DOCUMENT, "count": i},
            "channel_versions": versions,
            "versions_seen": {},
            "updated_channels": ["count"],
        }
        new = versions if i == 0 else {"count": count}
        config = saver.put(config, checkpoint, {"source": "loop", "step": i, "parents": {}}, new)
    return rates(n, began)


def measure(
    opener: Opener, builder: Any, steps: int, direct_n: int, gets_n: int, seed: int
) -> dict[str, Any]:
    """One saver's figures in one round: the graph's thread on one fresh store, the direct loop
    on another. Each speed twice: `NAME_per_s` (wall) and `NAME_per_cpu_s`."""
    fig: dict[str, Any] = {}

    def record(name: str, got: Rates) -> None:
        fig[f"{name}_per_s"], fig[f"{name}_per_cpu_s"] = got

    with opener("graph") as (saver, stored):
        record("puts", run_thread(builder, saver, steps))
        keep = getattr(saver, "keep_last", None)
        older = saver.ids[-keep:-1] if keep else saver.ids[:-1]  # the kept ones but the newest
        rng = random.Random(seed)  # the same positions for every saver that keeps them all
        record("newest_gets", gets(saver, [None] * gets_n))
        record("older_gets", gets(saver, [rng.choice(older) for _ in range(gets_n)]))
        fig |= {"bytes": stored(), "puts": len(saver.ids), "put_writes": saver.writes}
    with opener("direct") as (saver, stored):
        record("direct_puts", direct_puts(saver, direct_n))
        fig["direct_bytes"] = stored()
    return fig


# -- the rounds and the table -------------------------------------------------------------

SPEEDS = ("puts_per_s", "newest_gets_per_s", "older_gets_per_s")
SPREAD = "direct_puts_per_s_spread"


def spread(samples: list[float]) -> float:
    return (max(samples) - min(samples)) / statistics.median(samples)


def summarize(rounds: list[dict[str, dict[str, Any]]], labels: list[str]) -> dict[str, Any]:
    """Per saver (labels[0] the reference): the median of each figure, of its ratio to the
    reference's in the same round, and the rounds' spread of its speeds."""
    out: dict[str, Any] = {}
    speeds = [*SPEEDS, "direct_puts_per_s"]
    for label in labels:
        entry: dict[str, Any] = {"rounds": [r[label] for r in rounds]}
        for key in (*speeds, *(k.replace("per_s", "per_cpu_s") for k in speeds), "bytes", "direct_bytes"):
            got = [r[label][key] for r in rounds]
            entry[key] = statistics.median(got)
            entry[f"{key}_ratio"] = statistics.median(r[label][key] / r[labels[0]][key] for r in rounds)
            if "_per_" in key:
                entry[f"{key}_spread"] = spread(got)
        out[label] = entry
    return out


def paired(rounds: list[dict[str, Any]], key: str, of: str, to: str) -> float:
    """The median over the rounds of `of`'s figure over `to`'s (saver labels), `key` in both."""
    return statistics.median(r[of][key] / r[to][key] for r in rounds)


def row(label: str, cells: list[tuple[float | None, float | None]], spread_of: float) -> str:
    """A table row: per measure its figure and ratio ('-' where there is none)."""
    text = f"  {label:<28}"
    for i, (value, ratio) in enumerate(cells):
        shown = "-" if value is None else f"{value:,.0f}"
        text += f" {shown:>{13 if i == len(cells) - 1 else 9}} {'-' if ratio is None else f'{ratio:.2f}x':>6}"
    return text + f" {spread_of:>6.0%}"


def print_table(fig: dict[str, Any], direct_n: int) -> None:
    labels = list(fig)
    print(
        f"  {'saver':<28} {'puts/s':>9} {'ratio':>6} {'newest/s':>9} {'ratio':>6} {'older/s':>9} "
        f"{'ratio':>6} {'bytes':>13} {'ratio':>6} {'spread':>6}"
    )
    for i, label in enumerate(labels):
        e = fig[label]
        cells = [(e[k], e[f"{k}_ratio"] if i else None) for k in (*SPEEDS, "bytes")]
        print(row(label, cells, max(e[f"{k}_spread"] for k in SPEEDS)))
    print(f"  direct put loop, {direct_n:,} puts: the 20 KB document kept at one version, `count` changed")
    for i, label in enumerate(labels):
        e = fig[label]
        put, size = (e["direct_puts_per_s_ratio"], e["direct_bytes_ratio"]) if i else (None, None)
        none = (None, None)
        print(row(label, [(e["direct_puts_per_s"], put), none, none, (e["direct_bytes"], size)], e[SPREAD]))
    print("  per CPU second of this process instead of wall time (all its threads; on PostgreSQL the")
    print("  server's share is not counted), QueueSaver/SqliteSaver, and the spread of those figures:")
    named = {"puts": "puts", "newest": "newest_gets", "older": "older_gets", "direct": "direct_puts"}
    for label in labels[1:3]:
        e = fig[label]
        ratios = ", ".join(f"{short} {e[f'{key}_per_cpu_s_ratio']:.2f}x" for short, key in named.items())
        print(f"  {label:<28} {ratios}; spread {max(e[f'{k}_per_cpu_s_spread'] for k in named.values()):.0%}")
    sqlite, queue, kept = (fig[label] for label in labels[:3])
    rounds = [{label: fig[label]["rounds"][n] for label in labels} for n in range(len(sqlite["rounds"]))]
    print(
        f"  stored once: the thread takes {queue['bytes_ratio']:.0%} of SqliteSaver's bytes (the growing "
        f"message list is in every checkpoint of both, the document in each of SqliteSaver's); the "
        f"direct loop {queue['direct_bytes_ratio']:.1%} ({sqlite['direct_bytes'] / 1e6:.1f} MB against "
        f"{queue['direct_bytes'] / 1e6:.2f} MB)"
    )
    pairs = [paired(rounds, k, labels[2], labels[1]) for k in ("puts_per_s", "direct_puts_per_s")]
    cpu = [paired(rounds, k, labels[2], labels[1]) for k in ("puts_per_cpu_s", "direct_puts_per_cpu_s")]
    print(
        f"  retention: keep_last={KEEP_LAST} keeps {KEEP_LAST} of {queue['rounds'][0]['puts']:,} checkpoints "
        f"in {kept['bytes'] / 1e6:.2f} MB against {queue['bytes'] / 1e6:.1f} MB for all "
        f"({kept['bytes'] / queue['bytes']:.1%}); its puts/s over keeping all: {pairs[0]:.2f}x in the "
        f"thread, {pairs[1]:.2f}x in the direct loop (per CPU second: {cpu[0]:.2f}x, {cpu[1]:.2f}x)",
        flush=True,
    )


def langgraph_rows(folder: Path, server: str | None, runs: int, quick: bool, out: dict[str, Any]) -> None:
    """The section: every saver on the same thread, `runs` interleaved rounds, one table."""
    version = installed()
    if version is None:
        print("  langgraph or langgraph-checkpoint-sqlite not installed (make bench installs them)")
        return
    steps, direct_n, gets_n = (50, 100, 20) if quick else (STEPS, DIRECT_PUTS, GETS)
    builder = build_graph(steps)
    savers = contestants(folder, server)
    print(
        f"  one thread of a compiled StateGraph, {steps:,} steps: an add_messages list + one short message "
        f"a step, a {len(DOCUMENT) / 1000:.0f} KB document set once, a counter\n"
        f"  langgraph-checkpoint-sqlite {version}, its connection set to synchronous=NORMAL (nbqueue's "
        "default; SqliteSaver leaves SQLite's, FULL)\n"
        f"  get_tuple {gets_n} times, of the newest checkpoint and of random older ones still kept\n"
        "  bytes: the SQLite file after wal_checkpoint(TRUNCATE); on PostgreSQL, pg_total_relation_size of "
        "the checkpoint tables\n"
        f"  ratio: QueueSaver/SqliteSaver in the same round, median of {runs}; spread: the largest "
        "(max - min)/median of a row's speeds over the rounds"
        + ("" if server else "\n  PostgreSQL not reachable: its row is left out")
    )
    for _label, opener in savers:  # first calls and imports, not measured
        measure(opener, build_graph(3), 3, 3, 1, 0)
    rounds: list[dict[str, dict[str, Any]]] = []
    for n in range(runs):  # each round starts with the next saver: none always goes first
        order = savers[n % len(savers) :] + savers[: n % len(savers)]
        rounds.append(
            {label: measure(opener, builder, steps, direct_n, gets_n, n) for label, opener in order}
        )
    fig = summarize(rounds, [label for label, _ in savers])
    out.update(fig)
    first = rounds[0][savers[0][0]]
    print(f"  each run: {first['puts']:,} puts and {first['put_writes']:,} put_writes")
    print_table(fig, direct_n)
