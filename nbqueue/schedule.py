"""Periodic schedules: `every=timedelta(...)`, or cron (`"0 9 * * MON-FRI"`, `"@daily"`) in a time zone.

A schedule names slots; the worker enqueues each slot's job once, whatever the
number of workers (the slot is recorded in the database in the same
transaction as the job). Missed slots while nothing ran give one job, for the
latest slot, never a burst. The first time a schedule is seen its current slot
is recorded and the first job comes at the next slot.

Cron is read by cronsim (the cron engine of Healthchecks.io): five fields with
names (`JAN`, `MON-FRI`), `L`, `#`, and the aliases below; evaluated in `tz`
(IANA names, UTC by default) with cron's own rules for daylight saving: on a
spring-forward day a job in the missing hour runs once, when the clock jumps
(02:30 runs at 03:00); on a fall-back day a job at a fixed time in the repeated
hour runs once, at its first occurrence; a job whose hour is a wildcard runs in
both.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from .clock import MAX_SECONDS
from .errors import InvalidArgument

#: Cron's nicknames, as the five fields they stand for.
ALIASES = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}


@dataclass(frozen=True, slots=True)
class Every:
    """Every `seconds`, aligned to the Unix epoch (every hour is on the hour)."""

    seconds: float

    def __post_init__(self) -> None:
        # Bounded above too: every=timedelta.max would put the next slot past the year 9999,
        # which no datetime holds (q.schedules() and every board would raise).
        if not math.isfinite(self.seconds) or not 1 <= self.seconds <= MAX_SECONDS:
            raise InvalidArgument(f"every must be from one second to a century, not {self.seconds!r} s")

    def latest(self, at: datetime) -> datetime | None:
        """The latest slot at or before `at`."""
        stamp = math.floor(at.timestamp() / self.seconds) * self.seconds
        return datetime.fromtimestamp(stamp, UTC)

    def next_after(self, at: datetime) -> datetime | None:
        """The first slot after `at`."""
        stamp = (math.floor(at.timestamp() / self.seconds) + 1) * self.seconds
        return datetime.fromtimestamp(stamp, UTC)

    def __str__(self) -> str:
        return f"every {timedelta(seconds=self.seconds)}"


@dataclass(frozen=True, slots=True)
class Cron:
    """A cron expression (five fields, or an alias like "@daily") evaluated in the time zone `tz`."""

    expression: str
    tz: str = "UTC"

    @classmethod
    def parse(cls, expression: str, tz: str | None = None) -> Cron:
        """Check the expression and the zone: refused with InvalidArgument if either is wrong, or if
        the expression can never match (30 February)."""
        if not isinstance(expression, str) or not expression.strip():
            raise InvalidArgument(f"cron must be a string like '*/5 * * * *' or '@daily', not {expression!r}")
        cron = cls(" ".join(expression.split()), zone_name(tz))
        fields = cron.fields
        if len(fields.split()) != 5:
            raise InvalidArgument(
                f"cron {expression!r} needs five fields (minute hour day month weekday) or one of "
                f"{', '.join(ALIASES)}"
            )
        try:
            next(CronSim(fields, datetime(2000, 1, 1, tzinfo=UTC)))
        except CronSimError as exc:
            raise InvalidArgument(f"cron {expression!r}: {exc}") from None
        except StopIteration:
            raise InvalidArgument(f"cron {expression!r} never matches") from None
        return cron

    @property
    def fields(self) -> str:
        """The five fields (an alias spelled out)."""
        return ALIASES.get(self.expression.lower(), self.expression)

    @property
    def zone(self) -> ZoneInfo:
        return ZoneInfo(self.tz)

    def latest(self, at: datetime) -> datetime | None:
        """The latest slot at or before `at`, in UTC (None if none in reach)."""
        # cronsim steps back strictly before its start: start a second into `at`'s minute.
        start = at.astimezone(self.zone).replace(second=0, microsecond=0) + timedelta(seconds=1)
        return _first(CronSim(self.fields, start, reverse=True))

    def next_after(self, at: datetime) -> datetime | None:
        """The first slot after `at`, in UTC (None if none in reach)."""
        return _first(CronSim(self.fields, at.astimezone(self.zone)))

    def __str__(self) -> str:
        return f"cron {self.expression}" + ("" if self.tz == "UTC" else f" ({self.tz})")


def _first(slots: CronSim) -> datetime | None:
    try:
        return next(slots).astimezone(UTC)
    except (StopIteration, CronSimError):
        return None


def zone_name(tz: object) -> str:
    """An IANA time zone name ("Europe/Berlin"), checked; None is UTC."""
    if tz is None:
        return "UTC"
    if not isinstance(tz, str) or not tz.strip():
        raise InvalidArgument(f"tz must be an IANA time zone name like 'Europe/Berlin', not {tz!r}")
    try:
        ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError):
        raise InvalidArgument(f"unknown time zone {tz!r} (use an IANA name like 'Europe/Berlin')") from None
    return tz


def to_spec(schedule: Every | Cron) -> dict[str, Any]:
    """A schedule as JSON, to keep it in the database."""
    if isinstance(schedule, Every):
        return {"every": schedule.seconds}
    return {"cron": schedule.expression, "tz": schedule.tz}


def from_spec(spec: dict[str, Any]) -> Every | Cron:
    """The schedule `to_spec` wrote (checked again: a row may have been edited by hand)."""
    if "every" in spec:
        return make(None, spec["every"])
    return make(spec.get("cron"), None, spec.get("tz"))


def make(cron: str | None, every: timedelta | float | None, tz: str | None = None) -> Every | Cron:
    """The schedule for `@q.periodic(cron=..., tz=...)` or `@q.periodic(every=...)` (exactly one)."""
    if (cron is None) == (every is None):
        raise InvalidArgument("periodic takes cron='...' or every=..., exactly one of them")
    if cron is not None:
        return Cron.parse(cron, tz)
    if tz is not None:
        raise InvalidArgument("tz applies to cron schedules; every= counts seconds, whatever the zone")
    seconds = every.total_seconds() if isinstance(every, timedelta) else every
    if isinstance(seconds, bool) or not isinstance(seconds, int | float):
        raise InvalidArgument(f"every must be a timedelta or seconds, not {every!r}")
    return Every(float(seconds))
