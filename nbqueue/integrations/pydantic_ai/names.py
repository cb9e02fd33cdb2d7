"""The names an agent's steps and waits get in its job: the same in every run of the job.

nbqueue finds a recorded step by its name, so a retried, recovered or resumed run of the job must
name each model request and tool call as the first run did. Names count within one agent run,
which every run of the job repeats in order: "weather: model request 2" is the second request of
the job's first run of the agent "weather"; its second run's are "weather run 2: model request 1",
... (agent runs are numbered as they start, so runs side by side, `asyncio.gather`, keep theirs).
A tool call is numbered by its place among the calls of the response that asked for it ("weather:
tool get_forecast 3"), because parallel calls reach their steps in whatever order they are
scheduled. (Waits are named after the tool, for `q.send`: waits.py.)
"""

from __future__ import annotations

import threading
import weakref
from collections import Counter
from typing import Any

from pydantic_ai.durable_exec import (
    CapabilityOperationId,
    DurableOperationId,
    EventStreamHandlerId,
    ModelCancelSuspendedResponseId,
    ModelCompactMessagesId,
    ModelCountTokensId,
    ModelRequestId,
    ToolsetCallToolId,
    ToolsetGetInstructionsId,
    ToolsetGetToolsId,
    ToolsetValidateToolArgumentsId,
)
from pydantic_ai.messages import ModelResponse
from pydantic_ai.tools import RunContext

from ... import context as job_context

AgentRun = tuple[str, str | None]  # (agent, its run's id): one agent run of a job


class JobRun:
    """What one run of one job has numbered so far, and the failures its agent runs may yet go
    past (shared by the job's agents, their runs and the job's threads)."""

    def __init__(self) -> None:
        self._counts: Counter[str] = Counter()
        self._agent_runs: dict[tuple[str, str], int] = {}  # (agent, run_id) -> which run of the agent
        self._tools: dict[tuple[str, int, str], int] = {}  # (label, response's index, call id) -> number
        self._failed: dict[AgentRun, dict[str, dict[str, Any]]] = {}
        self._lock = threading.Lock()  # a job's threads (sync tools, run_sync) share it

    def next(self, key: str) -> int:
        """1 the first time `key` is counted in this run, then 2, 3, ..."""
        with self._lock:
            self._counts[key] += 1
            return self._counts[key]

    def agent_run(self, agent: str, run_id: str | None) -> int:
        """Which of the job's runs of `agent` the run `run_id` is (1, 2, ...: as they start)."""
        if run_id is None:
            return 1
        with self._lock:
            number = self._agent_runs.get((agent, run_id))
            if number is None:
                self._counts[f"{agent}: agent runs"] += 1
                number = self._agent_runs[(agent, run_id)] = self._counts[f"{agent}: agent runs"]
            return number

    def tool_number(self, label: str, tool: str, ctx: RunContext[Any] | None) -> int:
        """A tool call's number: by its place among the calls of the response that asked for it,
        else (a call no response in the run's messages holds) in the order calls arrive."""
        if ctx is not None and ctx.tool_call_id is not None:
            for index in range(len(ctx.messages) - 1, -1, -1):
                response = ctx.messages[index]
                if isinstance(response, ModelResponse) and any(
                    call.tool_call_id == ctx.tool_call_id for call in response.tool_calls
                ):
                    return self._number_calls(label, index, response)[ctx.tool_call_id]
        return self.next(f"{label}: tool {tool}")

    def _number_calls(self, label: str, index: int, response: ModelResponse) -> dict[str, int]:
        with self._lock:
            calls = response.tool_calls
            if (label, index, calls[0].tool_call_id) not in self._tools:  # its first call seen
                for call in calls:  # (an output tool's too: it counts under a name of its own)
                    self._counts[f"{label}: tool {call.tool_name}"] += 1
                    self._tools[(label, index, call.tool_call_id)] = self._counts[
                        f"{label}: tool {call.tool_name}"
                    ]
            return {call.tool_call_id: self._tools[(label, index, call.tool_call_id)] for call in calls}

    def failed(self, agent_run: AgentRun, name: str, value: dict[str, Any]) -> None:
        """Keep the value that records the failure of the step `name` of `agent_run` (engine.py)."""
        with self._lock:
            self._failed.setdefault(agent_run, {})[name] = value

    def take_failed(self, agent_run: AgentRun) -> dict[str, dict[str, Any]]:
        """The failures of `agent_run` kept so far, forgotten here (another run's stay: runs side
        by side in one job go past only their own)."""
        with self._lock:
            return self._failed.pop(agent_run, {})


_runs: dict[int, JobRun] = {}
_runs_lock = threading.Lock()


def job_run() -> tuple[job_context.JobContext, JobRun]:
    """The job running here and its run's numbering (made when first asked for)."""
    running = job_context.current()
    assert running is not None, "asked for inside a job only"
    with _runs_lock:
        run = _runs.get(id(running))
        if run is None:
            run = _runs[id(running)] = JobRun()
            # A JobContext is not hashable: kept by its id, and dropped with it (before the id is reused).
            weakref.finalize(running, _forget, id(running))
    return running, run


def _forget(key: int) -> None:
    with _runs_lock:
        _runs.pop(key, None)


def run_label(agent: str, run_id: str | None) -> str:
    """What the steps of an agent run are named after: "weather", then "weather run 2", ..."""
    _, run = job_run()
    number = run.agent_run(agent, run_id)
    return agent if number == 1 else f"{agent} run {number}"


def run_context(key: tuple[object, ...]) -> RunContext[Any] | None:
    """The RunContext in an operation's cache key, if it has one: which agent run it belongs to."""
    return next((part for part in key if isinstance(part, RunContext)), None)


def step_name(
    agent: str, operation_id: DurableOperationId, journal_name: str, key: tuple[object, ...]
) -> str:
    """The step an operation of `agent` is in this run of the job: "AGENT: model request 1".

    `key` is the operation's cache key (Pydantic AI's projection of its parameters): the RunContext
    in it tells which agent run, and for a tool call which tool and which call of which response.
    """
    _, run = job_run()
    ctx = run_context(key)
    label = run_label(agent, ctx.run_id if ctx is not None else None)
    match operation_id:
        case ToolsetCallToolId() | ToolsetValidateToolArgumentsId():
            tool = (ctx.tool_name if ctx is not None else None) or str(key[0])
            what = f"tool {tool} {run.tool_number(label, tool, ctx)}"
            if ctx is not None and ctx.tool_call_approved:
                what += " approved"  # the call that waited for approval, now run
            if isinstance(operation_id, ToolsetValidateToolArgumentsId):
                what += " arguments"
            return f"{label}: {what}"
        case ModelRequestId():
            kind = "model request"
        case ModelCountTokensId():
            kind = "count tokens"
        case ModelCompactMessagesId():
            kind = "compact messages"
        case ModelCancelSuspendedResponseId():
            kind = "cancel response"
        case EventStreamHandlerId():
            kind = "event"
        case ToolsetGetToolsId(toolset_id=toolset):
            kind = f"{toolset} tools"
        case ToolsetGetInstructionsId(toolset_id=toolset):
            kind = f"{toolset} instructions"
        case CapabilityOperationId(capability_id=capability, operation=operation):
            kind = f"{capability} {operation}"
        case _:  # Pydantic AI adds operations in minor releases: named as its journal names them
            kind = journal_name
    return f"{label}: {kind} {run.next(f'{label}: {kind}')}"
