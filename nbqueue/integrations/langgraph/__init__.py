"""LangGraph on nbqueue: checkpoints in the queue's database, graphs run as jobs.

Needs the extra: pip install 'nbqueue[langgraph]'.
"""

from __future__ import annotations

from ...errors import MissingDependency

try:
    import langgraph.checkpoint.base  # noqa: F401
except ImportError as exc:  # pragma: no cover - the extra is installed where it is tested
    raise MissingDependency(
        f"the LangGraph integration needs: pip install 'nbqueue[langgraph]' ({exc})"
    ) from None

from .graphs import enqueue_graph, graph_task, jsonable
from .saver import QueueSaver
from .serde import SafeSerializer, UnsafeCheckpoint

__all__ = ["QueueSaver", "SafeSerializer", "UnsafeCheckpoint", "enqueue_graph", "graph_task", "jsonable"]
