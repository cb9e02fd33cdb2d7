"""nbqueue as a Pydantic AI durable execution engine: each model request and tool call is one step.

`NbqueueDurability` is built on the surface Pydantic AI offers new engines (`pydantic_ai.durable_exec`),
as its own Prefect and DBOS capabilities are: Pydantic AI's `BaseDurabilityCapability` routes every
model request, tool call, MCP listing and capability operation of a run through one
`CallableOperationBackend`, and ours runs each as an `nbqueue.step` of the job running the agent.
The step's value is the operation's result as JSON (Pydantic AI's own codec: a `ModelResponse`
round-trips exactly), so a retried or recovered run gets every finished request and call back
without paying for it again. Outside a job the capability steps aside and the agent runs as usual.

Steps are named for a person reading `q.steps(job)` and the same in every run of the job
("weather: model request 2", "weather: tool get_forecast 1": names.py). A model request's value
is {"emitted": [the text it streamed into the job's stream], "value": the response}: a replayed
request emits its text again, so a run resumed after a wait numbers its stream as the first did.
Calls that wait for a person become waits of the job (waits.py); a failure the run went past is
recorded so that a replay takes the same path (below). The agent graph's own waits (between
polls of a background response, before `RetryOnModelErrors` retries) are nbqueue's durable sleeps.
"""

from __future__ import annotations

import builtins
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import datetime, timedelta
from typing import Any

from pydantic import TypeAdapter
from pydantic_ai.agent import EventStreamHandler
from pydantic_ai.capabilities import WrapRunHandler
from pydantic_ai.durable_exec import (
    JSON_CODEC,
    BaseDurabilityCapability,
    CallableOperationBackend,
    DurabilityEngineSpec,
    DurableOperationId,
    JournalOperationNamer,
    ModelRequestId,
    RoleBasedOperationConfig,
    conversation_id_from_run_id,
)
from pydantic_ai.durable_exec._model_error_codec import decode_model_error, encode_model_error  # (pinned)
from pydantic_ai.durable_exec._utils import streamed_before_failing  # (pinned: nbqueue[pydantic-ai])
from pydantic_ai.exceptions import ModelAPIError, UserError
from pydantic_ai.external_events import external_event_scope
from pydantic_ai.messages import AgentStreamEvent, PartDeltaEvent, PartStartEvent, TextPart, TextPartDelta
from pydantic_ai.models import Model
from pydantic_ai.run import AgentRunResult
from pydantic_ai.tools import AgentDepsT, DeferredToolRequests, DeferredToolResults, RunContext

from ... import clock, sleep, step
from ... import context as job_context
from ...clock import Duration
from ...errors import NbqueueError, Unretryable
from ...streams import emit
from ...suspend import Suspended
from . import waits
from .names import AgentRun, job_run, run_context, run_label, step_name

_FAILED = "failed"  # the key of a recorded failure in its step's value
_SIMPLE = (str, int, float, bool, type(None))  # a builtin error's arguments that are recorded
_EMITTED: ContextVar[list[Any] | None] = ContextVar("nbqueue_pydantic_ai_emitted", default=None)
_STARTED = TypeAdapter(datetime)


class JobStepBackend(CallableOperationBackend[None]):
    """Runs each durable operation of one agent as an `nbqueue.step` of the job running it."""

    def __init__(self, agent: str) -> None:
        config = RoleBasedOperationConfig[None](model=None, event=None, capability=None, tool=None)
        super().__init__(namer=JournalOperationNamer(agent), config=config)
        self.agent = agent

    def execution_attempt(self) -> int:
        running = job_context.current()
        return 1 if running is None else running.job.retries + 1

    async def execute(
        self,
        *,
        operation_id: DurableOperationId,
        name: str,
        body: Callable[[], Awaitable[object]],
        cache_key: tuple[object, ...],
        config: None,
    ) -> object:
        if job_context.current() is None:  # (the capability sends nothing here outside a job)
            return await body()
        named = step_name(self.agent, operation_id, name, cache_key)
        ctx = run_context(cache_key)
        agent_run = (self.agent, None if ctx is None else ctx.run_id)
        await _record_passed_failures(agent_run)
        # A model request emits its text as it streams: the items are kept with its value and
        # emitted again when the step replays, so every run of the job emits the same in order.
        streams = isinstance(operation_id, ModelRequestId)
        ran = False

        async def run_once() -> Any:
            nonlocal ran
            ran = True
            items: list[Any] = []
            token = _EMITTED.set(items)
            try:
                value = await body()
            except Exception as error:
                _note_failure(agent_run, named, error, items)
                raise
            finally:
                _EMITTED.reset(token)
            return {"emitted": items, "value": value} if streams else value

        recorded = await step(named, run_once)
        if ran:
            return recorded["value"] if streams else recorded
        if streams or _FAILED in (recorded if isinstance(recorded, dict) else ()):
            for item in recorded["emitted"]:
                emit(item)
        _raise_recorded(recorded)
        return recorded["value"] if streams else recorded


# -- failures a run went past: recorded, so that a replay fails there the same way --------------
#
# nbqueue records no value for a step that raised: the next run calls it again, which mends a
# failure that ended the run (the job's retry asks the model again). But Pydantic AI can go past a
# failed request within the run: `ModelFallback` asks the next model, a hook turns a tool's error
# into a message for the model. A later run that called the failed request again could get an
# answer this time, and would no longer match what its later steps recorded (the fallback model's
# response would be taken for the answer to the next request). So once the run starts another
# operation after a failure, the failure becomes the failed step's value, and a replay raises it
# again: a model's error rebuilt with its own class and fields (Pydantic AI's codec), a builtin
# error with its arguments. Other errors, and a stream that failed after it had produced output,
# are not recorded: a later run calls those again, as it does any step.


def _note_failure(agent_run: AgentRun, name: str, error: Exception, emitted: list[Any]) -> None:
    """Keep `error`, raised by the step `name`, to be recorded if its agent run goes on past it."""
    if isinstance(error, NbqueueError) or streamed_before_failing(error) is not None:
        return  # nbqueue refused (a lost claim, a value not JSON), or a stream that had started
    encoded = _encode_failure(error)
    if encoded is not None:
        _, run = job_run()
        run.failed(agent_run, name, {_FAILED: encoded, "emitted": emitted})


async def _record_passed_failures(agent_run: AgentRun) -> None:
    """Record the failures `agent_run` went past (called as it starts another operation; a run
    beside it going on is not this one going past its failure)."""
    _, run = job_run()
    for name, value in run.take_failed(agent_run).items():

        async def failure(value: dict[str, Any] = value) -> dict[str, Any]:
            return value

        await step(name, failure)


def _raise_recorded(recorded: Any) -> None:
    """Raise the failure a step's value records, if it records one."""
    if isinstance(recorded, dict) and _FAILED in recorded:
        raise _decode_failure(recorded[_FAILED])


def _encode_failure(error: Exception) -> dict[str, Any] | None:
    if isinstance(error, ModelAPIError):
        encoded = encode_model_error(error)
        return None if encoded is None else {"model_error": encoded}
    if type(error).__module__ == "builtins" and all(isinstance(arg, _SIMPLE) for arg in error.args):
        return {"builtin": type(error).__name__, "args": list(error.args)}
    return None


def _decode_failure(failure: dict[str, Any]) -> Exception:
    if "model_error" in failure:
        error = decode_model_error(failure["model_error"])
        if error is not None:
            return error
    elif isinstance(kind := getattr(builtins, str(failure.get("builtin")), None), type) and issubclass(
        kind, Exception
    ):
        return kind(*failure.get("args", ()))
    return NbqueueError(
        f"a step of this agent failed in an earlier run, and cannot be raised again: {failure}"
    )


class NbqueueDurability(BaseDurabilityCapability[AgentDepsT]):
    """Makes an agent durable inside nbqueue jobs: each model request and tool call is a step.

    Attach it to an agent (`Agent(..., capabilities=[NbqueueDurability()])`), or wrap the agent in
    `DurableAgent`, which attaches it to each run. Inside a job a retried or recovered run gets every
    finished request and call back from the job's steps; outside a job the agent runs as usual.

    Args:
        name: Names the agent's steps ("NAME: model request 1"); default the agent's name.
        models: Other models a run may switch to (`agent.run(model=...)`), by a name of your own.
        event_stream_handler: Gets each model request's events live inside its step, and the other
            events of the run each in a step of its own.
        emit: Stream the model's text into the job's stream (`job.stream()`). Inside a job the
            agent's requests are then streamed requests.
        approvals: Tool calls waiting for a person's approval (`requires_approval=True`,
            `ApprovalRequired`) and external calls become waits of the job, named after the tool.
        approval_timeout: How long such a wait lasts; at its deadline the call is denied (an
            external call fails). None: it waits until answered.
    """

    engine_spec = DurabilityEngineSpec(
        engine_name="nbqueue",
        durable_unit_noun="step",
        durable_container_noun="job",
        codec=JSON_CODEC,  # a step's value is JSON
        # A value that is not JSON never will be: the job is dead at once rather than retried.
        serialization_failure=lambda error: Unretryable(f"a Pydantic AI value is not JSON: {error}"),
        wrapped_toolset_kinds=frozenset({"function", "mcp", "dynamic"}),
        # Steps run in the job's own process, so an MCP server's session can last the whole run.
        toolset_lifecycles={
            "function": "enter-always",
            "mcp": "enter-in-durable-unit",
            "dynamic": "enter-never",
        },
        # Toolsets given to one run only were never wrapped: their calls would not be steps.
        unsupported_runtime_toolset_kinds=frozenset({"function", "mcp", "dynamic"}),
        # A wait or a durable sleep ends the run by raising Suspended: not a failure to handle.
        control_flow_error_types=(Suspended,),
    )

    def __init__(
        self,
        *,
        name: str | None = None,
        models: Mapping[str, Model] | None = None,
        event_stream_handler: EventStreamHandler[AgentDepsT] | None = None,
        emit: bool = True,
        approvals: bool = True,
        approval_timeout: Duration | None = None,
    ) -> None:
        super().__init__(models=models, event_stream_handler=event_stream_handler, name=name)
        self.emit = emit
        self.approvals = approvals
        self.approval_timeout = clock.seconds(approval_timeout, "approval_timeout")
        self._backend: JobStepBackend | None = None

    @property
    def in_durable_context(self) -> bool:
        return job_context.current() is not None

    def get_durable_operation_backend(self) -> JobStepBackend:
        if self._backend is None or self._backend.agent != self.name:  # (one per bound copy)
            self._backend = JobStepBackend(self.name)
        return self._backend

    def get_default_run_id(self) -> str | None:
        """The same run ID in every run of the job: the job's, the agent's name, and which of the
        job's runs of the agent this is (counted as they start)."""
        running = job_context.current()
        if running is None:
            return None
        _, run = job_run()
        run_id = f"nbqueue-job-{running.job.id}-{self.name}-{run.next(f'{self.name}: run ids')}"
        run.agent_run(self.name, run_id)
        return run_id

    def get_default_conversation_id(self, run_id: str) -> str | None:
        return conversation_id_from_run_id(run_id) if self.in_durable_context else None

    async def get_run_start_time(self, run_id: str) -> datetime | None:
        """When the run first started, recorded: a recovered run's `timeout=` counts from then."""
        if job_context.current() is None:
            return None

        async def now() -> str:
            return _STARTED.dump_python(datetime.now().astimezone(), mode="json")  # type: ignore[no-any-return]

        started = await step(f"{run_label(self.name, run_id)}: run started", now)
        return _STARTED.validate_python(started)

    async def durable_sleep(self, seconds: float) -> None:
        """Waits between polls of a model's background job: nbqueue's durable sleep, so the job
        holds no worker meanwhile and a recovered run does not wait again."""
        _, run = job_run()
        sleep(f"{self.name}: sleep {run.next(f'{self.name}: sleep')}", timedelta(seconds=max(seconds, 0)))

    async def wrap_run(self, ctx: RunContext[AgentDepsT], *, handler: WrapRunHandler) -> AgentRunResult[Any]:
        if not self.in_durable_context:
            return await handler()
        # A wait for an external event (HandleDeferredToolCalls with a token) is a wait of the job.
        with external_event_scope(waits.JobWaiter(self.name)), unretryable_usage_errors():
            return await super().wrap_run(ctx, handler=handler)

    async def handle_deferred_tool_calls(
        self, ctx: RunContext[AgentDepsT], *, requests: DeferredToolRequests
    ) -> DeferredToolResults | None:
        """Inside a job, each call waiting for approval (or for its result) waits for `q.send`."""
        if not (self.approvals and self.in_durable_context):
            return None
        return waits.answer(requests, self.approval_timeout)

    # -- the job's stream: these override the base's seams for the events it hands a handler --

    def _effective_event_stream_handler(self) -> EventStreamHandler[AgentDepsT] | None:
        # With one, a run streams its model requests: inside a job, so that the text can be emitted.
        if self._event_stream_handler is None and self.emit and self.in_durable_context:
            return _ignore_events
        return self._event_stream_handler

    def _model_stream_event_handler(self) -> EventStreamHandler[AgentDepsT] | None:
        user = self._event_stream_handler
        if not self.emit:
            return user

        async def handle(ctx: RunContext[AgentDepsT], events: AsyncIterable[AgentStreamEvent]) -> None:
            stream = _emitting(events)
            if user is not None:
                await user(ctx, stream)
            async for _ in stream:  # what the user's handler left: its text is emitted too
                pass

        return handle

    async def _dispatch_event_stream_event(
        self, ctx: RunContext[AgentDepsT], event: AgentStreamEvent
    ) -> None:
        # Only a handler of the user's gets the run's other events (each in a step of its own).
        if self._event_stream_handler is not None:
            await super()._dispatch_event_stream_event(ctx, event)


@contextmanager
def unretryable_usage_errors() -> Iterator[None]:
    """Inside a job, Pydantic AI's UserError (a usage mistake, such as a toolset given to one run
    only) makes the job dead at once: every retry would meet it again."""
    try:
        yield
    except UserError as error:
        if job_context.current() is None:
            raise
        raise Unretryable(f"{type(error).__name__}: {error}") from error


async def _ignore_events(ctx: RunContext[Any], events: AsyncIterable[AgentStreamEvent]) -> None:
    async for _ in events:
        pass


async def _emitting(events: AsyncIterable[AgentStreamEvent]) -> AsyncIterator[AgentStreamEvent]:
    """The model's events, its text emitted to the job's stream (and kept for the step) on the way."""
    async for event in events:
        text = None
        if isinstance(event, PartStartEvent) and isinstance(event.part, TextPart):
            text = event.part.content
        elif isinstance(event, PartDeltaEvent) and isinstance(event.delta, TextPartDelta):
            text = event.delta.content_delta
        if text:
            emit(text)
            kept = _EMITTED.get()
            if kept is not None:
                kept.append(text)
        yield event
