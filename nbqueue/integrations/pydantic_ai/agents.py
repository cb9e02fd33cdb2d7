"""A Pydantic AI agent made durable in nbqueue jobs, and agents run as jobs without writing a task.

    agent = DurableAgent(Agent("openai:gpt-5.2", name="weather"))

    @q.task(max_retries=3)
    def forecast(city: str) -> str:
        return agent.run_sync(f"What is the weather in {city}?").output

`DurableAgent(agent)` is the agent with `NbqueueDurability` attached to each of its runs: `run`,
`run_sync`, `run_stream`, `run_stream_events`, `iter` and the rest work as the agent's own do, and
inside a job every model request and tool call is a step (`q.steps(job)`). `enqueue_agent(q, agent,
prompt)` runs one as a job whose result is the run's output as JSON.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError
from pydantic_ai.agent import AbstractAgent, AgentRun, EventStreamHandler, WrapperAgent
from pydantic_ai.capabilities import AgentCapability
from pydantic_ai.durable_exec import BaseDurabilityCapability
from pydantic_ai.messages import ModelMessage, ModelMessagesTypeAdapter
from pydantic_ai.models import Model
from pydantic_ai.models.function import FunctionModel
from pydantic_ai.output import OutputDataT
from pydantic_ai.tools import AgentDepsT
from pydantic_core import to_jsonable_python

from ...clock import Duration, seconds
from ...errors import InvalidArgument
from .engine import NbqueueDurability, unretryable_usage_errors

if TYPE_CHECKING:
    from ...jobs import Job
    from ...queue import Queue
    from ...tasks import Task

PREFIX = "pydantic_ai."  # an agent's task: "pydantic_ai." + its name
UNNAMED = "agent"  # what an unnamed agent's steps are named after


class DurableAgent(WrapperAgent[AgentDepsT, OutputDataT]):
    """`agent`, durable inside nbqueue jobs: each model request and tool call is a step of the job.

    A retried or recovered run gets every finished request and call back from the job's steps
    instead of paying for it again; the model's text goes to the job's stream; a tool call that
    needs approval waits for `q.send(job, TOOL_NAME, "approve")` (or "deny") without holding a
    worker. Outside a job it runs as the agent does.

    Args:
        agent: A Pydantic AI agent (`Agent(...)`) with no durability capability of its own.
        name: Names the steps ("NAME: model request 1"); default the agent's name, else "agent".
            The steps of a job are found by name: keep it while jobs that ran it may run again.
        emit: Stream the model's text into the job's stream (its requests are then streamed).
        approvals: Calls that need approval, or an external result, become waits of the job.
        approval_timeout: How long those wait (then: denied, or failed); None: until answered.
        event_stream_handler: Gets the model's events live inside each request's step.
        models: Other models a run may switch to (`run(model=...)`), by a name of your own.

    Raises:
        InvalidArgument: `agent` is not a Pydantic AI agent, or is made durable already; a name
            or timeout that is not one.
    """

    def __init__(
        self,
        agent: AbstractAgent[AgentDepsT, OutputDataT],
        *,
        name: str | None = None,
        emit: bool = True,
        approvals: bool = True,
        approval_timeout: Duration | None = None,
        event_stream_handler: EventStreamHandler[AgentDepsT] | None = None,
        models: Mapping[str, Model] | None = None,
    ) -> None:
        if not isinstance(agent, AbstractAgent):
            raise InvalidArgument(f"DurableAgent takes a Pydantic AI agent (Agent(...)), not {agent!r}")
        if isinstance(agent, DurableAgent) or BaseDurabilityCapability.from_agent(agent) is not None:
            raise InvalidArgument(
                f"agent {agent.name or ''!r} is made durable already (a DurableAgent, or a durability "
                "capability among its capabilities): give DurableAgent the plain agent"
            )
        if name is not None and (not isinstance(name, str) or not name.strip()):
            raise InvalidArgument(f"DurableAgent's name is non-empty text, not {name!r}")
        super().__init__(agent)
        self._step_name = name
        self._options: dict[str, Any] = {
            "emit": emit,
            "approvals": approvals,
            "approval_timeout": seconds(approval_timeout, "approval_timeout"),  # checked here
            "event_stream_handler": event_stream_handler,
            "models": models,
        }

    @property
    def step_name(self) -> str:
        """What this agent's steps are named after."""
        return self._step_name or self.wrapped.name or UNNAMED

    @asynccontextmanager
    async def iter(  # type: ignore[override]  # (the agent's own signature, passed on whole)
        self,
        user_prompt: Any = None,
        *,
        capabilities: Sequence[AgentCapability[AgentDepsT]] | None = None,
        **options: Any,
    ) -> AsyncIterator[AgentRun[AgentDepsT, Any]]:
        """The agent's `iter`, with `NbqueueDurability` among the run's capabilities (every other way
        to run the agent goes through here)."""
        model = options.get("model") or self.wrapped.model
        # A FunctionModel given no stream_function cannot stream: its text is not emitted (the
        # stream is made from streamed requests), rather than every attempt failing on it.
        silent = isinstance(model, FunctionModel) and model.stream_function is None
        settings = {**self._options, "emit": False} if silent else self._options
        durability = NbqueueDurability[AgentDepsT](name=self.step_name, **settings)
        with unretryable_usage_errors():
            async with self.wrapped.iter(
                user_prompt, capabilities=[*(capabilities or ()), durability], **options
            ) as run:
                yield run


def agent_task(
    queue: Queue,
    agent: AbstractAgent[Any, Any],
    *,
    name: str | None = None,
    **options: Any,
) -> Task[..., Any]:
    """Register the task that runs `agent` as a job on `queue` ("pydantic_ai." + its name) and
    return it: `task.enqueue(prompt, message_history=None)`, the result the run's output as JSON.

    A worker in another process needs the same registration: call this where the agent is
    defined. `agent` may be a `DurableAgent` (its options are kept); `options` are `q.task`'s
    (max_retries, timeout, queue, limits, ...). Registering the name again replaces the task.

    Raises:
        InvalidArgument: not a Pydantic AI agent, or neither the agent nor `name` names it.
    """
    durable = agent if isinstance(agent, DurableAgent) else DurableAgent(agent, name=name)
    label = name or durable.name
    if not isinstance(label, str) or not label.strip():
        raise InvalidArgument(
            "agent_task needs a name for the agent's task: Agent(..., name=...) or agent_task(..., name=...)"
        )

    async def run_agent(prompt: str | None = None, message_history: list[Any] | None = None) -> Any:
        history = ModelMessagesTypeAdapter.validate_python(message_history) if message_history else None
        result = await durable.run(prompt, message_history=history)
        return to_jsonable_python(result.output, fallback=str)

    run_agent.__doc__ = f"Run the Pydantic AI agent {label!r}; its output as JSON."
    return queue.task(name=PREFIX + label, **options)(run_agent)


def enqueue_agent(
    queue: Queue,
    agent: AbstractAgent[Any, Any],
    prompt: str | None,
    *,
    message_history: Sequence[ModelMessage | dict[str, Any]] | None = None,
    name: str | None = None,
    **options: Any,
) -> Job:
    """Run `agent` on `prompt` as a job (after `message_history`: a conversation's messages so far,
    as objects or JSON); the job's result is the run's output as JSON. `name` names the task when
    the agent has no name; `options` are `q.task`'s (`agent_task` registers the task).

    Raises:
        InvalidArgument: not an agent, an unnamed one, a prompt that is not text, or messages that
            are not Pydantic AI's.
    """
    if prompt is not None and not isinstance(prompt, str):
        raise InvalidArgument(f"enqueue_agent's prompt is text (or None), not {type(prompt).__name__}")
    history = None
    if message_history is not None:
        try:  # messages, or their JSON (as a job's steps hold them): checked here, not in the job
            messages = ModelMessagesTypeAdapter.validate_python(list(message_history))
        except (ValidationError, TypeError) as exc:  # pydantic's errors say which message and field
            raise InvalidArgument(f"message_history is not a list of Pydantic AI messages: {exc}") from None
        history = ModelMessagesTypeAdapter.dump_python(messages, mode="json")
    task = agent_task(queue, agent, name=name, **options)
    return task.enqueue(prompt, message_history=history)
