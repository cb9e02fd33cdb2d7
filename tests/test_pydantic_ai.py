"""Pydantic AI agents on nbqueue, on both backends: DurableAgent, NbqueueDurability, agent_task and
enqueue_agent (the contract: docs AGENTS.md, "Agent frameworks on nbqueue").

Every model request and tool call of an agent run inside a job is a step: a retried or recovered
run repeats none that finished (counted in the model's function and the tool); a call that needs
approval is a wait answered by q.send; the model's text goes into the job's stream; outside a job
the agent runs as it does without us. Real Pydantic AI (offline: FunctionModel and TestModel), real
worker threads, a real worker process killed with SIGKILL, real SQLite files and the real
PostgreSQL server.
"""

from __future__ import annotations

import asyncio
import re
import sys
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel
from pydantic_ai import Agent, FunctionToolset, RunContext
from pydantic_ai.capabilities import (
    AbstractCapability,
    HandleDeferredToolCalls,
    Hooks,
    ModelFallback,
    RetryOnModelErrors,
)
from pydantic_ai.exceptions import ApprovalRequired, CallDeferred, ModelHTTPError, ModelUnavailableError
from pydantic_ai.messages import (
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.models.test import TestModel
from pydantic_ai.tools import DeferredToolRequests

import nbqueue
from nbqueue import Queue
from nbqueue.integrations.pydantic_ai import DurableAgent, NbqueueDurability, agent_task, enqueue_agent
from tests import pydantic_ai_app
from tests.helpers import (
    QUICK,
    QUICK_RETRY,
    MakeQueue,
    killed_then_finished,
    status,
    until_status,
    wait_until,
)
from tests.pydantic_ai_app import requests_so_far, streaming

ROOT = Path(__file__).resolve().parents[1]


def words(text: str) -> list[str]:
    """The items a streamed text comes in (tests/pydantic_ai_app.streaming: word by word)."""
    return re.findall(r"\S+\s*", text)


def outcomes(q: Queue, job: nbqueue.Job) -> list[str]:
    return list(q.attempts(job)["outcome"])


def steps(q: Queue, job: nbqueue.Job) -> list[str]:
    return [str(name) for name in q.steps(job)["step"]]


def tool_returns(messages: list[ModelMessage]) -> list[Any]:
    return [
        p.content
        for m in messages
        if isinstance(m, ModelRequest)
        for p in m.parts
        if isinstance(p, ToolReturnPart)
    ]


def weather_agent(calls: Counter[str], *, fail_request: int | None = None) -> Agent[None, str]:
    """Asks for get_weather(Paris), then answers with what it returned; request `fail_request`
    raises the first time (a transient error: the server hung up)."""

    def reply(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        n = requests_so_far(messages)
        calls[f"model {n}"] += 1
        if n == fail_request and calls[f"model {n}"] == 1:
            raise ConnectionError("the model's server hung up")
        if n == 1:
            return ModelResponse(parts=[ToolCallPart("get_weather", {"city": "Paris"}, tool_call_id="w1")])
        return ModelResponse(parts=[TextPart(f"The weather: {tool_returns(messages)[0]}.")])

    agent = Agent(streaming(reply), name="weather")

    @agent.tool_plain
    def get_weather(city: str) -> str:
        calls["tool get_weather"] += 1
        return f"sunny in {city}"

    return agent


# -- a. a transient error, retried by nbqueue ------------------------------------------------------


def test_a_retried_run_repeats_no_model_request_or_tool_call_that_finished(queue: Queue) -> None:
    calls: Counter[str] = Counter()
    agent = DurableAgent(weather_agent(calls, fail_request=2))

    @queue.task(max_retries=2, backoff=QUICK_RETRY)
    def forecast(city: str) -> Any:
        result = agent.run_sync(f"Weather in {city}?")
        return [result.output, ModelMessagesTypeAdapter.dump_python(result.all_messages(), mode="json")]

    job = forecast.enqueue("Paris")
    with queue.worker(**QUICK):
        output, messages = job.result(timeout=20)
    assert output == "The weather: sunny in Paris."
    # Request 1 and the tool call finished before the error: the retry got them from their steps.
    assert calls == Counter({"model 1": 1, "tool get_weather": 1, "model 2": 2})
    assert outcomes(queue, job) == ["failed", "completed"]
    assert steps(queue, job) == [
        "weather: model request 1",
        "weather: tool get_weather 1",
        "weather: model request 2",
    ]
    q_steps = queue.steps(job).to_dict("records")
    assert q_steps[1]["value"] == {"result": "sunny in Paris", "kind": "tool_return"}
    # The first response, as the retry got it back from its step: the first attempt's, exactly.
    recorded = q_steps[0]["value"]["value"]
    assert recorded["parts"][0]["tool_name"] == "get_weather"
    assert {k: messages[1][k] for k in recorded if recorded[k] is not None} == {
        k: v for k, v in recorded.items() if v is not None
    }
    # The retry's stream holds the whole answer: request 2's text, word by word.
    assert list(job.stream(follow=False)) == ["The ", "weather: ", "sunny ", "in ", "Paris."]


def test_parallel_tool_calls_are_numbered_as_the_model_asked_for_them(queue: Queue) -> None:
    calls: Counter[str] = Counter()

    def reply(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        calls[f"model {requests_so_far(messages)}"] += 1
        if requests_so_far(messages) == 1:
            cities = ["Paris", "Oslo", "Lima"]
            return ModelResponse(
                parts=[
                    ToolCallPart("get_weather", {"city": c}, tool_call_id=f"w{i}")
                    for i, c in enumerate(cities)
                ]
            )
        return ModelResponse(parts=[TextPart(" / ".join(map(str, tool_returns(messages))))])

    async def arrive(ctx: RunContext[None], *, call: ToolCallPart, tool_def: Any, args: Any) -> Any:
        calls["arrived"] += 1
        if calls["arrived"] > 3:  # the retry: the calls reach their steps in the reverse order
            await asyncio.sleep({"Paris": 0.06, "Oslo": 0.03}.get(call.args_as_dict()["city"], 0))
        return args

    agent = Agent(streaming(reply), name="weather", capabilities=[Hooks(before_tool_execute=arrive)])

    @agent.tool
    async def get_weather(ctx: RunContext[None], city: str) -> str:
        calls[city] += 1
        if city == "Oslo" and calls[city] == 1:
            # The others finish meanwhile: their steps are recorded before this one fails the
            # attempt (under load they could still be on their way when the run ended).
            for _ in range(1000):
                if sum(s.startswith("weather: tool") for s in steps(queue, job)) == 2:
                    break
                await asyncio.sleep(0.01)
            raise ConnectionError("the weather service hung up")
        return f"{city}: sunny"

    @queue.task(max_retries=2, backoff=QUICK_RETRY)
    async def forecast() -> str:
        return (await DurableAgent(agent).run("Weather?")).output

    job = forecast.enqueue()
    with queue.worker(**QUICK):
        assert job.result(timeout=20) == "Paris: sunny / Oslo: sunny / Lima: sunny"
    assert calls == Counter({"model 1": 1, "Paris": 1, "Oslo": 2, "Lima": 1, "model 2": 1, "arrived": 6})
    values = {row["step"]: row["value"] for row in queue.steps(job).to_dict("records")}
    assert [values[f"weather: tool get_weather {n}"]["result"] for n in (1, 2, 3)] == [
        "Paris: sunny",
        "Oslo: sunny",
        "Lima: sunny",
    ]


def test_runs_side_by_side_in_one_job_each_get_their_own_steps_back(queue: Queue) -> None:
    calls: Counter[str] = Counter()

    def reply(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        city = str(next(p.content for m in messages for p in m.parts if isinstance(p, UserPromptPart)))
        n = requests_so_far(messages)
        calls[f"{city} model {n}"] += 1
        if (city, n) == ("Oslo", 2) and not calls["failed"]:
            calls["failed"] += 1
            raise ConnectionError("the model's server hung up")
        if n == 1:
            return ModelResponse(parts=[ToolCallPart("get_weather", {"city": city}, tool_call_id="w1")])
        return ModelResponse(parts=[TextPart(f"{city}: {tool_returns(messages)[0]}")])

    async def order_the_requests(ctx: RunContext[None], request_context: Any) -> Any:
        if calls["failed"] and ctx.prompt == "Paris":
            await asyncio.sleep(0.05)  # the retry: Oslo's requests now come first
        elif ctx.prompt == "Oslo" and calls["Oslo tool"] and not calls["failed"]:
            # Paris's last request is recorded before Oslo's fails the attempt (under load it
            # could still be on its way when the attempt ended, and the retry asked again).
            for _ in range(1000):
                if "weather: model request 2" in steps(queue, job):
                    break
                await asyncio.sleep(0.01)
        return request_context

    hooks = Hooks(before_model_request=order_the_requests)
    agent = Agent(streaming(reply), name="weather", capabilities=[hooks])

    @agent.tool_plain
    def get_weather(city: str) -> str:
        calls[f"{city} tool"] += 1
        return f"sunny in {city}"

    @queue.task(max_retries=2, backoff=QUICK_RETRY)
    async def both() -> list[str]:
        durable = DurableAgent(agent)
        results = await asyncio.gather(durable.run("Paris"), durable.run("Oslo"))
        return [result.output for result in results]

    job = both.enqueue()
    with queue.worker(**QUICK):
        assert job.result(timeout=20) == ["Paris: sunny in Paris", "Oslo: sunny in Oslo"]
    assert calls == Counter(
        {"Paris model 1": 1, "Paris tool": 1, "Paris model 2": 1, "Oslo model 1": 1, "Oslo tool": 1}
        | {"Oslo model 2": 2, "failed": 1}
    )
    assert sorted(steps(queue, job)) == [
        "weather run 2: model request 1",  # Oslo's run, the second to start
        "weather run 2: model request 2",
        "weather run 2: tool get_weather 1",
        "weather: model request 1",
        "weather: model request 2",
        "weather: tool get_weather 1",
    ]


def test_a_run_records_as_gone_past_only_its_own_failures(queue: Queue) -> None:
    """Runs side by side in one job: a failure one run noted is recorded (and replayed by every
    later run of the job) only when that run starts another operation, never when the run beside
    it does. (Recorded by Paris's next request, Oslo's one ConnectionError failed every retry the
    same way and the job died: seen under load in the test above.)"""
    from nbqueue import context
    from nbqueue.integrations.pydantic_ai import engine

    oslo, paris = ("weather", "run-oslo"), ("weather", "run-paris")

    @queue.task(name="pa.own_failures")
    async def runs_side_by_side() -> list[list[str]]:
        running = context.current()
        assert running is not None
        job_id = running.job.id
        engine._note_failure(oslo, "weather run 2: model request 2", ConnectionError("hung up"), [])
        await engine._record_passed_failures(paris)  # Paris goes on: Oslo's failure stays Oslo's
        after_paris = steps(queue, queue.get(job_id))
        await engine._record_passed_failures(oslo)  # Oslo goes on past it: recorded
        return [after_paris, steps(queue, queue.get(job_id))]

    job = runs_side_by_side.enqueue()
    with queue.worker(**QUICK):
        assert job.result(timeout=20) == [[], ["weather run 2: model request 2"]]
    [row] = queue.steps(job).to_dict("records")
    assert row["value"]["failed"] == {"builtin": "ConnectionError", "args": ["hung up"]}


# -- b. a worker process killed mid-run ------------------------------------------------------------


@pytest.mark.slow  # two worker processes start; one is killed
@pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL is POSIX")
def test_an_agent_whose_worker_is_killed_goes_on_in_a_new_worker(
    queue_target: str, make_queue: MakeQueue, tmp_path: Path
) -> None:
    q = make_queue()
    marks, log = tmp_path / "marks", tmp_path / "workers.log"
    job = pydantic_ai_app.register(q).enqueue("Weather in Paris?")
    assert job.task == "pydantic_ai.forecaster"
    # (model request 2 killed its process, after those before it; a second worker recovers the job)
    done = killed_then_finished(
        q, job, queue_target, pydantic_ai_app, marks, log, ["model 1", "tool get_weather", "model 2"]
    )
    assert done.status == "completed", log.read_text()
    assert done.value == "It is sunny in Paris."
    # Nothing that finished ran again: only the request the kill interrupted.
    assert Counter(marks.read_text().splitlines()) == Counter(
        {"model 1": 1, "tool get_weather": 1, "model 2": 2}
    )
    assert outcomes(q, job) == ["lost", "completed"]
    assert steps(q, job) == [
        "forecaster: model request 1",
        "forecaster: tool get_weather 1",
        "forecaster: model request 2",
    ]
    assert "".join(job.stream(follow=False)) == "It is sunny in Paris."


# -- c. a call that needs approval: a wait, answered by q.send -------------------------------------


def files_agent(calls: Counter[str], *capabilities: AbstractCapability[None]) -> Agent[None, str]:
    """Says what it will do, asks to delete a file (a call that needs approval), then reports."""

    def reply(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        n = requests_so_far(messages)
        calls[f"model {n}"] += 1
        if n == 1:
            call = ToolCallPart("delete_file", {"path": "notes.txt"}, tool_call_id="d1")
            return ModelResponse(parts=[TextPart("Deleting notes.txt now."), call])
        return ModelResponse(parts=[TextPart(f"Result: {tool_returns(messages)[0]}")])

    agent = Agent(streaming(reply), name="files", capabilities=list(capabilities))

    @agent.tool_plain(requires_approval=True)
    def delete_file(path: str) -> str:
        calls["tool delete_file"] += 1
        return f"deleted {path}"

    return agent


@pytest.mark.parametrize("answer", ["approve", "deny"])
def test_a_call_that_needs_approval_waits_for_q_send(queue: Queue, answer: str) -> None:
    calls: Counter[str] = Counter()
    agent = DurableAgent(files_agent(calls))

    @queue.task()
    def tidy() -> str:
        return agent.run_sync("Tidy up.").output

    job = tidy.enqueue()
    with queue.worker(**QUICK):
        until_status(queue, job, "waiting")
        [row] = queue.waiting().to_dict("records")
        assert (row["id"], row["name"]) == (job.id, "delete_file")
        assert (row["prompt"], row["choices"]) == (
            'Approve delete_file(path="notes.txt")?',
            ["approve", "deny"],
        )
        assert queue.get(job.id).lease_until is None  # the wait holds no worker
        before = list(job.stream(follow=False))
        assert before == ["Deleting ", "notes.txt ", "now."]
        with pytest.raises(nbqueue.InvalidArgument):
            queue.send(job, "delete_file", "maybe")  # not one of its choices
        assert queue.send(job, "delete_file", answer) is True
        final = job.result(timeout=20)

    if answer == "approve":
        assert final == "Result: deleted notes.txt"
        assert calls == Counter({"model 1": 1, "tool delete_file": 1, "model 2": 1})
        assert steps(queue, job) == [
            "files: model request 1",
            "files: tool delete_file 1 approved",
            "files: model request 2",
        ]
    else:
        assert final == "Result: The tool call was denied."
        assert calls == Counter({"model 1": 1, "model 2": 1})  # the file stays
        assert steps(queue, job) == ["files: model request 1", "files: model request 2"]
    assert outcomes(queue, job) == ["suspended", "completed"]
    [wait] = queue.waits(job)
    assert (wait.name, wait.value) == ("delete_file", f'"{answer}"')
    # The resumed run replayed request 1 (emitting its text again under the same numbers): the
    # stream holds each item once, in order.
    assert list(job.stream(follow=False)) == [*before, *words(final)]


def test_a_tool_that_raises_approval_required_runs_again_once_approved(queue: Queue) -> None:
    calls: Counter[str] = Counter()

    def reply(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        n = requests_so_far(messages)
        calls[f"model {n}"] += 1
        if n == 1:
            return ModelResponse(parts=[ToolCallPart("refund", {"amount": 250}, tool_call_id="r1")])
        return ModelResponse(parts=[TextPart(str(tool_returns(messages)[0]))])

    agent = Agent(streaming(reply), name="shop")

    @agent.tool
    def refund(ctx: RunContext[None], amount: int) -> str:
        calls[f"refund approved={ctx.tool_call_approved}"] += 1
        if amount > 100 and not ctx.tool_call_approved:
            raise ApprovalRequired()  # large refunds need a person
        return f"refunded {amount}"

    @queue.task()
    async def serve() -> str:
        return (await DurableAgent(agent).run("Refund 250.")).output

    job = serve.enqueue()
    with queue.worker(**QUICK):
        until_status(queue, job, "waiting")
        assert list(queue.waiting()["prompt"]) == ["Approve refund(amount=250)?"]
        queue.send(job, "refund", "approve")
        assert job.result(timeout=20) == "refunded 250"
    assert calls == Counter(
        {"model 1": 1, "refund approved=False": 1, "refund approved=True": 1, "model 2": 1}
    )
    assert steps(queue, job) == [
        "shop: model request 1",
        "shop: tool refund 1",  # recorded: it asked for approval
        "shop: tool refund 1 approved",
        "shop: model request 2",
    ]


def test_an_unanswered_approval_is_denied_at_its_deadline(queue: Queue) -> None:
    calls: Counter[str] = Counter()
    agent = DurableAgent(files_agent(calls), approval_timeout=timedelta(seconds=0.3))

    @queue.task()
    def tidy() -> str:
        return agent.run_sync("Tidy up.").output

    job = tidy.enqueue()
    with queue.worker(**QUICK):
        until_status(queue, job, "waiting")
        assert job.result(timeout=20) == "Result: No one approved this call within 0.3 s."
    assert "tool delete_file" not in calls
    [wait] = queue.waits(job)
    assert wait.name == "delete_file" and wait.expired_at is not None


def test_calls_waiting_for_approval_and_for_a_result_wait_in_turn(queue: Queue) -> None:
    def reply(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if requests_so_far(messages) == 1:
            return ModelResponse(
                parts=[
                    ToolCallPart("delete_file", {"path": "a.txt"}, tool_call_id="d1"),
                    ToolCallPart("delete_file", {"path": "b.txt"}, tool_call_id="d2"),
                    ToolCallPart("ask_owner", {"question": "Keep c.txt?"}, tool_call_id="q1"),
                ]
            )
        return ModelResponse(parts=[TextPart(" | ".join(map(str, tool_returns(messages))))])

    agent = Agent(streaming(reply), name="files")

    @agent.tool_plain(requires_approval=True)
    def delete_file(path: str) -> str:
        return f"deleted {path}"

    @agent.tool_plain
    def ask_owner(question: str) -> str:
        raise CallDeferred(kind="question")  # a person answers it: the answer is the call's result

    @queue.task()
    def tidy() -> str:
        return DurableAgent(agent).run_sync("Tidy up.").output

    job = tidy.enqueue()
    asked = []
    with queue.worker(**QUICK):
        for name, answer in [("delete_file", "approve"), ("delete_file-2", "deny"), ("ask_owner", "keep it")]:
            wait_until(lambda name=name: list(queue.waiting()["name"]) == [name], 20, f"the wait {name}")
            asked.append(queue.waiting()[["prompt", "choices"]].to_dict("records")[0])
            queue.send(job, name, answer)
        assert job.result(timeout=20) == "deleted a.txt | The tool call was denied. | keep it"
    assert asked == [
        {"prompt": 'Approve delete_file(path="a.txt")?', "choices": ["approve", "deny"]},
        {"prompt": 'Approve delete_file(path="b.txt")?', "choices": ["approve", "deny"]},
        {"prompt": "Keep c.txt?", "choices": None},  # a question: its prompt is the question
    ]
    assert outcomes(queue, job) == ["suspended"] * 3 + ["completed"]


def test_a_handler_that_takes_a_resume_token_waits_for_q_send(queue: Queue) -> None:
    tokens: list[str] = []

    def hand_on(ctx: RunContext[None], requests: DeferredToolRequests, token: str) -> None:
        tokens.append(token)  # posted to a chat, say: whoever answers sends to the job

    calls: Counter[str] = Counter()
    agent = files_agent(calls, HandleDeferredToolCalls(hand_on, name="review"))

    @queue.task()
    def tidy() -> str:
        return DurableAgent(agent).run_sync("Tidy up.").output

    job = tidy.enqueue()
    with queue.worker(**QUICK):
        until_status(queue, job, "waiting")
        assert tokens == [f"{job.id}:review"]  # "JOB_ID:WAIT_NAME"
        job_id, wait = tokens[0].split(":")
        queue.send(int(job_id), wait, {"approvals": {"d1": True}})
        assert job.result(timeout=20) == "Result: deleted notes.txt"
    assert tokens == [f"{job.id}:review"]  # asked once: the resumed run replayed its step
    assert calls == Counter({"model 1": 1, "tool delete_file": 1, "model 2": 1})
    assert "files: ask review" in steps(queue, job)


def test_a_failure_the_run_went_past_fails_the_same_way_when_it_replays(queue: Queue) -> None:
    """ModelFallback asks another model when the first fails: the failure is recorded, so the run
    that resumes after the wait fails over as the first did (not asking the first model again, which
    might answer now and make the recorded steps answer other requests)."""
    calls: Counter[str] = Counter()

    def primary(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        calls[f"primary {requests_so_far(messages)}"] += 1
        if calls["primary 1"] == 1 and requests_so_far(messages) == 1:
            raise ModelHTTPError(503, "primary", {"error": "overloaded"})
        return ModelResponse(parts=[TextPart(f"primary: {tool_returns(messages)}")])

    def backup(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        calls[f"backup {requests_so_far(messages)}"] += 1
        return ModelResponse(parts=[ToolCallPart("delete_file", {"path": "a.txt"}, tool_call_id="d1")])

    backup_model = streaming(backup)
    agent = Agent(streaming(primary), name="failover", capabilities=[ModelFallback(backup_model)])

    @agent.tool_plain(requires_approval=True)
    def delete_file(path: str) -> str:
        return f"deleted {path}"

    durable = DurableAgent(agent, models={"backup": backup_model})  # a model a run may switch to

    @queue.task()
    def tidy() -> str:
        return durable.run_sync("Tidy up.").output

    job = tidy.enqueue()
    with queue.worker(**QUICK):
        until_status(queue, job, "waiting")
        queue.send(job, "delete_file", "approve")
        assert job.result(timeout=20) == "primary: ['deleted a.txt']"
    assert calls == Counter({"primary 1": 1, "backup 1": 1, "primary 2": 1})
    rows = queue.steps(job).to_dict("records")
    assert [row["step"] for row in rows] == [
        "failover: model request 1",
        "failover: model request 2",
        "failover: tool delete_file 1 approved",
        "failover: model request 3",
    ]
    assert rows[0]["value"]["failed"]["model_error"]["qualname"] == "ModelHTTPError"


# -- d. the model's text in the job's stream -------------------------------------------------------


def test_streamed_text_arrives_in_the_job_s_stream_in_order(queue: Queue) -> None:
    text = "Durable agents keep their place, even when the worker dies."
    agent = DurableAgent(Agent(streaming(lambda m, i: ModelResponse(parts=[TextPart(text)])), name="talker"))

    @queue.task()
    async def talk() -> str:
        return (await agent.run("Tell me.")).output

    @queue.task()
    async def talk_streaming() -> str:
        async with agent.run_stream("Tell me.") as result:
            return await result.get_output()

    with queue.worker(**QUICK):
        jobs = [talk.enqueue(), talk_streaming.enqueue()]
        followed = list(jobs[0].stream(timeout=20))  # live, until the job finishes
        assert [job.result(timeout=20) for job in jobs] == [text, text]
    assert followed == words(text) and len(followed) == 10
    assert list(jobs[1].stream(follow=False)) == words(text)
    assert steps(queue, jobs[0]) == ["talker: model request 1"]


def test_emit_false_makes_plain_requests_and_streams_nothing(queue: Queue) -> None:
    plain = FunctionModel(lambda m, i: ModelResponse(parts=[TextPart("plain")]))  # no stream_function
    agent = DurableAgent(Agent(plain, name="plain"), emit=False)

    @queue.task()
    def ask() -> str:
        return agent.run_sync("Hi.").output

    @queue.task()
    def ask_in_time() -> str:
        return agent.run_sync("Hi.", timeout=60).output  # counted from the run's first start

    jobs = [ask.enqueue(), ask_in_time.enqueue()]
    with queue.worker(**QUICK):
        assert [job.result(timeout=20) for job in jobs] == ["plain", "plain"]
    assert list(jobs[0].stream(follow=False)) == []
    assert steps(queue, jobs[0]) == ["plain: model request 1"]
    assert steps(queue, jobs[1]) == ["plain: run started", "plain: model request 1"]


def test_a_retry_of_a_model_request_waits_without_holding_a_worker(queue: Queue) -> None:
    calls: Counter[str] = Counter()

    def reply(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        calls["model"] += 1
        if calls["model"] == 1:
            raise ModelHTTPError.for_category(ModelUnavailableError, status_code=503, model_name="flaky")
        return ModelResponse(parts=[TextPart("back again")])

    retrying = RetryOnModelErrors(initial_delay=0.2, max_delay=0.5)
    agent = DurableAgent(Agent(streaming(reply), name="patient", capabilities=[retrying]))

    @queue.task()
    def ask() -> str:
        return agent.run_sync("Hi.").output

    job = ask.enqueue()
    with queue.worker(**QUICK):
        until_status(queue, job, "waiting")  # Pydantic AI's wait before its retry: a durable sleep
        assert queue.get(job.id).lease_until is None
        assert job.result(timeout=20) == "back again"
    assert calls["model"] == 2
    assert outcomes(queue, job) == ["suspended", "completed"]
    assert [w.name for w in queue.waits(job)] == ["patient: sleep 1"]


# -- e. outside a job, and the capability on an agent of its own --------------------------------------


def test_outside_a_job_a_durable_agent_runs_as_the_plain_agent(queue: Queue) -> None:
    calls: Counter[str] = Counter()
    plain = weather_agent(calls)
    expected = plain.run_sync("Weather in Paris?")
    durable = DurableAgent(plain)
    got = durable.run_sync("Weather in Paris?")
    assert got.output == expected.output == "The weather: sunny in Paris."
    assert [type(m) for m in got.all_messages()] == [type(m) for m in expected.all_messages()]
    assert calls == Counter({"model 1": 2, "tool get_weather": 2, "model 2": 2})
    # Also a model that cannot stream (no stream_function): nothing is streamed outside a job.
    assert (
        DurableAgent(Agent(FunctionModel(lambda m, i: ModelResponse(parts=[TextPart("hi")]))))
        .run_sync("x")
        .output
        == "hi"
    )
    assert (durable.name, durable.step_name) == ("weather", "weather")


def test_an_agent_built_with_the_capability_is_durable_in_any_job(queue: Queue) -> None:
    calls: Counter[str] = Counter()
    agent = Agent(TestModel(), name="tested", capabilities=[NbqueueDurability(emit=False)])

    @agent.tool_plain
    def lookup(key: str) -> str:
        calls[key] += 1
        return "found"

    @queue.task()
    def look() -> Any:
        return agent.run_sync("Look it up.").output

    job = look.enqueue()
    with queue.worker(**QUICK):
        assert job.result(timeout=20) == '{"lookup":"found"}'
    assert steps(queue, job) == [
        "tested: model request 1",
        "tested: tool lookup 1",
        "tested: model request 2",
    ]


def test_a_usage_mistake_inside_a_job_is_dead_at_once(queue: Queue) -> None:
    def extra(x: int) -> int:
        return x

    agent = DurableAgent(Agent(TestModel(), name="mistaken"), emit=False)

    @queue.task(max_retries=3)
    def ask() -> str:
        # A toolset given to one run only was never made durable: Pydantic AI refuses it in a job.
        return agent.run_sync("Hi.", toolsets=[FunctionToolset([extra], id="extra")]).output

    job = ask.enqueue()
    with queue.worker(**QUICK), pytest.raises(nbqueue.JobFailed, match="cannot be added at runtime"):
        job.result(timeout=20)
    assert status(queue, job) == "dead" and outcomes(queue, job) == ["dead"]  # no retry: none would help


# -- agents run as jobs without a task -------------------------------------------------------------


class Forecast(BaseModel):
    city: str
    sunny: bool


def test_enqueue_agent_runs_an_agent_as_a_job_whose_result_is_its_output(queue: Queue) -> None:
    seen: list[list[str]] = []

    def reply(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        seen.append(
            [p.content for m in messages for p in m.parts if isinstance(p, UserPromptPart | TextPart)]
        )
        return ModelResponse(
            parts=[ToolCallPart(info.output_tools[0].name, {"city": "Paris", "sunny": True})]
        )

    agent = Agent(FunctionModel(reply), name="structured", output_type=Forecast)
    history: list[ModelMessage] = [
        ModelRequest(parts=[UserPromptPart("Remember Paris.")]),
        ModelResponse(parts=[TextPart("Noted.")]),
    ]
    job = enqueue_agent(queue, DurableAgent(agent, emit=False), "And its weather?", message_history=history)
    assert job.task == "pydantic_ai.structured"
    with queue.worker(**QUICK):
        assert job.result(timeout=20) == {"city": "Paris", "sunny": True}
    assert seen == [["Remember Paris.", "Noted.", "And its weather?"]]
    # The task is registered: a worker elsewhere needs the same registration (agent_task).
    again = agent_task(queue, DurableAgent(agent, emit=False)).enqueue("Once more?")
    with queue.worker(**QUICK):
        assert again.result(timeout=20) == {"city": "Paris", "sunny": True}


# -- f. bad input ----------------------------------------------------------------------------------


def test_what_is_not_an_agent_or_not_json_is_refused(queue: Queue) -> None:
    agent = Agent(TestModel(), name="ok")
    with pytest.raises(nbqueue.InvalidArgument, match="Pydantic AI agent"):
        DurableAgent("openai:gpt-5.2")  # type: ignore[arg-type]
    with pytest.raises(nbqueue.InvalidArgument, match="durable already"):
        DurableAgent(DurableAgent(agent))
    with pytest.raises(nbqueue.InvalidArgument, match="durable already"):
        DurableAgent(Agent(TestModel(), name="held", capabilities=[NbqueueDurability()]))
    with pytest.raises(nbqueue.InvalidArgument, match="name"):
        DurableAgent(agent, name="")
    with pytest.raises(nbqueue.InvalidArgument, match="approval_timeout"):
        DurableAgent(agent, approval_timeout="a day")  # type: ignore[arg-type]
    with pytest.raises(nbqueue.InvalidArgument, match="needs a name"):
        agent_task(queue, Agent(TestModel()))  # unnamed: its task could be taken for another's
    with pytest.raises(nbqueue.InvalidArgument, match="prompt is text"):
        enqueue_agent(queue, agent, {"text": "hi"})  # type: ignore[arg-type]
    with pytest.raises(nbqueue.InvalidArgument, match="message_history"):
        enqueue_agent(queue, agent, "hi", message_history=["not a message"])  # type: ignore[list-item]
    assert queue.jobs() == []  # nothing was enqueued


def test_a_function_model_that_cannot_stream_runs_in_a_job_without_emitting(queue: Queue) -> None:
    """A FunctionModel given no stream_function cannot make streamed requests: its run in a job
    makes plain ones and emits nothing, rather than failing every attempt."""
    agent = DurableAgent(
        Agent(FunctionModel(lambda m, i: ModelResponse(parts=[TextPart("hi")])), name="plain")
    )

    @queue.task(name="pa.plain", max_retries=0)
    def hello(prompt: str) -> str:
        return agent.run_sync(prompt).output

    job = hello.enqueue("x")
    with queue.worker():
        assert job.result(timeout=20) == "hi"
    assert list(job.stream(follow=False)) == []
    assert list(queue.steps(job)["step"]) == ["plain: model request 1"]
