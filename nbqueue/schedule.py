"""Periodic schedules: `every=timedelta(...)` or a five-field `cron="*/5 * * * *"` (UTC).

A schedule names slots; the worker enqueues each slot's job once, whatever the
number of workers (the slot is recorded in the database in the same
transaction as the job). Missed slots while nothing ran give one job, for the
latest slot, never a burst. The first time a schedule is seen its current slot
is recorded and the first job comes at the next slot.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from .errors import InvalidArgument

_FIELDS = (
    ("minute", 0, 59),
    ("hour", 0, 23),
    ("day of month", 1, 31),
    ("month", 1, 12),
    ("day of week", 0, 7),
)
MAX_STEPS = 20_000  # ample for any cron that can match (29 February needs about 3,000)
_LONGEST = {1: 31, 2: 29, 3: 31, 4: 30, 5: 31, 6: 30, 7: 31, 8: 31, 9: 30, 10: 31, 11: 30, 12: 31}


@dataclass(frozen=True, slots=True)
class Every:
    """Every `seconds`, aligned to the Unix epoch (every hour is on the hour)."""

    seconds: float

    def __post_init__(self) -> None:
        if not math.isfinite(self.seconds) or self.seconds < 1:
            raise InvalidArgument(f"every must be at least one second, not {self.seconds!r}")

    def latest(self, at: datetime) -> datetime | None:
        """The latest slot at or before `at`."""
        stamp = math.floor(at.timestamp() / self.seconds) * self.seconds
        return datetime.fromtimestamp(stamp, UTC)

    def __str__(self) -> str:
        return f"every {timedelta(seconds=self.seconds)}"


@dataclass(frozen=True, slots=True)
class Cron:
    """A five-field cron expression, evaluated in UTC: minute hour day-of-month month day-of-week."""

    expression: str
    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]  # 0 = Sunday
    any_day: bool
    any_weekday: bool

    @classmethod
    def parse(cls, expression: str) -> Cron:
        """Parse `*`, `*/n`, `a`, `a-b`, `a-b/n` and comma lists in each of the five fields."""
        if not isinstance(expression, str):
            raise InvalidArgument(f"cron must be a string like '*/5 * * * *', not {expression!r}")
        parts = expression.split()
        if len(parts) != 5:
            raise InvalidArgument(f"cron {expression!r} needs five fields: minute hour day month weekday")
        sets = [
            _parse_field(text, name, low, high)
            for text, (name, low, high) in zip(parts, _FIELDS, strict=True)
        ]
        weekdays = frozenset(d % 7 for d in sets[4])
        any_day, any_weekday = parts[2] == "*", parts[4] == "*"
        if any_weekday and not any(d <= _LONGEST[m] for m in sets[3] for d in sets[2]):
            raise InvalidArgument(f"cron {expression!r} never matches: no such day in those months")
        return cls(expression, sets[0], sets[1], sets[2], sets[3], weekdays, any_day, any_weekday)

    def _day_matches(self, moment: datetime) -> bool:
        by_date = moment.day in self.days
        by_weekday = (moment.isoweekday() % 7) in self.weekdays
        if self.any_day or self.any_weekday:  # cron: a restricted field decides alone
            return by_date and by_weekday
        return by_date or by_weekday  # both restricted: either one

    def latest(self, at: datetime) -> datetime | None:
        """The latest matching minute at or before `at` (None if none in reach)."""
        moment = at.astimezone(UTC).replace(second=0, microsecond=0)
        for _ in range(MAX_STEPS):
            if moment.month not in self.months:
                moment = moment.replace(day=1, hour=0, minute=0) - timedelta(minutes=1)
            elif not self._day_matches(moment):
                moment = moment.replace(hour=0, minute=0) - timedelta(minutes=1)
            elif moment.hour not in self.hours:
                moment = moment.replace(minute=0) - timedelta(minutes=1)
            elif moment.minute not in self.minutes:
                moment -= timedelta(minutes=1)
            else:
                return moment
        return None

    def __str__(self) -> str:
        return f"cron {self.expression}"


def _parse_field(text: str, name: str, low: int, high: int) -> frozenset[int]:
    values: set[int] = set()
    for part in text.split(","):
        body, _, step_text = part.partition("/")
        try:
            step = int(step_text) if step_text else 1
            if body == "*":
                start, end = low, high
            elif "-" in body:
                start, end = (int(x) for x in body.split("-", 1))
            else:  # "5/15" is 5, 20, 35, 50: a start with a step runs to the end
                start = int(body)
                end = high if step_text else start
        except ValueError:
            raise InvalidArgument(f"cron {name} field {text!r} is not a number, range or */step") from None
        if step < 1 or not (low <= start <= end <= high):
            raise InvalidArgument(f"cron {name} field {text!r} must stay within {low}-{high}")
        values.update(range(start, end + 1, step))
    return frozenset(values)


def make(cron: str | None, every: timedelta | float | None) -> Every | Cron:
    """The schedule for `@q.periodic(cron=...)` or `@q.periodic(every=...)` (exactly one)."""
    if (cron is None) == (every is None):
        raise InvalidArgument("periodic takes cron='...' or every=..., exactly one of them")
    if cron is not None:
        return Cron.parse(cron)
    seconds = every.total_seconds() if isinstance(every, timedelta) else every
    if isinstance(seconds, bool) or not isinstance(seconds, int | float):
        raise InvalidArgument(f"every must be a timedelta or seconds, not {every!r}")
    return Every(float(seconds))
