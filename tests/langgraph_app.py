"""A LangGraph graph for worker processes started by tests/test_langgraph_graphs.py:
`nbqueue worker URL --import tests.langgraph_app`, with NBQUEUE_LG_APP_QUEUE set to the same URL.

The test process imports it too (without that variable) and calls `register` on its own queue,
so that both sides agree on the task's name and options. Each node appends its name to the file
NBQUEUE_LG_APP_MARKS (a count of its runs that survives a SIGKILL); node "n3" SIGKILLs its own
process the first time it runs (the marker file "killed" beside the marks tells the runs apart).
"""

from __future__ import annotations

import itertools
import operator
import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypedDict

from langgraph.graph import END, START, StateGraph

import nbqueue
from nbqueue.integrations.langgraph import graph_task

QUEUE_VAR = "NBQUEUE_LG_APP_QUEUE"  # the queue a worker process registers the task on
MARKS_VAR = "NBQUEUE_LG_APP_MARKS"  # the file each node appends its name to
NAME = "relay"  # the task: "langgraph.relay"
NODES = ("n1", "n2", "n3", "n4")


class Relay(TypedDict):
    trail: Annotated[list[str], operator.add]
    total: int


def _node(name: str, add: int) -> Callable[[Relay], dict[str, Any]]:
    def run(state: Relay) -> dict[str, Any]:
        marks = Path(os.environ[MARKS_VAR])
        with marks.open("a") as file:  # written and closed before any kill: the count is exact
            file.write(name + "\n")
        killed = marks.with_name("killed")
        if name == "n3" and not killed.exists():
            killed.touch()
            os.kill(os.getpid(), signal.SIGKILL)  # the worker dies mid-graph, its lease held
        return {"trail": [name], "total": state["total"] + add}

    return run


def build() -> Any:
    builder = StateGraph(Relay)
    for i, name in enumerate(NODES):
        builder.add_node(name, _node(name, 10**i))
    builder.add_edge(START, NODES[0])
    for a, b in itertools.pairwise(NODES):
        builder.add_edge(a, b)
    builder.add_edge(NODES[-1], END)
    return builder.compile(name=NAME)


def register(queue: nbqueue.Queue) -> nbqueue.Task[..., Any]:
    # A recovered job is retried: a short backoff so that the new worker runs it at once.
    return graph_task(queue, build(), max_retries=3, backoff=nbqueue.Backoff(base=0.1, cap=0.1, jitter=0))


if os.environ.get(QUEUE_VAR):  # imported by `nbqueue worker --import`: register on that queue
    register(nbqueue.Queue(os.environ[QUEUE_VAR]))
