"""Compiled LangGraph graphs run as nbqueue jobs, on both backends: graph_task and enqueue_graph
(the contract: docs AGENTS.md, "Agent frameworks on nbqueue").

An interrupt becomes a wait named after its node and q.send resumes it; a retried or recovered
run goes on from the thread's last checkpoint (no finished node runs again); what the graph
streams goes into the job's stream; a thread's later jobs see its state. Real LangGraph (offline:
langchain_core's fake chat model), real worker threads, a real worker process killed with
SIGKILL, real SQLite files and the real PostgreSQL server.
"""

from __future__ import annotations

import dataclasses
import itertools
import operator
import sys
import threading
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.config import get_stream_writer
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.types import interrupt

import nbqueue
from nbqueue import Queue
from nbqueue.integrations.langgraph import QueueSaver, UnsafeCheckpoint, enqueue_graph, graph_task
from tests import langgraph_app
from tests.helpers import (
    QUICK,
    QUICK_RETRY,
    MakeQueue,
    killed_then_finished,
    raw_rows,
    status,
    until_status,
    wait_until,
)

ROOT = Path(__file__).resolve().parents[1]


def chain(schema: Any, *nodes: tuple[str, Any]) -> StateGraph[Any]:
    """A graph builder whose nodes, (name, function) each, run one after another."""
    builder = StateGraph(schema)
    for name, run in nodes:
        builder.add_node(name, run)
    for before, after in itertools.pairwise([START, *(name for name, _ in nodes), END]):
        builder.add_edge(before, after)
    return builder


def waiting_names(q: Queue) -> list[str]:
    return [str(name) for name in q.waiting()["name"]]


def outcomes(q: Queue, job: nbqueue.Job) -> list[str]:
    return list(q.attempts(job)["outcome"])


class Draft(TypedDict):
    draft: str
    log: Annotated[list[str], operator.add]
    verdict: str


# -- 1. an interrupt answered by q.send ----------------------------------------------------------


def test_an_interrupt_waits_for_its_node_and_a_send_resumes_the_graph(queue: Queue) -> None:
    calls: Counter[str] = Counter()

    def write(state: Draft) -> dict[str, Any]:
        calls["write"] += 1
        return {"draft": "hello", "log": ["wrote"]}

    def review(state: Draft) -> dict[str, Any]:
        calls["review"] += 1  # LangGraph runs an interrupted node again from its top on resume
        answer = interrupt({"prompt": f"Publish {state['draft']}?", "choices": ["approve", "reject"]})
        return {"verdict": answer, "log": ["reviewed"]}

    def post(state: Draft) -> dict[str, Any]:
        calls["post"] += 1
        return {"log": ["posted"]}

    builder = chain(Draft, ("write", write), ("review", review), ("post", post))
    job = enqueue_graph(queue, builder.compile(name="publisher"), {"draft": "", "log": []})
    assert job.task == "langgraph.publisher"

    with queue.worker(**QUICK):
        until_status(queue, job, "waiting")
        [row] = queue.waiting().to_dict("records")
        assert (row["id"], row["task"], row["name"]) == (job.id, "langgraph.publisher", "review")
        assert (row["prompt"], row["choices"]) == ("Publish hello?", ["approve", "reject"])
        assert queue.get(job.id).lease_until is None  # the wait holds no worker
        before = list(job.stream(follow=False))
        assert before[0] == {"write": {"draft": "hello", "log": ["wrote"]}}
        assert [i["value"] for i in before[1]["__interrupt__"]] == [
            {"prompt": "Publish hello?", "choices": ["approve", "reject"]}
        ]
        assert len(before) == 2
        with pytest.raises(nbqueue.InvalidArgument):
            queue.send(job, "review", "maybe")  # not one of the interrupt's choices
        assert status(queue, job) == "waiting"
        assert queue.send(job, "review", "approve") is True
        final = job.result(timeout=20)

    assert final == {"draft": "hello", "log": ["wrote", "reviewed", "posted"], "verdict": "approve"}
    assert calls == Counter({"write": 1, "review": 2, "post": 1})
    items = list(job.stream(follow=False))
    # The resumed run's updates follow the first run's, none of them twice.
    assert items == [
        *before,
        {"review": {"verdict": "approve", "log": ["reviewed"]}},
        {"post": {"log": ["posted"]}},
    ]
    assert outcomes(queue, job) == ["suspended", "completed"]
    assert queue.get(job.id).retries == 0
    [wait] = queue.waits(job)
    assert (wait.name, wait.value) == ("review", '"approve"')


# -- 2. a transient error, retried by nbqueue ----------------------------------------------------


class Chain(TypedDict):
    trail: Annotated[list[str], operator.add]


def test_a_retried_run_goes_on_from_the_last_checkpoint(queue: Queue) -> None:
    calls: Counter[str] = Counter()

    def node(name: str) -> Any:
        def run(state: Chain) -> dict[str, Any]:
            calls[name] += 1
            return {"trail": [name]}

        return run

    async def flaky(state: Chain) -> dict[str, Any]:  # an async node: graphs run with astream
        calls["b"] += 1
        if calls["b"] == 1:
            raise ConnectionError("the model's server hung up")  # once: the retry succeeds
        return {"trail": ["b"]}

    builder = chain(Chain, ("a", node("a")), ("b", flaky), ("c", node("c")))
    job = enqueue_graph(
        queue, builder.compile(name="chain"), {"trail": []}, max_retries=2, backoff=QUICK_RETRY
    )
    with queue.worker(**QUICK):
        assert job.result(timeout=20) == {"trail": ["a", "b", "c"]}
    assert calls == Counter({"a": 1, "b": 2, "c": 1})  # "a" finished before the error: not again
    assert outcomes(queue, job) == ["failed", "completed"]
    # A retry starts a new stream: each attempt holds what its own run streamed.
    assert list(job.stream(follow=False, attempt=1)) == [{"a": {"trail": ["a"]}}]
    assert list(job.stream(follow=False)) == [{"b": {"trail": ["b"]}}, {"c": {"trail": ["c"]}}]


# -- 3. the same node interrupting again ---------------------------------------------------------


class Rounds(TypedDict):
    rounds: int
    answers: Annotated[list[str], operator.add]


def review_loop(times: int, on_work: Any = None) -> Any:
    """work -> review -> work ... `times` reviews; the interrupt asks a "question", no choices."""

    def work(state: Rounds) -> dict[str, Any]:
        if on_work is not None:
            on_work(state["rounds"])
        return {"rounds": state["rounds"] + 1}

    def review(state: Rounds) -> dict[str, Any]:
        return {"answers": [interrupt({"question": f"Round {state['rounds']}: ok?"})]}

    builder = StateGraph(Rounds)
    builder.add_node("work", work)
    builder.add_node("review", review)
    builder.add_edge(START, "work")
    builder.add_edge("work", "review")
    builder.add_conditional_edges("review", lambda s: END if s["rounds"] >= times else "work")
    return builder.compile(name="rounds")


def test_a_node_that_interrupts_twice_waits_under_a_new_name_each_time(queue: Queue) -> None:
    job = enqueue_graph(queue, review_loop(2), {"rounds": 0, "answers": []})
    with queue.worker(**QUICK):
        until_status(queue, job, "waiting")
        assert waiting_names(queue) == ["review"]
        assert list(queue.waiting()["prompt"]) == ["Round 1: ok?"]
        assert queue.send(job, "review", "first") is True
        wait_until(lambda: waiting_names(queue) == ["review-2"], 20, "the second wait")
        assert list(queue.waiting()["prompt"]) == ["Round 2: ok?"]
        with pytest.raises(nbqueue.InvalidArgument):
            queue.send(job, "review", "again")  # the first wait's answer is recorded already
        assert queue.send(job, "review-2", "second") is True
        assert job.result(timeout=20) == {"rounds": 2, "answers": ["first", "second"]}
    assert [(w.name, w.value) for w in queue.waits(job)] == [("review", '"first"'), ("review-2", '"second"')]
    assert outcomes(queue, job) == ["suspended", "suspended", "completed"]


def test_a_value_sent_ahead_of_an_interrupt_is_kept_for_its_wait(queue: Queue, gate: threading.Event) -> None:
    in_third = threading.Event()

    def on_work(rounds: int) -> None:
        if rounds == 2:  # the third round's work is held: the job is running, not yet at "review-3"
            in_third.set()
            assert gate.wait(20)

    job = enqueue_graph(queue, review_loop(3, on_work), {"rounds": 0, "answers": []})
    assert queue.send(job, "review", "sent while pending") is False  # kept for its wait
    with queue.worker(**QUICK):
        # The first interrupt took the kept value without waiting; the second has none.
        until_status(queue, job, "waiting")
        assert waiting_names(queue) == ["review-2"]
        assert queue.send(job, "review-2", "sent while waiting") is True
        assert in_third.wait(20)
        assert status(queue, job) == "running"
        assert queue.send(job, "review-3", "sent while running") is False
        gate.set()
        final = job.result(timeout=20)
    assert final["answers"] == ["sent while pending", "sent while waiting", "sent while running"]
    assert [w.name for w in queue.waits(job)] == ["review", "review-2", "review-3"]  # no name skipped
    assert outcomes(queue, job) == ["suspended", "completed"]  # it waited only for "review-2"


# -- 4. stream modes -----------------------------------------------------------------------------


class Thought(TypedDict):
    x: int


def test_several_stream_modes_become_mode_and_data_items(queue: Queue) -> None:
    def think(state: Thought) -> dict[str, Any]:
        write = get_stream_writer()
        write({"progress": 0.5})
        write("almost")
        return {"x": state["x"] + 1}

    builder = chain(Thought, ("think", think))
    job = enqueue_graph(queue, builder.compile(name="thinker"), {"x": 1}, stream_mode=["updates", "custom"])
    with queue.worker(**QUICK):
        assert job.result(timeout=20) == {"x": 2}
    assert list(job.stream(follow=False)) == [
        ["custom", {"progress": 0.5}],
        ["custom", "almost"],
        ["updates", {"think": {"x": 2}}],
    ]


class Chat(TypedDict):
    messages: Annotated[list[Any], add_messages]


def test_messages_mode_streams_the_models_tokens(queue: Queue) -> None:
    answer = "Durable agents keep their place, even when the worker dies."
    model = GenericFakeChatModel(messages=iter([AIMessage(content=answer)]))  # offline, splits on spaces

    def chat(state: Chat) -> dict[str, Any]:
        return {"messages": [model.invoke(state["messages"])]}

    builder = chain(Chat, ("chat", chat))
    question = {"messages": [{"role": "user", "content": "What do durable agents do?"}]}
    job = enqueue_graph(queue, builder.compile(name="chatter"), question, stream_mode="messages")
    with queue.worker(**QUICK):
        final = job.result(timeout=20)
    tokens = list(job.stream(follow=False))
    assert len(tokens) > 5 and all(isinstance(t, str) for t in tokens)  # token by token, as text
    assert "".join(tokens) == answer
    assert [(m["type"], m["content"]) for m in final["messages"]] == [
        ("human", "What do durable agents do?"),
        ("ai", answer),
    ]


# -- 5. a conversation: jobs on one thread -------------------------------------------------------


def test_jobs_on_one_thread_see_the_state_the_earlier_ones_left(queue: Queue) -> None:
    def echo(state: Chain) -> dict[str, Any]:
        return {"trail": [f"seen {len(state['trail'])}"]}

    builder = chain(Chain, ("echo", echo))
    graph = builder.compile(name="echo")
    with queue.worker(**QUICK):
        first = enqueue_graph(queue, graph, {"trail": ["hello"]}, thread_id="conversation-1")
        assert first.result(timeout=20) == {"trail": ["hello", "seen 1"]}
        second = enqueue_graph(queue, graph, {"trail": ["again"]}, thread_id="conversation-1")
        assert second.result(timeout=20) == {"trail": ["hello", "seen 1", "again", "seen 3"]}
        other = enqueue_graph(queue, graph, {"trail": ["elsewhere"]}, thread_id="conversation-2")
        assert other.result(timeout=20) == {"trail": ["elsewhere", "seen 1"]}
        # Without a thread_id each job has a thread of its own.
        alone = [enqueue_graph(queue, graph, {"trail": ["x"]}) for _ in range(2)]
        assert [j.result(timeout=20) for j in alone] == [{"trail": ["x", "seen 1"]}] * 2


# -- 6. a worker process killed mid-graph --------------------------------------------------------


@pytest.mark.slow  # two worker processes start; one is killed
@pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL is POSIX")
def test_a_graph_whose_worker_is_killed_goes_on_in_a_new_worker(
    queue_target: str, make_queue: MakeQueue, tmp_path: Path
) -> None:
    q = make_queue()
    marks, log = tmp_path / "marks", tmp_path / "workers.log"
    job = langgraph_app.register(q).enqueue({"trail": [], "total": 0})
    # (node n3 killed its process, after those before it; a second worker recovers the job)
    done = killed_then_finished(q, job, queue_target, langgraph_app, marks, log, ["n1", "n2", "n3"])
    assert done.status == "completed", log.read_text()
    assert done.value == {"trail": ["n1", "n2", "n3", "n4"], "total": 1111}
    assert Counter(marks.read_text().splitlines()) == Counter({"n1": 1, "n2": 1, "n3": 2, "n4": 1})
    assert outcomes(q, job) == ["lost", "completed"]  # the killed run, then the recovered one
    # The recovered run streamed only what it ran itself: n3 (again) and n4.
    assert list(job.stream(follow=False)) == [
        {"n3": {"trail": ["n3"], "total": 111}},
        {"n4": {"trail": ["n4"], "total": 1111}},
    ]


# -- 7. retention through graph_task -------------------------------------------------------------


class Count(TypedDict):
    n: int


def test_keep_last_leaves_that_many_checkpoints_of_a_long_thread(
    queue: Queue, queue_target: str, backend: str
) -> None:
    builder = StateGraph(Count)
    builder.add_node("step", lambda s: {"n": s["n"] + 1})
    builder.add_edge(START, "step")
    builder.add_conditional_edges("step", lambda s: END if s["n"] >= 20 else "step")
    graph = builder.compile(name="counter")
    job = enqueue_graph(queue, graph, {"n": 0}, thread_id="long", keep_last=3, recursion_limit=40)
    with queue.worker(**QUICK):
        assert job.result(timeout=30) == {"n": 20}
    rows = raw_rows(queue_target, backend, "SELECT thread, COUNT(*) FROM nbqueue_checkpoints GROUP BY thread")
    # 22 checkpoints were written (the input, then one per step); the job has finished, so none
    # of them is still needed but the newest keep_last.
    assert rows == [("long", 3)]
    # What is kept is the thread's end: its state reads back whole.
    kept = graph.copy(update={"checkpointer": QueueSaver(queue)}).get_state(
        {"configurable": {"thread_id": "long"}}
    )
    assert kept.values == {"n": 20} and kept.next == ()


# -- 8. bad input --------------------------------------------------------------------------------


def test_what_is_not_a_compiled_graph_or_not_json_is_refused(queue: Queue) -> None:
    builder = chain(Chat, ("chat", lambda s: {"messages": []}))
    with pytest.raises(nbqueue.InvalidArgument, match="compiled graph"):
        graph_task(queue, builder)  # the builder, not builder.compile()
    with pytest.raises(nbqueue.InvalidArgument, match="compiled graph"):
        enqueue_graph(queue, lambda state: state, {})
    with pytest.raises(nbqueue.PayloadError):
        enqueue_graph(queue, builder.compile(name="chat"), {"messages": [HumanMessage("hi")]})
    assert queue.jobs() == []  # nothing was enqueued
    assert sum(queue.counts().values()) == 0


def one_node(node: str, value: str) -> Any:
    # Unnamed: LangGraph calls every such graph "LangGraph".
    return chain(Draft, (node, lambda s: {"draft": value})).compile()


def test_two_unnamed_graphs_are_not_taken_for_one(queue: Queue) -> None:
    first = enqueue_graph(queue, one_node("a", "one"), {"draft": "", "log": []})
    again = enqueue_graph(queue, one_node("a", "one again"), {"draft": "", "log": []})  # redefined: replaces
    with pytest.raises(
        nbqueue.InvalidArgument, match=r"nodes __start__, a\) already runs as 'langgraph.LangGraph'"
    ):
        enqueue_graph(queue, one_node("b", "two"), {"draft": "", "log": []})
    named = enqueue_graph(queue, one_node("b", "two"), {"draft": "", "log": []}, name="other")
    with queue.worker(**QUICK):
        assert named.result(timeout=20)["draft"] == "two"
        assert first.result(timeout=20)["draft"] == "one again"  # the newer definition ran
        assert again.result(timeout=20)["draft"] == "one again"  # (waited for: none is left running)
    assert queue.counts()["pending"] == 0


# -- an interrupt's deadline, and what the board shows of a graph job ------------------------------


def test_an_interrupt_with_a_timeout_and_default_takes_the_default_at_its_deadline(queue: Queue) -> None:
    def review(state: Draft) -> dict[str, Any]:
        answer = interrupt({"prompt": "Publish?", "choices": ["approve", "reject"], "timeout": 0.3,
                            "default": "reject"})  # fmt: skip
        return {"verdict": answer}

    builder = chain(Draft, ("review", review))
    job = enqueue_graph(queue, builder.compile(name="deadline"), {"draft": "", "log": []})
    with queue.worker(**QUICK):
        until_status(queue, job, "waiting")
        [row] = queue.waiting().to_dict("records")
        assert row["deadline"] - row["since"] <= timedelta(seconds=1)
        assert job.result(timeout=20)["verdict"] == "reject"  # woken at its deadline: the default
    [wait] = queue.waits(job)
    assert wait.name == "review" and wait.expired_at is not None and wait.value is None


def test_the_board_shows_a_graph_job_s_question_without_its_bookkeeping_steps(queue: Queue) -> None:
    from nbqueue.jupyter.waits import entry_html

    def review(state: Draft) -> dict[str, Any]:
        return {"verdict": interrupt("Ship it?")}

    builder = chain(Draft, ("review", review))
    job = enqueue_graph(queue, builder.compile(name="ship"), {"draft": "", "log": []})
    with queue.worker(**QUICK):
        until_status(queue, job, "waiting")
    steps = queue.step_rows(job)
    assert {s.name for s in steps} >= {"langgraph: thread before this job"}  # recorded ...
    [wait] = queue.waits(job)
    html = entry_html(queue.get(job.id), wait, steps, queue.manager.now_us())
    assert "Ship it?" in html and "review" in html
    assert "langgraph:" not in html  # ... but not shown as what the job knows


@dataclasses.dataclass
class Note:
    text: str


class Noted(TypedDict):
    note: Note
    ok: str


def test_a_graph_s_own_state_types_are_built_again_after_a_wait(queue: Queue) -> None:
    """The saver builds no class it was not told of; the types a graph's schemas name are its
    own, so graph_task tells it (else the resumed run could not read its own checkpoint)."""
    builder = chain(Noted, ("a", lambda s: {"note": Note("hi")}), ("b", lambda s: {"ok": interrupt("ok?")}))
    job = enqueue_graph(queue, builder.compile(name="notes"), {"ok": ""})
    with queue.worker(**QUICK):
        until_status(queue, job, "waiting")
        queue.send(job, "b", "yes")
        assert job.result(timeout=20) == {"note": {"text": "hi"}, "ok": "yes"}
    with pytest.raises(UnsafeCheckpoint, match="Note"):  # a saver not told of Note builds none
        QueueSaver(queue).get_tuple({"configurable": {"thread_id": f"nbqueue-job-{job.id}"}})
