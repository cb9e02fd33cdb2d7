"""The dependency rule folded over a count of parents that finished alike (what a cascade reads
for a batch of completed parents) is the rule applied to them one at a time."""

from __future__ import annotations

import pytest

from nbqueue.dependencies import FINAL, Change, When, after_parent, after_parents
from nbqueue.jobs import State


def one_at_a_time(rule: When, left: int, parent: State, root: int | None, count: int) -> Change:
    """after_parent for each of `count` parents in turn, until one decides the child."""
    change = Change(State.BLOCKED, left)
    for _ in range(count):
        change = after_parent(rule, change.left, parent, root, 3)
        if change.state is not State.BLOCKED:
            break
    return change


@pytest.mark.parametrize("rule", list(When))
@pytest.mark.parametrize("parent", FINAL)
def test_after_parents_is_after_parent_one_parent_at_a_time(rule: When, parent: State) -> None:
    for left in range(6):
        for root in (None, 7):
            for count in range(1, 9):
                expected = one_at_a_time(rule, left, parent, root, count)
                assert after_parents(rule, left, parent, root, 3, count) == expected, (left, root, count)
