"""Time: one injectable clock, UTC datetimes, durations in seconds.

Storage keeps every timestamp as integer microseconds since the Unix epoch
(UTC), so comparisons in SQL are exact and never mix formats.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from .errors import InvalidArgument

Clock = Callable[[], float]
"""A clock returns seconds since the Unix epoch, like `time.time`."""

Duration = float | int | timedelta
MAX_SECONDS = 100 * 365.25 * 86400  # durations beyond a century are mistakes, not plans


def system_clock() -> float:
    """The wall clock."""
    return time.time()


class ManualClock:
    """A clock that only moves when told to: for tests and deterministic tutorials."""

    def __init__(self, start: float | datetime = 1_700_000_000.0) -> None:
        self._now = start.timestamp() if isinstance(start, datetime) else float(start)
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            return self._now

    def advance(self, seconds: Duration) -> None:
        """Move the clock forward (or back, with a negative number)."""
        step = seconds.total_seconds() if isinstance(seconds, timedelta) else float(seconds)
        with self._lock:
            self._now += step

    def set(self, when: float | datetime) -> None:
        """Jump to an absolute time."""
        with self._lock:
            self._now = when.timestamp() if isinstance(when, datetime) else float(when)


def to_us(seconds: float) -> int:
    """Epoch seconds to the stored form, integer microseconds."""
    return round(seconds * 1_000_000)


EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def from_us(us: int | None) -> datetime | None:
    """The stored form to an aware UTC datetime."""
    if us is None:
        return None
    return EPOCH + timedelta(microseconds=us)


def seconds(value: Duration | None, name: str, *, allow_none: bool = True) -> float | None:
    """Check a duration (seconds as a number, or a timedelta) and return seconds."""
    if value is None:
        if allow_none:
            return None
        raise InvalidArgument(f"{name} is required (seconds or a timedelta)")
    if isinstance(value, timedelta):
        result = value.total_seconds()
    elif isinstance(value, int | float) and not isinstance(value, bool):
        result = float(value)
    else:
        raise InvalidArgument(f"{name} must be seconds (a number) or a timedelta, not {type(value).__name__}")
    if math.isnan(result) or math.isinf(result):
        raise InvalidArgument(f"{name} must be a finite number of seconds, not {result}")
    if result < 0:
        raise InvalidArgument(f"{name} must not be negative, got {result}")
    if result > MAX_SECONDS:
        raise InvalidArgument(f"{name} of {result:g} s is more than a century; nbqueue refuses it")
    return result


def utc_seconds(value: datetime, name: str) -> float:
    """Check an aware datetime and return its epoch seconds; naive datetimes are refused."""
    if not isinstance(value, datetime):
        raise InvalidArgument(f"{name} must be a timezone-aware datetime, not {type(value).__name__}")
    if value.tzinfo is None or value.utcoffset() is None:
        raise InvalidArgument(
            f"{name} must be timezone-aware (for example datetime.now(timezone.utc)); "
            "a naive datetime is ambiguous"
        )
    if not 0 <= value.timestamp() <= time.time() + MAX_SECONDS:
        raise InvalidArgument(f"{name} {value.isoformat()} is before 1970 or more than a century ahead")
    return value.timestamp()
