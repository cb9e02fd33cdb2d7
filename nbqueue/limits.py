"""Limits: how many jobs of a key may run at once, how fast they may start, and pauses.

Pure rules, decided above the storage so both backends agree:

- `concurrency`: at no moment do the running jobs holding a key hold more than
  `concurrency` units of it (a job takes 1 unit of each key unless it names more).
  Running jobs are counted from the jobs themselves, so a crashed worker's units
  come back with its lease: nothing is kept that could leak.
- `rate` ("500/m", "10/s", "90000/m", "2/h"): starts are spaced evenly, by the
  generic cell rate algorithm (GCRA). Each start of n units moves the key's
  theoretical arrival time (TAT) on by n / rate; a start is allowed while the TAT
  is at most `burst / rate` ahead of now. In any window of length T the units
  started are at most rate x T + burst + the last start's units (1 for plain jobs).
- A key paused (by a 429 with Retry-After, or by hand) starts nothing until then.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .errors import InvalidArgument
from .options import MAX_UNITS, check_name

PER = {"s": 1.0, "m": 60.0, "h": 3600.0}
# The slowest rate a limit may have (1/h): with units and burst each under MAX_UNITS, a key's
# TAT then stays within a signed 64-bit integer (the claim's arithmetic, both backends).
MIN_RATE = 1 / 3600
MAX_TAT = 2**63  # µs: every TAT stays below it (a signed 64-bit integer, on either backend)


@dataclass(frozen=True, slots=True)
class Limit:
    """A key's limits as stored: concurrency (units at once), rate (units per second), burst."""

    key: str
    concurrency: int | None = None
    rate: float | None = None  # units per second
    burst: float = 0.0

    def __post_init__(self) -> None:
        check_name(self.key, "limit key")
        if self.concurrency is not None and (
            isinstance(self.concurrency, bool)
            or not isinstance(self.concurrency, int)
            or not 1 <= self.concurrency <= MAX_UNITS
        ):
            raise InvalidArgument(
                f"concurrency of limit {self.key!r} must be a whole number from 1 to {MAX_UNITS:,}, "
                f"not {self.concurrency!r}"
            )
        if self.rate is not None and not (
            isinstance(self.rate, int | float)
            and not isinstance(self.rate, bool)
            and math.isfinite(self.rate)
            and self.rate > 0
        ):
            raise InvalidArgument(f"rate of limit {self.key!r} must be above 0, not {self.rate!r}")
        if (
            isinstance(self.burst, bool)
            or not isinstance(self.burst, int | float)
            or not 0 <= self.burst < MAX_UNITS
        ):
            raise InvalidArgument(f"burst of limit {self.key!r} must be a number >= 0")

    @property
    def rate_text(self) -> str | None:
        """The rate as written: "500/m"."""
        return None if self.rate is None else format_rate(self.rate)


@dataclass(frozen=True, slots=True)
class KeyState:
    """A key's state at a claim: its limit, its TAT (µs), its pause, the units its running jobs hold."""

    limit: Limit
    tat: int = 0
    paused_until: int | None = None
    in_flight: int = 0


def parse_rate(text: str) -> float:
    """ "500/m" -> units per second (also /s and /h, and "/minute" style words)."""
    if not isinstance(text, str):
        raise InvalidArgument(f"rate must be text like '500/m', not {text!r}")
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*/\s*(s|sec|second|m|min|minute|h|hour)s?\s*", text.lower())
    if match is None:
        raise InvalidArgument(f"rate {text!r} must look like '500/m' (per s, m or h)")
    amount = float(match.group(1))
    if amount <= 0:
        raise InvalidArgument(f"rate {text!r} must be above 0")
    per_second = amount / PER[match.group(2)[0]]
    if per_second < MIN_RATE * (1 - 1e-12):
        raise InvalidArgument(f"rate {text!r} is slower than 1/h, the slowest rate a limit can pace")
    return per_second


def format_rate(per_second: float) -> str:
    """Units per second as the shortest plain "n/s", "n/m" or "n/h"."""
    for unit in ("s", "m", "h"):
        amount = per_second * PER[unit]
        if abs(amount - round(amount)) < 1e-9 and amount >= 1:
            return f"{round(amount)}/{unit}"
    return f"{per_second:g}/s"


def read_state(row: Sequence[Any], in_flight: int) -> KeyState:
    """A key's stored row (key, concurrency, rate, burst, tat, paused_until) as its KeyState;
    InvalidArgument if the row holds what `Queue.limit` would refuse (a hand-written row)."""
    key, concurrency, rate, burst, tat, paused_until = row
    for value, what in ((tat, "TAT"), (paused_until, "pause")):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise InvalidArgument(f"limit {key!r} as stored has a {what} that is no time: {value!r:.60}")
    limit = Limit(key, concurrency, rate, burst)
    if limit.rate is not None and not math.isfinite(1e6 / limit.rate):
        raise InvalidArgument(f"rate of limit {key!r} is too small to space starts: {limit.rate!r}")
    return KeyState(limit, tat or 0, paused_until, in_flight)


@dataclass(frozen=True, slots=True)
class Admission:
    """A start that the limits allow: the keys' new TATs."""

    tats: dict[str, int]


def admit(wanted: Mapping[str, int], states: Mapping[str, KeyState], now_us: int) -> Admission | None:
    """May a job holding `wanted` units start now? If so, how the keys' TATs move.

    Raises InvalidArgument if a key's new TAT would not fit a 64-bit integer."""
    tats: dict[str, int] = {}
    for key, amount in wanted.items():
        state = states.get(key)
        if state is None:  # a key nobody limited: no limit
            continue
        if state.paused_until is not None and state.paused_until > now_us:
            return None
        limit = state.limit
        over = limit.concurrency is not None and state.in_flight + amount > limit.concurrency
        if over and (state.in_flight > 0 or amount <= (limit.concurrency or 0)):
            return None  # (a job asking more than the whole limit may run alone)
        if limit.rate is not None:
            interval = 1e6 / limit.rate  # µs per unit
            tat = max(state.tat, now_us)
            if tat - now_us > limit.burst * interval + 0.5:
                return None
            after = tat + amount * interval
            if not after < MAX_TAT:  # only a row written by hand gets here: Queue.limit bounds the rate
                raise InvalidArgument(
                    f"limit {key!r}: {amount:,} units at {limit.rate_text} would schedule its next "
                    "start beyond what a 64-bit clock holds"
                )
            tats[key] = round(after)
    return Admission(tats)


def opens_at(wanted: Mapping[str, int], states: Mapping[str, KeyState], now_us: int) -> int | None:
    """When, at the earliest, time alone could let this job start (None: a running job must end first)."""
    when = now_us
    for key in wanted:
        state = states.get(key)
        if state is None:
            continue
        if state.paused_until is not None:
            when = max(when, state.paused_until)
        limit = state.limit
        if (
            limit.concurrency is not None
            and state.in_flight + wanted[key] > limit.concurrency
            and state.in_flight
        ):
            return None
        if limit.rate is not None:
            interval = 1e6 / limit.rate
            when = max(when, round(state.tat - limit.burst * interval))
    return when


def describe(limit: Limit) -> dict[str, Any]:
    """A limit as q.limits() shows it."""
    return {"key": limit.key, "concurrency": limit.concurrency, "rate": limit.rate_text, "burst": limit.burst}
