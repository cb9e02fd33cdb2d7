"""Dependencies between jobs: when a blocked child may run, and the parents' results it gets.

Pure rules, decided above the storage so both backends agree. A child waits
(`blocked`) for its parents; `when` says what it waits for:

- "all_succeeded" (the default): runs when every parent completed; a parent that
  ends dead, cancelled or upstream_failed makes it `upstream_failed` at once.
- "all_done": runs when every parent finished, whatever the outcome.
- "any_succeeded": runs at the first completed parent; upstream_failed if none does.

An upstream_failed job records the root cause (the dead or cancelled job at the
start of the chain), and its own children meet it as a failed parent, level by
level. A child counts the parents it still waits for (`parents_left`), so the work
per finished parent is its own children, never its siblings.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from .errors import InvalidArgument
from .jobs import FINISHED, State

MARK = "$nbqueue"  # a placeholder in a payload: {"$nbqueue": "result_of", "job": 12}


class When(StrEnum):
    """What a child waits for."""

    ALL_SUCCEEDED = "all_succeeded"
    ALL_DONE = "all_done"
    ANY_SUCCEEDED = "any_succeeded"


def when(value: object) -> When:
    """A `when=` argument, checked."""
    try:
        return When(str(value))
    except ValueError:
        raise InvalidArgument(
            f"when must be one of {', '.join(w.value for w in When)}, not {value!r}"
        ) from None


@dataclass(frozen=True, slots=True)
class Outcome:
    """What a parent that did not complete gives a child that waited for all_done: ok=False and
    the parent's error text (a completed parent gives its plain result instead)."""

    ok: bool
    error: str | None = None


@dataclass(frozen=True, slots=True)
class Change:
    """A child's next state, the parents it still waits for, and the root cause if it failed."""

    state: State
    left: int
    root: int | None = None


def after_parent(rule: When, left: int, parent: State, parent_root: int | None, parent_id: int) -> Change:
    """A blocked child (waiting for `left` parents) when one of its parents finishes as `parent`."""
    failed = parent is not State.COMPLETED
    root = parent_root or parent_id
    left = max(0, left - 1)
    if rule is When.ALL_SUCCEEDED and failed:
        return Change(State.UPSTREAM_FAILED, left, root)
    if rule is When.ANY_SUCCEEDED:
        if not failed:
            return Change(State.PENDING, left)
        return Change(
            State.UPSTREAM_FAILED if left == 0 else State.BLOCKED, left, root if left == 0 else None
        )
    return Change(State.PENDING if left == 0 else State.BLOCKED, left)


def after_parents(
    rule: When, left: int, parent: State, parent_root: int | None, parent_id: int, count: int
) -> Change:
    """A blocked child when `count` of its parents finish alike (as `parent`, passing on the same
    root cause): after_parent folded over them one at a time, in one step (a cascade reads how
    many of a batch's completed parents a child has, not a row per parent). The first decides
    the child or counts it down by one; one that leaves it undecided shows the rule decides such
    a child only as its count reaches 0, so the others count down alike and the last stands for
    them all (tests/test_dependency_rules.py holds this against the fold, rule by rule)."""
    change = after_parent(rule, left, parent, parent_root, parent_id)
    if count == 1 or change.state is not State.BLOCKED:
        return change
    return after_parent(rule, left - count + 1, parent, parent_root, parent_id)


def initial(rule: When, parents: Sequence[tuple[int, State, int | None]]) -> Change:
    """A child's state given its parents as they are now (at enqueue, or when re-armed)."""
    change = Change(State.BLOCKED, len(parents))
    if not parents:
        return Change(State.PENDING, 0)
    for parent_id, state, root in parents:
        if state in FINAL:
            change = after_parent(rule, change.left, state, root, parent_id)
            if change.state is not State.BLOCKED:
                return change
    return change


#: States a parent never leaves by itself: each counts once for its children.
FINAL = (*FINISHED, State.UPSTREAM_FAILED)


# -- placeholders for parents' results ----------------------------------------------------


# Until this process makes its first placeholder, no call's arguments can hold one: enqueue
# then skips looking for them (the common case pays nothing for the feature).
_made = [False]


def any_made() -> bool:
    """Has this process made a result_of / results_of placeholder?"""
    return _made[0]


@dataclass(frozen=True, slots=True)
class ResultOf:
    """`nbqueue.result_of(job)`: replaced by that job's result when the child is claimed."""

    job: Any  # a Job, a job id, or a workflow's planned job

    def __post_init__(self) -> None:
        _made[0] = True

    def marker(self, ids: Mapping[int, int]) -> dict[str, Any]:
        return {MARK: "result_of", "job": job_ref(self.job, ids)}


@dataclass(frozen=True, slots=True)
class ResultsOf:
    """`nbqueue.results_of(jobs)`: replaced by the list of their results when the child is claimed."""

    jobs: tuple[Any, ...]

    def __post_init__(self) -> None:
        _made[0] = True

    def marker(self, ids: Mapping[int, int]) -> dict[str, Any]:
        return {MARK: "results_of", "jobs": [job_ref(j, ids) for j in self.jobs]}


def result_of(job: Any) -> ResultOf:
    """A placeholder for `job`'s result in a child's arguments (the child waits for `job`)."""
    return ResultOf(job)


def results_of(jobs: Iterable[Any]) -> ResultsOf:
    """A placeholder for the list of `jobs`' results in a child's arguments."""
    return ResultsOf(tuple(jobs))


def job_ref(job: Any, ids: Mapping[int, int]) -> int:
    """A job's id; a workflow's planned job is mapped to the id it was given (`ids`)."""
    ref = getattr(job, "id", job)
    if isinstance(ref, bool) or not isinstance(ref, int):
        raise InvalidArgument(f"a parent is a Job or a job id, not {job!r}")
    return ids.get(ref, ref)


DEEPEST = 200  # placeholders are looked for this deep; deeper (or self-referencing) values
# are left as they are for the payload check to refuse


def encode(value: Any, ids: Mapping[int, int] | None = None, depth: int = 0) -> Any:
    """`value` with its placeholders written as JSON markers."""
    if isinstance(value, ResultOf | ResultsOf):
        return value.marker(ids or {})
    if depth > DEEPEST:
        return value
    if isinstance(value, list | tuple):
        return [encode(v, ids, depth + 1) for v in value]
    if isinstance(value, dict):
        return {k: encode(v, ids, depth + 1) for k, v in value.items()}
    return value


def referenced(value: Any, depth: int = 0) -> list[Any]:
    """The jobs the placeholders in `value` refer to (they are parents too)."""
    if isinstance(value, ResultOf):
        return [value.job]
    if isinstance(value, ResultsOf):
        return list(value.jobs)
    if depth > DEEPEST:
        return []
    if isinstance(value, list | tuple):
        return [j for v in value for j in referenced(v, depth + 1)]
    if isinstance(value, dict):
        return [j for v in value.values() for j in referenced(v, depth + 1)]
    return []


def markers(value: Any) -> list[int]:
    """The job ids the JSON markers in a stored payload name."""
    if isinstance(value, dict):
        if value.get(MARK) == "result_of":
            return [int(value["job"])]
        if value.get(MARK) == "results_of":
            return [int(j) for j in value["jobs"]]
        return [j for v in value.values() for j in markers(v)]
    if isinstance(value, list):
        return [j for v in value for j in markers(v)]
    return []


def resolve(value: Any, parents: Mapping[int, tuple[State, Any, str | None]]) -> Any:
    """A payload with its markers replaced by the parents' results: a completed parent's value,
    and for one that did not complete (under all_done), Outcome(ok=False, error=...)."""
    if isinstance(value, dict):
        kind = value.get(MARK)
        if kind == "result_of":
            return _result(parents, int(value["job"]))
        if kind == "results_of":
            return [_result(parents, int(j)) for j in value["jobs"]]
        return {k: resolve(v, parents) for k, v in value.items()}
    if isinstance(value, list):
        return [resolve(v, parents) for v in value]
    return value


def _result(parents: Mapping[int, tuple[State, Any, str | None]], job_id: int) -> Any:
    state, result, error = parents.get(job_id, (State.DEAD, None, f"job {job_id} is gone"))
    if state is State.COMPLETED:
        return result
    return Outcome(ok=False, error=error or f"job {job_id} ended {state.value}")
