"""Claims under limits (nbqueue.limits), run by the shared storage inside one transaction: up to
a worker's batch of jobs, each weighed as a claim of its own would weigh it.

The keys' rows are read (locked, so claims weighing one key take turns) and their running units
counted once per batch, for the keys the candidates hold; then this keeps them up to date with
what each job taken holds and the TATs it moved (within the transaction nobody else can change
them but to free units, which only makes the count err on the safe side), and writes the TATs
once, at the end. The candidates are read again before each job: taking one makes the next of
its kind the head.
"""

from __future__ import annotations

from ..jobs import JobRow
from ..options import held_keys
from . import Decide, Row
from .statements import Params, Tx


def take(tx: Tx, heads_statement: str, params: Params, decide: Decide, most: int) -> list[JobRow]:
    """Up to `most` jobs that `decide` lets start, taken in claim order."""
    sql = tx.sql
    states: dict[str, Row] = {}
    held: dict[str, int] = {}
    tats: dict[str, int] = {}
    rows: list[JobRow] = []
    while len(rows) < most:
        found = tx(heads_statement, params)
        if not found:
            break
        moment = int(found[0][0])
        heads = [(int(i), wanted) for _, i, wanted in found]
        new = sorted({key for _, wanted in heads for key in held_keys(wanted)} - states.keys())
        if new:
            states |= {str(row[0]): row for row in tx(sql.LOCK_KEYS, {"keys": new})}
            held |= {str(key): int(units or 0) for key, units in tx(sql.IN_FLIGHT, {"keys": new})}
        if len(heads) == 1 and most - len(rows) > 1:
            # One (queue, set of keys) holds every claimable job: its next ones in claim order are
            # the next candidates overall, read at once; each is weighed as the head in turn.
            more = {**params, "head": heads[0][0], "moment": moment, "most": most - len(rows)}
            candidates = [[(int(i), wanted)] for i, wanted in tx(sql.NEXT_OF_GATE, more)]
        else:
            candidates = [heads]
        for one in candidates:
            row, refused = _take(tx, params, one, decide, list(states.values()), held, moment, tats)
            if refused:  # the limits let none of them start now: nor any later one
                return _finish(tx, rows, tats)
            if row is None:  # another claim took them first
                continue
            rows.append(row)
            for key, tat in tats.items():  # (key, concurrency, rate, burst, tat, paused_until)
                states[key] = (*states[key][:4], tat, states[key][5])
    return _finish(tx, rows, tats)


def _finish(tx: Tx, rows: list[JobRow], tats: dict[str, int]) -> list[JobRow]:
    """The TATs the jobs taken moved, written once."""
    for key, tat in tats.items():
        tx(tx.sql.SET_TAT, {"key": key, "tat": tat})
    return rows


def _take(
    tx: Tx,
    params: Params,
    heads: list[tuple[int, str | None]],
    decide: Decide,
    states: list[Row],
    held: dict[str, int],
    moment: int,
    tats: dict[str, int],
) -> tuple[JobRow | None, bool]:
    """The job `decide` chooses among `heads`, taken (another claim may have taken it first: then
    the next choice); what it holds is added to `held` and the TATs it moves to `tats`. With
    whether `decide` refused them all."""
    while heads:
        choice = decide(heads, states, list(held.items()), moment)
        if choice is None:
            return None, True
        chosen, moved, units = choice
        taken = tx(tx.sql.TAKE_ID, {**params, "chosen": chosen})
        if taken:
            tats.update(moved)
            for key, amount in units.items():
                held[key] = held.get(key, 0) + amount
            return JobRow._make(taken[0]), False
        heads = [head for head in heads if head[0] != chosen]
    return None, False
