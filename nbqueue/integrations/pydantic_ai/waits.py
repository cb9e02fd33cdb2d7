"""Deferred tool calls as waits of the job: a person approves a call with `q.send` (or the board).

A tool that needs approval (`requires_approval=True`, or one that raises `ApprovalRequired`) makes
the job wait under the tool's name, its prompt naming the tool and its arguments, its choices
"approve" and "deny": `q.send(job, "delete_file", "approve")`. The job holds no worker meanwhile;
the answer resumes the run, which replays its recorded steps up to the call and goes on with the
call approved (run, as its step "... approved") or denied (the model is told). An external call
(`CallDeferred`, a tool run elsewhere) waits the same way for its result, any JSON value. A tool
that asks again later in the job waits under "delete_file-2", "delete_file-3", ...

Pydantic AI's own way to wait for an answer from outside (`HandleDeferredToolCalls` with a handler
that takes a resume token, `wait_for_external_event`) is a wait of the job too: the token is
"JOB_ID:WAIT_NAME", and `q.send(JOB_ID, WAIT_NAME, answer)` resolves it.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

from pydantic import JsonValue
from pydantic_ai.exceptions import ToolFailed
from pydantic_ai.external_events import ExternalEventError, ExternalEventWaiter
from pydantic_ai.tools import DeferredToolRequests, DeferredToolResults, ToolApproved, ToolDenied

from ... import step, wait_for
from ...context import current
from .names import job_run

APPROVE, DENY = "approve", "deny"
PROMPT_LIMIT = 400  # characters of a call's arguments shown in a wait's prompt
_EXPIRED: Any = object()  # what a wait returns at its deadline (never a value sent: those are JSON)


def answer(requests: DeferredToolRequests, timeout: float | None) -> DeferredToolResults:
    """Wait for each pending call's answer in turn (the job suspends at the first one unanswered,
    and the run that resumes it gets the answers already sent without waiting). At the deadline,
    `timeout` seconds after a wait is reached, a call waiting for approval is denied, and one
    waiting for its result fails: the model is told."""
    late = f"within {timeout:g} s" if timeout is not None else ""
    results = DeferredToolResults()
    for call in requests.approvals:
        args = requests.validated_args.get(call.tool_call_id) or call.args_as_dict()
        name = wait_name(call.tool_name)
        choice = _wait(name, timeout, f"Approve {describe(call.tool_name, args)}?", [APPROVE, DENY])
        if choice is _EXPIRED:
            results.approvals[call.tool_call_id] = ToolDenied(f"No one approved this call {late}.")
        else:
            results.approvals[call.tool_call_id] = ToolApproved() if choice == APPROVE else ToolDenied()
    for call in requests.calls:
        args = requests.validated_args.get(call.tool_call_id) or call.args_as_dict()
        name = wait_name(call.tool_name)
        question = args.get("question") if requests.kind(call.tool_call_id) == "question" else None
        prompt = question if isinstance(question, str) else f"The result of {describe(call.tool_name, args)}"
        value = _wait(name, timeout, prompt, None)
        expired = ToolFailed(f"No result for this call arrived {late}.")
        results.calls[call.tool_call_id] = expired if value is _EXPIRED else value
    return results


def wait_name(base: str) -> str:
    """`base`, then "base-2", "base-3", ... for the job's later waits under it."""
    _, run = job_run()
    n = run.next(f"wait {base}")
    return base if n == 1 else f"{base}-{n}"


def describe(tool: str, args: dict[str, Any]) -> str:
    """A call as a person reads it: get_weather(city="Paris")."""
    shown = ", ".join(f"{key}={json.dumps(value, default=str)}" for key, value in args.items())
    if len(shown) > PROMPT_LIMIT:
        shown = shown[: PROMPT_LIMIT - 3] + "..."
    return f"{tool}({shown})"


def _wait(name: str, timeout: float | None, prompt: str, choices: list[str] | None) -> Any:
    if timeout is None:
        return wait_for(name, prompt=prompt, choices=choices)
    return wait_for(name, timeout=timeout, prompt=prompt, choices=choices, default=_EXPIRED)


class JobWaiter(ExternalEventWaiter):
    """Pydantic AI's wait for an external event, as a wait of the job: `ask` runs once, as a step,
    with the token "JOB_ID:WAIT_NAME"; unless it answered, the job waits for `q.send`."""

    def __init__(self, agent: str) -> None:
        self.agent = agent

    async def wait(
        self, name: str, *, ask: Callable[[str], Awaitable[JsonValue]], timeout: timedelta | None
    ) -> JsonValue:
        running = current()
        assert running is not None  # (installed for runs inside a job only)
        wait = wait_name(name)
        answered = await step(f"{self.agent}: ask {wait}", ask, f"{running.job.id}:{wait}")
        if answered is not None:
            return answered  # type: ignore[no-any-return]
        value = wait_for(wait, timeout=timeout, default=_EXPIRED) if timeout else wait_for(wait)
        if value is _EXPIRED:
            raise ExternalEventError(f"No answer to {wait!r} arrived within {timeout}.")
        return value  # type: ignore[no-any-return]
