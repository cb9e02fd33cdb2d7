"""The job state machine: every pair of states is either a legal transition or refused."""

from __future__ import annotations

import itertools

import pytest

import nbqueue
from nbqueue.jobs import CLAIMABLE, FINISHED, TRANSITIONS, UNFINISHED, State, check_transition

S = State
LEGAL = {
    (S.PENDING, S.RUNNING): "claim",
    (S.FAILED, S.RUNNING): "claim",
    (S.RUNNING, S.COMPLETED): "complete",
    (S.RUNNING, S.FAILED): "fail",
    (S.RUNNING, S.DEAD): "fail",
    (S.RUNNING, S.PENDING): "release",
    (S.RUNNING, S.CANCELLED): "cancel",
    (S.PENDING, S.CANCELLED): "cancel",
    (S.FAILED, S.CANCELLED): "cancel",
    (S.DEAD, S.PENDING): "requeue",
    (S.CANCELLED, S.PENDING): "requeue",
    (S.COMPLETED, S.PENDING): "replay",
    (S.BLOCKED, S.PENDING): "unblock",
    (S.BLOCKED, S.UPSTREAM_FAILED): "doom",
    (S.BLOCKED, S.CANCELLED): "cancel",
    (S.UPSTREAM_FAILED, S.BLOCKED): "requeue",
    (S.UPSTREAM_FAILED, S.PENDING): "requeue",
    (S.CANCELLED, S.BLOCKED): "requeue",
    (S.PENDING, S.BLOCKED): "rearm",
    (S.RUNNING, S.WAITING): "suspend",
    (S.WAITING, S.PENDING): "wake",
    (S.WAITING, S.UPSTREAM_FAILED): "doom",
    (S.WAITING, S.CANCELLED): "cancel",
}
ALL_PAIRS = list(itertools.product(State, State))
ILLEGAL = [pair for pair in ALL_PAIRS if pair not in LEGAL]


def test_nine_states() -> None:
    assert [s.value for s in State] == [
        "pending",
        "running",
        "completed",
        "failed",
        "dead",
        "cancelled",
        "blocked",
        "upstream_failed",
        "waiting",
    ]


def test_transition_table_is_the_documented_one() -> None:
    assert TRANSITIONS == LEGAL


def test_state_groups() -> None:
    assert set(CLAIMABLE) == {S.PENDING, S.FAILED}
    assert set(UNFINISHED) == {S.PENDING, S.FAILED, S.RUNNING, S.BLOCKED, S.WAITING}
    assert set(FINISHED) == {S.COMPLETED, S.DEAD, S.CANCELLED, S.UPSTREAM_FAILED}


@pytest.mark.parametrize(("current", "target"), list(LEGAL), ids=lambda s: s.value)
def test_legal_transition_passes(current: State, target: State) -> None:
    check_transition(1, current, target)  # does not raise
    check_transition(1, current.value, target.value)  # plain strings too
    assert TRANSITIONS[(current, target)] == LEGAL[(current, target)]


@pytest.mark.parametrize(("current", "target"), ILLEGAL, ids=lambda s: s.value)
def test_illegal_transition_raises(current: State, target: State) -> None:
    with pytest.raises(nbqueue.InvalidTransition) as info:
        check_transition(7, current, target)
    message = str(info.value)
    assert "7" in message and current.value in message and target.value in message
    assert isinstance(info.value, nbqueue.NbqueueError)


def test_every_pair_is_covered() -> None:
    assert len(LEGAL) + len(ILLEGAL) == len(State) ** 2 == 81


@pytest.mark.parametrize("state", list(FINISHED), ids=lambda s: s.value)
def test_finished_states_never_move_by_themselves(state: State) -> None:
    # Only a human requeue (or a replay of a completed job's steps) takes a job out of a finished state.
    assert all(verb in ("requeue", "replay") for (a, _), verb in TRANSITIONS.items() if a == state)


@pytest.mark.parametrize(
    ("current", "target", "said"),
    [
        (
            S.COMPLETED,
            S.CANCELLED,
            "job 5 is completed: only pending, failed, blocked, running or waiting jobs can be cancelled",
        ),
        (
            S.DEAD,
            S.CANCELLED,
            "job 5 is dead: only pending, failed, blocked, running or waiting jobs can be cancelled",
        ),
        (S.PENDING, S.COMPLETED, "job 5 is pending: only running jobs can be completed"),
        (S.DEAD, S.RUNNING, "job 5 is dead: only pending or failed jobs can start running"),
    ],
)
def test_an_illegal_transition_names_the_states_it_is_allowed_from(
    current: State, target: State, said: str
) -> None:
    with pytest.raises(nbqueue.InvalidTransition) as info:
        check_transition(5, current, target)
    message = str(info.value)
    assert message.startswith(said)
    assert "may become" not in message and "nothing" not in message


def test_attempts_read_as_attempt_k_of_n(queue: nbqueue.Queue) -> None:
    """One vocabulary: "attempt k of n", n = max_retries + 1, through a job's whole life."""
    from nbqueue.jobs import attempt_text

    job = queue.enqueue({"n": 1}, max_retries=3)
    assert attempt_text(queue.get(job.id)) == "next: attempt 1 of 4"
    claim = queue.claim(lease=60)
    assert claim is not None and attempt_text(claim) == "attempt 1 of 4"
    queue.fail(claim, "broke")
    assert attempt_text(queue.get(job.id)) == "attempt 1 of 4 failed"
    queue.cancel(job.id)  # cancelled while waiting for attempt 2: attempt 1 was its last
    assert attempt_text(queue.get(job.id)) == "attempt 1 of 4"

    once = queue.enqueue({"n": 2}, max_retries=0)
    claim = queue.claim(lease=60)
    assert claim is not None and claim.id == once.id
    queue.fail(claim, "broke")
    assert attempt_text(queue.get(once.id)) == "attempt 1 of 1"  # dead
    queue.requeue([once.id])
    assert attempt_text(queue.get(once.id)) == "next: attempt 1 of 1"

    never = queue.enqueue({"n": 3})
    queue.cancel(never.id)
    assert attempt_text(queue.get(never.id)).startswith("never run")
