"""Compiled LangGraph graphs run as nbqueue jobs.

`graph_task(queue, graph)` registers a task that runs the graph on a thread checkpointed by a
`QueueSaver` on the same queue, durably (`durability="sync"`: each step's checkpoint is
written before the next step starts). A run that is retried or recovered after a crash goes
on from the thread's last checkpoint, so no finished step runs again. What the graph streams
(`stream_mode`) goes into the job's stream; the final state, as JSON, is the job's result.

An `interrupt(value)` in a node becomes a wait named after the node (`q.send(job, node,
answer)`, or the board's buttons): the job waits without holding a worker, and the answer
resumes the graph with `Command(resume=answer)`. A string value is the prompt; a dict may
give "prompt" (or "question"), "choices", "timeout" (seconds) and "default" (`wait_for`'s). A
node that interrupts again in the same job gets "node-2", "node-3", ...
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from langchain_core.runnables import RunnableConfig
from langgraph._internal._serde import collect_allowlist_from_schemas  # (pinned: nbqueue[langgraph])
from langgraph.types import Command

from ... import context, emit, step, tasks, wait_for
from ...errors import InvalidArgument, NbqueueError
from ...jobs import Job
from ...streams import Dropped
from .saver import QueueSaver

if TYPE_CHECKING:
    from langgraph.pregel import Pregel

    from ...queue import Queue
    from ...tasks import Task

PREFIX = "langgraph."
BEGUN = "langgraph: thread before this job"  # the step that records where the job's thread stood
NODES = "langgraph_nodes"  # the attribute of a graph's task function naming the graph's nodes


def graph_task(
    queue: Queue,
    graph: Pregel[Any, Any],
    *,
    name: str | None = None,
    stream_mode: str | Sequence[str] = "updates",
    keep_last: int | None = None,
    max_age: float | timedelta | None = None,
    recursion_limit: int | None = None,
    allowed: Sequence[type | tuple[str, ...]] = (),
    **options: Any,
) -> Task[..., Any]:
    """Register the task that runs `graph` on `queue` ("langgraph." + its name) and return it.

    A worker in another process needs the same registration: call this where the graph is
    defined. `options` are `q.task`'s (max_retries, timeout, queue, limits, ...).

    Raises:
        InvalidArgument: not a compiled graph, or another graph (other nodes) already runs under
            this name in this process: name them (`builder.compile(name=...)` or `name=`).
    """
    if not hasattr(graph, "stream") or not hasattr(graph, "get_state"):
        raise InvalidArgument(f"graph_task needs a compiled graph (builder.compile()), not {graph!r}")
    label = name or getattr(graph, "name", None) or "LangGraph"
    # A graph redefined (a notebook cell run again) replaces its task; another graph (other
    # nodes) under the same name would run in its place: refused.
    nodes = tuple(sorted(getattr(graph, "nodes", {})))
    known = getattr(getattr(tasks.find(PREFIX + label), "fn", None), NODES, nodes)
    if known != nodes:
        raise InvalidArgument(
            f"another graph (nodes {', '.join(known)}) already runs as {PREFIX + label!r}: "
            "give each graph a name (builder.compile(name=...) or graph_task(..., name=...))"
        )
    saver = QueueSaver(queue, keep_last=keep_last, max_age=max_age, allowed=[*allowed, *_own_types(graph)])
    durable = graph.copy(update={"checkpointer": saver})
    modes = stream_mode if isinstance(stream_mode, str) else list(stream_mode)

    async def run_graph(input: Any = None, thread_id: str | None = None) -> Any:
        running = context.current()
        job_id = running.job.id if running else None
        thread = thread_id or f"nbqueue-job-{job_id}"
        config: RunnableConfig = {"configurable": {"thread_id": thread}}
        if recursion_limit is not None:
            config["recursion_limit"] = recursion_limit
        begun = step(BEGUN, _newest, saver, config)
        if _newest(saver, config) == begun:  # this job has not begun the graph yet
            await _stream(durable, input, config, modes)
        elif running is not None:
            _emit_again(running.job)
        while True:
            state = await durable.aget_state(config)
            interrupts = [(task.name, i) for task in state.tasks for i in task.interrupts]
            if interrupts:
                answers = {i.id: _answer(queue, job_id, node, i) for node, i in interrupts}
                await _stream(durable, Command(resume=answers), config, modes)
            elif state.next:  # stopped between steps (a crash): go on from the last checkpoint
                await _stream(durable, None, config, modes)
            else:
                return jsonable(state.values)

    run_graph.__doc__ = f"Run the LangGraph graph {label!r} on a thread checkpointed in the queue."
    setattr(run_graph, NODES, nodes)
    return queue.task(name=PREFIX + label, **options)(run_graph)


def enqueue_graph(
    queue: Queue, graph: Pregel[Any, Any], input: Any, *, thread_id: str | None = None, **options: Any
) -> Job:
    """Run a compiled graph as a job: `input` (JSON: message dicts, not message objects) on
    thread `thread_id` (default: one of the job's own). The job's result is the final state.

    `options` are `graph_task`'s (name, stream_mode, keep_last, max_age, recursion_limit,
    and `q.task`'s options).
    """
    return graph_task(queue, graph, **options).enqueue(input, thread_id=thread_id)


def jsonable(value: Any) -> Any:
    """A graph's value as JSON: messages and pydantic models by their fields, dataclasses
    (an Interrupt) as dicts, anything else unknown as its text."""
    if value is None or isinstance(value, str | int | float | bool):
        return value
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [jsonable(v) for v in value]
    if hasattr(value, "model_dump"):
        return jsonable(value.model_dump(mode="json"))
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return jsonable(dataclasses.asdict(value))
    return str(value)


def _own_types(graph: Pregel[Any, Any]) -> set[tuple[str, ...]]:
    """The types a StateGraph's schemas name (its state's dataclasses and models): the graph's own,
    which its checkpoints may build. (LangGraph collects them only in its strict mode.)"""
    builder = getattr(graph, "builder", None)
    if builder is None:
        return set()
    schemas = [builder.state_schema, builder.input_schema, builder.output_schema, builder.context_schema]
    schemas += [node.input_schema for node in builder.nodes.values()]
    return collect_allowlist_from_schemas(
        schemas=[s for s in schemas if s is not None], channels=builder.channels
    )


def _newest(saver: QueueSaver, config: RunnableConfig) -> str | None:
    found = saver.get_tuple(config)
    return None if found is None else str(found.config["configurable"]["checkpoint_id"])


async def _stream(
    graph: Pregel[Any, Any], input: Any, config: RunnableConfig, modes: str | list[str]
) -> None:
    """Run the graph until it ends or interrupts, each chunk it streams emitted to the job's
    stream ([mode, data] when several modes; a message chunk as its text). Async, so that a
    graph's async nodes run too (its plain ones run on LangGraph's threads)."""
    chunks = graph.astream(input, config, stream_mode=modes, durability="sync")  # type: ignore[call-overload]
    async for chunk in chunks:
        if isinstance(modes, list):
            mode, data = chunk
            emit([mode, _item(mode, data)])
        else:
            emit(_item(modes, chunk))


def _emit_again(job: Job) -> None:
    """A resumed run goes on where the graph stopped, not from the top: it emits this attempt's
    items again first (each is already stored under its number, so none is stored twice), and
    what the graph streams next follows them instead of being taken for a replay of them."""
    for item in job.stream(follow=False, attempt=job.retries + 1):
        for again in [None] * item.count if isinstance(item, Dropped) else [item]:
            emit(again)  # (a dropped item's number is below the oldest kept: never stored)


def _item(mode: str, data: Any) -> Any:
    if mode == "messages" and isinstance(data, tuple) and isinstance(getattr(data[0], "content", None), str):
        return data[0].content
    return jsonable(data)


def _answer(queue: Queue, job_id: int | None, node: str, interrupt: Any) -> Any:
    """Wait for a person's (or a program's) answer to an interrupt, under a name that stays the
    same in every run of the job."""
    if job_id is None:
        raise NbqueueError("an interrupted graph waits for its answer only when it runs as a job")
    wait = step(f"langgraph: interrupt {interrupt.id}", _free_name, queue, job_id, node)
    value = interrupt.value
    if not isinstance(value, dict):
        return wait_for(wait, prompt=value if isinstance(value, str) else json.dumps(jsonable(value)))
    prompt = value.get("prompt", value.get("question", value))
    asked: dict[str, Any] = {
        "prompt": prompt if isinstance(prompt, str) else json.dumps(jsonable(prompt)),
        "choices": value.get("choices") if isinstance(value.get("choices"), list) else None,
        "timeout": value.get("timeout"),  # seconds; at the deadline: "default", or WaitExpired
    }
    if "default" in value:
        asked["default"] = value["default"]
    return wait_for(wait, **asked)


def _free_name(queue: Queue, job_id: int, node: str) -> str:
    """The node's name, or "node-2", "node-3", ... if this job already waited under it (a value
    sent ahead under a name is not a wait the job reached: it is kept for it)."""
    taken = {row.name for row in queue.waits(job_id) if row.reached_at is not None}
    name, n = node, 1
    while name in taken:
        n += 1
        name = f"{node}-{n}"
    return name
