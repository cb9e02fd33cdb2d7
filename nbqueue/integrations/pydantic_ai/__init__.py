"""Pydantic AI on nbqueue: agents whose model requests and tool calls are durable steps of a job.

Needs the extra: pip install 'nbqueue[pydantic-ai]'.
"""

from __future__ import annotations

from ...errors import MissingDependency

try:
    import pydantic_ai.durable_exec  # noqa: F401
except ImportError as exc:  # pragma: no cover - the extra is installed where it is tested
    raise MissingDependency(
        f"the Pydantic AI integration needs: pip install 'nbqueue[pydantic-ai]' ({exc})"
    ) from None

from .agents import DurableAgent, agent_task, enqueue_agent
from .engine import NbqueueDurability

__all__ = ["DurableAgent", "NbqueueDurability", "agent_task", "enqueue_agent"]
