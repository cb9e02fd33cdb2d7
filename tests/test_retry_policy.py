"""What is worth retrying: retry_on / give_up_on, errors no retry can mend, and snoozes.

Snoozes (nbqueue.RetryAfter, an HTTP 429/503 with Retry-After) run a job again later
without spending an attempt, and an HTTP one pauses the job's limit keys. The HTTP
errors here have the shape httpx, requests and the OpenAI and Anthropic clients raise:
`error.response.status_code` and `error.response.headers`. Both backends.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from typing import Any

import pytest

import nbqueue
from nbqueue import Backoff, Queue, RetryAfter
from nbqueue.retry import retry_after
from tests.helpers import wait_until

NOW = Backoff(base=0, cap=0, jitter=0)  # retries due at once


class Response:
    """What an HTTP client's error carries."""

    def __init__(self, status: int, headers: dict[str, str]) -> None:
        self.status_code = status
        self.headers = headers


class HTTPStatusError(Exception):
    def __init__(self, status: int, headers: dict[str, str]) -> None:
        super().__init__(f"{status} from the API")
        self.response = Response(status, headers)


def run(queue: Queue, job: nbqueue.Job) -> nbqueue.Job:
    queue.worker(lease=10).run_until_idle(timeout=30)
    return queue.get(job.id)


def test_give_up_on_is_dead_at_once_and_wins_over_retry_on(queue: Queue) -> None:
    @queue.task(name="rp.bad_input", max_retries=5, retry_on=(ValueError,), give_up_on=(KeyError,))
    def bad_input() -> None:
        raise KeyError("no such field")

    done = run(queue, bad_input.enqueue())
    assert (done.status, done.attempts) == ("dead", 1)
    assert "KeyError" in (done.error or "")


def test_retry_on_retries_only_those_errors(queue: Queue) -> None:
    calls: list[str] = []

    @queue.task(name="rp.flaky", max_retries=3, backoff=NOW, retry_on=(ConnectionError,))
    def flaky(kind: str) -> str:
        calls.append(kind)
        if kind == "network" and calls.count(kind) < 3:
            raise ConnectionError("reset")
        if kind == "bug":
            raise ValueError("a bug")
        return "ok"

    network, bug = flaky.enqueue("network"), flaky.enqueue("bug")
    queue.worker(lease=10).run_until_idle(timeout=30)
    assert queue.get(network.id).value == "ok" and queue.get(network.id).retries == 2
    assert (queue.get(bug.id).status, queue.get(bug.id).attempts) == ("dead", 1)


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_the_task_s_retry_policy_holds_in_either_mode(queue: Queue, mode: str) -> None:
    """A process-mode child decides it where the error is still an object (its parent gets text):
    give_up_on and errors outside retry_on are dead at once there too."""

    @queue.task(
        name=f"rp.policy.{mode}",
        max_retries=3,
        backoff=NOW,
        retry_on=(ConnectionError,),
        give_up_on=(KeyError,),
    )
    def policy(kind: str) -> str:
        if kind == "give up":
            raise KeyError("no such field")
        if kind == "not listed":
            raise ValueError("a bug")
        raise ConnectionError("reset")

    given_up, unlisted, retried = (policy.enqueue(k) for k in ("give up", "not listed", "network"))
    queue.worker(lease=10, mode=mode).run_until_idle(timeout=60)
    assert [(queue.get(j.id).status, queue.get(j.id).attempts) for j in (given_up, unlisted, retried)] == [
        ("dead", 1),
        ("dead", 1),
        ("dead", 4),
    ]


def test_a_type_error_inside_the_handler_is_retried_but_a_call_that_cannot_bind_is_not(queue: Queue) -> None:
    @queue.task(name="rp.inner_type_error", max_retries=2, backoff=NOW)
    def inner(x: int) -> int:
        return x + "1"  # type: ignore[operator]  # an ordinary bug: retried

    @queue.task(name="rp.two_args", max_retries=5, backoff=NOW)
    def two(a: int, b: int) -> int:
        return a + b

    retried = inner.enqueue(1)
    unbindable = two.schedule(args=(1, 2, 3))
    queue.worker(lease=10).run_until_idle(timeout=30)
    assert queue.get(retried.id).attempts == 3 and queue.get(retried.id).status == "dead"
    done = queue.get(unbindable.id)
    assert (done.status, done.attempts) == ("dead", 1)
    assert "Unretryable" in (done.error or "") and "do not fit" in (done.error or "")


def test_a_result_that_is_not_json_is_dead_after_one_run(queue: Queue) -> None:
    @queue.task(name="rp.object", max_retries=5, backoff=NOW)
    def gives_an_object() -> object:
        return object()

    done = run(queue, gives_an_object.enqueue())
    assert (done.status, done.attempts) == ("dead", 1)
    assert "not JSON" in (done.error or "")


def test_retry_after_snoozes_without_spending_an_attempt(
    clocked_queue: Queue, clock: nbqueue.ManualClock
) -> None:
    q = clocked_queue
    job = q.enqueue({"n": 1}, max_retries=0)
    claim = q.claim()
    assert claim is not None
    assert q.fail(claim, RetryAfter(30, "busy")) == "snooze"
    snoozed = q.get(job.id)
    assert (snoozed.status, snoozed.retries, snoozed.snoozes) == ("pending", 0, 1)
    assert snoozed.run_at == q.now() + timedelta(seconds=30)
    assert "snoozed" in (snoozed.error or "")
    assert q.claim() is None
    clock.advance(30)
    again = q.claim()
    assert again is not None and again.id == job.id
    q.complete(again, "done")  # max_retries=0, yet it ran twice: a snooze is no attempt


def test_a_429_with_an_http_date_pauses_the_key_and_spends_no_attempt(
    clocked_queue: Queue, clock: nbqueue.ManualClock
) -> None:
    """The queue's clock, not the test, waits out the two seconds the server asks for (and
    q.limits() reads the pause on that clock)."""
    queue = clocked_queue
    queue.limit("api", concurrency=10)
    calls: list[int] = []

    @queue.task(name="rp.rate_limited", max_retries=0, limits=["api"])
    def rate_limited() -> str:
        calls.append(1)
        if len(calls) == 1:
            when = datetime.now(UTC) + timedelta(seconds=2)  # a server's date: the wall clock's
            raise HTTPStatusError(429, {"retry-after": format_datetime(when, usegmt=True)})
        return "ok"

    @queue.task(name="rp.same_key", limits=["api"])
    def same_key() -> str:
        return "waited"

    job = rate_limited.enqueue()
    with queue.worker(lease=10, idle_interval=0.05):
        wait_until(lambda: queue.get(job.id).snoozes == 1, 10, "the 429 snoozing the job")
        row = queue.limits().set_index("key").loc["api"]
        assert row["paused_until"] is not None and "429" in str(row["paused_why"])
        other = same_key.enqueue()
        assert queue.get(other.id).status == "pending"  # the key is paused: it waits
        clock.advance(2)  # the two seconds the server named, on the queue's clock
        assert job.result(timeout=15) == "ok"
        assert other.result(timeout=15) == "waited"
    done = queue.get(job.id)
    assert (done.retries, done.snoozes, done.attempts) == (0, 1, 2)


@pytest.mark.parametrize(
    ("status", "headers", "seconds"),
    [
        (429, {"retry-after": "7"}, 7.0),
        (503, {"Retry-After": "2.5"}, 2.5),
        (429, {"retry-after-ms": "1500", "retry-after": "9"}, 1.5),
        (429, {"retry-after": "-5"}, 1.0),  # below one second counts as one second
        (429, {}, None),  # no delay named: an ordinary failure
        (500, {"retry-after": "7"}, None),  # not a 429 or 503
        (429, {"retry-after": "soon"}, None),
    ],
)
def test_retry_after_headers(status: int, headers: dict[str, str], seconds: float | None) -> None:
    found = retry_after(HTTPStatusError(status, headers))
    assert (None if found is None else found.seconds) == seconds
    if found is not None:
        assert found.pause_limits


def test_a_wrapped_http_error_is_found_through_its_cause() -> None:
    try:
        try:
            raise HTTPStatusError(429, {"retry-after": "3"})
        except HTTPStatusError as inner:
            raise RuntimeError("the client gave up") from inner
    except RuntimeError as outer:
        found = retry_after(outer)
    assert found is not None and found.seconds == 3.0


def test_a_hundred_snoozes_are_dead(clocked_queue: Queue, clock: nbqueue.ManualClock) -> None:
    q = clocked_queue
    job = q.enqueue({"n": 1}, max_retries=5)
    verdicts: list[Any] = []
    for _ in range(101):
        claim = q.claim()
        assert claim is not None
        verdicts.append(q.fail(claim, RetryAfter(1)))
        clock.advance(1)
        if verdicts[-1] == "dead":
            break
    assert verdicts.count("snooze") == 100 and verdicts[-1] == "dead"
    assert "snoozed too often" in (q.get(job.id).error or "")


def test_retry_after_refuses_nonsense() -> None:
    for bad in (-1, float("nan"), "30", 10**9):
        with pytest.raises(nbqueue.InvalidArgument):
            RetryAfter(bad)  # type: ignore[arg-type]
