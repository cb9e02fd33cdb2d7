"""A Pydantic AI agent for worker processes started by tests/test_pydantic_ai.py:
`nbqueue worker URL --import tests.pydantic_ai_app`, with NBQUEUE_PAI_APP_QUEUE set to the same URL.

The test process imports it too (without that variable) and calls `register` on its own queue, so
that both sides agree on the task's name and options. The agent's model (a FunctionModel, offline)
asks for the tool get_weather, then answers; each model request and tool call appends a line to
the file NBQUEUE_PAI_APP_MARKS (a count of its runs that survives a SIGKILL), and the second model
request SIGKILLs its own process the first time it runs (the marker file "killed" beside the marks
tells the runs apart): the worker dies after a model request and a tool call finished.

`streaming(reply)` is also the tests' way to give a FunctionModel the streamed replies a job's
agent asks for: `reply`'s response, its text word by word and its tool calls whole.
"""

from __future__ import annotations

import os
import re
import signal
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, DeltaToolCall, DeltaToolCalls, FunctionModel

import nbqueue
from nbqueue.integrations.pydantic_ai import agent_task

QUEUE_VAR = "NBQUEUE_PAI_APP_QUEUE"  # the queue a worker process registers the task on
MARKS_VAR = "NBQUEUE_PAI_APP_MARKS"  # the file each request and call appends a line to
NAME = "forecaster"  # the task: "pydantic_ai.forecaster"

Reply = Callable[[list[ModelMessage], AgentInfo], ModelResponse]


def streaming(reply: Reply) -> FunctionModel:
    """A FunctionModel answering with `reply`, plain or streamed (text word by word)."""

    async def stream(messages: list[ModelMessage], info: AgentInfo) -> AsyncIterator[str | DeltaToolCalls]:
        for index, part in enumerate(reply(messages, info).parts):
            if isinstance(part, TextPart):
                for word in re.findall(r"\S+\s*", part.content):
                    yield word
            elif isinstance(part, ToolCallPart):
                call = DeltaToolCall(part.tool_name, part.args_as_json_str(), tool_call_id=part.tool_call_id)
                yield {index: call}

    return FunctionModel(reply, stream_function=stream)


def requests_so_far(messages: list[ModelMessage]) -> int:
    """Which model request of the run this is: 1 for the first, 2 after the first tool results."""
    return sum(isinstance(message, ModelRequest) for message in messages)


def _mark(line: str) -> None:
    with Path(os.environ[MARKS_VAR]).open("a") as file:  # written and closed before any kill
        file.write(line + "\n")


def _reply(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    n = requests_so_far(messages)
    _mark(f"model {n}")
    if n == 1:
        return ModelResponse(parts=[ToolCallPart("get_weather", {"city": "Paris"}, tool_call_id="call-1")])
    killed = Path(os.environ[MARKS_VAR]).with_name("killed")
    if not killed.exists():
        killed.touch()
        os.kill(os.getpid(), signal.SIGKILL)  # the worker dies mid-run, its lease held
    return ModelResponse(parts=[TextPart("It is sunny in Paris.")])


def build() -> Agent[None, str]:
    agent = Agent(streaming(_reply), name=NAME)

    @agent.tool_plain
    def get_weather(city: str) -> str:
        _mark("tool get_weather")
        return f"sunny in {city}"

    return agent


def register(queue: nbqueue.Queue) -> nbqueue.Task[..., Any]:
    # A recovered job is retried: a short backoff so that the new worker runs it at once.
    return agent_task(queue, build(), max_retries=3, backoff=nbqueue.Backoff(base=0.1, cap=0.1, jitter=0))


if os.environ.get(QUEUE_VAR):  # imported by `nbqueue worker --import`: register on that queue
    register(nbqueue.Queue(os.environ[QUEUE_VAR]))
