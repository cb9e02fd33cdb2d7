"""Claims under limits (nbqueue.limits), run by the shared storage inside one transaction: up to
a worker's batch of jobs, each weighed as a claim of its own would weigh it.

The keys' rows are read (locked, so claims weighing one key take turns) and their running units
counted once per batch, for the keys the candidates hold; then this keeps them up to date with
what each job taken holds and the TATs it moved (within the transaction nobody else can change
them but to free units, which only makes the count err on the safe side), and writes the TATs
once, at the end.

The candidates are the best due job of each (queue, set of keys). When one such group holds
every claimable job (the common case: an agent's jobs share their keys), its next jobs in claim
order are the next candidates overall: they are read at once, each weighed as the head in turn
(as if those before it were taken), and those chosen taken in one statement. One that another
claim took meanwhile leaves units and TATs counted that it does not use: the limits then err on
the safe side, never the other.
"""

from __future__ import annotations

from ..jobs import JobRow
from ..options import held_keys
from . import Decide, Row, claim_order
from .statements import Params, Tx

Head = tuple[int, str | None]  # a candidate: its id and its limits column


def take(tx: Tx, heads_statement: str, params: Params, decide: Decide, most: int) -> list[JobRow]:
    """Up to `most` jobs that `decide` lets start, taken in claim order."""
    sql = tx.sql
    counted = Counted()
    rows: list[JobRow] = []
    while len(rows) < most:
        found = tx(heads_statement, params)
        if not found:
            break
        moment = int(found[0][0])
        heads = [(int(i), wanted) for _, i, wanted in found]
        new = sorted({key for _, wanted in heads for key in held_keys(wanted)} - counted.states.keys())
        if new:
            counted.states |= {str(row[0]): row for row in tx(sql.LOCK_KEYS, {"keys": new})}
            held = tx(sql.IN_FLIGHT, {"keys": new})
            counted.held |= {str(key): int(units or 0) for key, units in held}
        if len(heads) == 1 and most - len(rows) > 1:
            more = {**params, "head": heads[0][0], "moment": moment, "most": most - len(rows)}
            chosen, refused = counted.choose(
                [(int(i), w) for i, w in tx(sql.NEXT_OF_GATE, more)], decide, moment
            )
            taken = tx(sql.TAKE_IDS, {**params, "ids": chosen}) if chosen else []
            rows += sorted((JobRow._make(row) for row in taken), key=claim_order)
        else:
            row, refused = _take_one(tx, params, heads, decide, counted, moment)
            rows += [] if row is None else [row]
        if refused:  # the limits let none of them start now
            break
    for key, tat in counted.tats.items():
        tx(sql.SET_TAT, {"key": key, "tat": tat})
    return rows


class Counted:
    """The keys' rows, the units running jobs hold and the TATs moved, as this batch left them."""

    def __init__(self) -> None:
        self.states: dict[str, Row] = {}  # key -> (key, concurrency, rate, burst, tat, paused_until)
        self.held: dict[str, int] = {}
        self.tats: dict[str, int] = {}

    def weigh(
        self, heads: list[Head], decide: Decide, moment: int
    ) -> tuple[int, dict[str, int], dict[str, int]] | None:
        return decide(heads, list(self.states.values()), list(self.held.items()), moment)

    def count(self, moved: dict[str, int], units: dict[str, int]) -> None:
        """A job taken: the units it holds, the TATs it moved."""
        self.tats.update(moved)
        for key, tat in moved.items():
            row = self.states[key]
            self.states[key] = (*row[:4], tat, row[5])
        for key, amount in units.items():
            self.held[key] = self.held.get(key, 0) + amount

    def choose(self, candidates: list[Head], decide: Decide, moment: int) -> tuple[list[int], bool]:
        """Of one group's candidates in claim order, those the limits let start, each counted as
        taken; and whether the limits held one back (then no later one starts either)."""
        chosen: list[int] = []
        for job_id, wanted in candidates:
            choice = self.weigh([(job_id, wanted)], decide, moment)
            if choice is None:
                return chosen, True
            chosen.append(job_id)
            self.count(choice[1], choice[2])
        return chosen, False


def _take_one(
    tx: Tx, params: Params, heads: list[Head], decide: Decide, counted: Counted, moment: int
) -> tuple[JobRow | None, bool]:
    """The job `decide` chooses among `heads`, taken (another claim may have taken it first: then
    the next choice), and counted; with whether the limits held them all back."""
    while heads:
        choice = counted.weigh(heads, decide, moment)
        if choice is None:
            return None, True
        chosen, moved, units = choice
        taken = tx(tx.sql.TAKE_ID, {**params, "chosen": chosen})
        if taken:
            counted.count(moved, units)
            return JobRow._make(taken[0]), False
        heads = [head for head in heads if head[0] != chosen]
    return None, False
