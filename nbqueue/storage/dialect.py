"""How one SQL engine spells what both mean (storage/statements.py writes each statement once, in a
neutral spelling; each backend's `Dialect` renders it at import)."""

from __future__ import annotations

import re
from dataclasses import dataclass

# `IN [:ids::bigint]`: a list bound as one parameter (`EACH [...]`: its values as a table of
# one column, `value`); `:name` or `:name::type`: a parameter.
_LIST = re.compile(r"(NOT IN|IN|EACH) \[:(\w+)::(\w+)\]")
_PARAM = re.compile(r"(?<![:\w]):(\w+)(?:::(\w+))?")


@dataclass(frozen=True, slots=True)
class Dialect:
    """How one SQL engine spells what both mean: parameters, lists, the clock, the wake-up."""

    name: str
    param: str  # a parameter, from its name: ":{0}" or "%({0})s"
    typed: bool  # whether a parameter keeps its `::type` (PostgreSQL infers none from NULL)
    lists: dict[str, str]  # "IN", "NOT IN", "EACH" -> its spelling, from the parameter and type
    now: str  # the time a write stamps: the caller's clock, or the server's
    wake: str  # an extra RETURNING column that wakes the queue's listeners ("" for none)
    same: str  # IS NOT DISTINCT FROM
    greatest: str  # the larger of two values
    tail_error: str  # the last BRIEF_ERROR characters of the error
    ordered_join: str  # a join the planner keeps in the written order
    spawned_index: str  # the index hint for walking spawned_by
    lock_children: str  # locks a cascade's children (c) while it counts them down
    lock_parents: str  # holds a re-armed job's parents (p) while it is settled
    unindexed: str  # a state test no index answers (a cascade starts from its edges, a batch from ids)
    like: str  # a case-insensitive LIKE
    lock_row: str  # locks the rows a SELECT reads until the transaction ends

    def render(self, text: str) -> str:
        """A neutral statement in this dialect's spelling (once, at import)."""

        def listed(m: re.Match[str]) -> str:
            return self.lists[m.group(1)].format(self.param.format(m.group(2)), m.group(3))

        def param(m: re.Match[str]) -> str:
            cast = f"::{m.group(2)}" if self.typed and m.group(2) else ""
            return self.param.format(m.group(1)) + cast

        return _PARAM.sub(param, _LIST.sub(listed, text))
