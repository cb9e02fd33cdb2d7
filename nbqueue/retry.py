"""What a failure leads to: Backoff (how long before retry k) and RetryAfter (a snooze)."""

from __future__ import annotations

import math
import random
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any

from .errors import InvalidArgument


@dataclass(frozen=True, slots=True)
class Backoff:
    """Exponential backoff: retry k waits min(cap, base**k) seconds, spread by jitter.

    `jitter=0.1` spreads each delay uniformly within 10% either side, so many
    jobs failing together do not all retry in the same instant.
    """

    base: float = 2.0
    cap: float = 3600.0
    jitter: float = 0.1

    def __post_init__(self) -> None:
        for name in ("base", "cap", "jitter"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise InvalidArgument(f"Backoff {name} must be a number, not {value!r}")
            if math.isnan(value) or math.isinf(value) or value < 0:
                raise InvalidArgument(f"Backoff {name} must be a finite number >= 0, not {value!r}")
        if self.jitter > 1:
            raise InvalidArgument(f"Backoff jitter is a fraction from 0 to 1, not {self.jitter!r}")

    def delay(self, retry: int, rng: random.Random | None = None) -> float:
        """Seconds to wait before retry number `retry` (the first retry is 1)."""
        if retry < 1:
            raise InvalidArgument(f"retry numbers start at 1, not {retry}")
        try:
            raw = min(self.cap, self.base**retry)
        except OverflowError:
            raw = self.cap
        if not self.jitter:
            return float(raw)
        spread = (rng or random).uniform(-self.jitter, self.jitter)
        return float(raw * (1 + spread))

    def to_dict(self) -> dict[str, float]:
        """The stored form, kept on each job so any worker applies the same policy."""
        return {k: float(v) for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> Backoff:
        """Rebuild from the stored form; None gives the default policy."""
        return cls(**data) if data else cls()


class RetryAfter(Exception):  # raised by a job to ask for a later run: not an nbqueue error
    """Raise inside a job to run it again in `seconds`, without spending an attempt.

    The job goes back to pending, due then; its retries are not counted (after 100
    snoozes it is dead, "snoozed too often"). `pause_limits=True` also pauses every limit
    key the job holds until then, so other jobs on those keys wait instead of calling.
    """

    def __init__(self, seconds: float, reason: str = "", *, pause_limits: bool = False) -> None:
        if (
            isinstance(seconds, bool)
            or not isinstance(seconds, int | float)
            or not 0 <= seconds <= MAX_SNOOZE
        ):
            raise InvalidArgument(f"RetryAfter takes seconds from 0 to {MAX_SNOOZE:g}, not {seconds!r}")
        super().__init__(reason or f"retry after {seconds:g} s")
        self.seconds = float(seconds)
        self.reason = reason
        self.pause_limits = pause_limits


MAX_SNOOZE = 7 * 86400.0  # a server asking for more than a week is not to be believed
SNOOZE_STATUSES = (429, 503)


def retry_after(error: BaseException, now: datetime | None = None) -> RetryAfter | None:
    """The snooze an error asks for: a RetryAfter, or an HTTP 429/503 with a delay header.

    The response is looked for where httpx, requests and the OpenAI and Anthropic clients
    put it (`error.response.status_code`, `error.response.headers`), on the error or on
    what caused it. `retry-after-ms`, then `Retry-After` (seconds or an HTTP date), are
    read; a 429/503 that names no delay is not a snooze (it fails, and is retried by its
    backoff). A snooze from an HTTP response pauses the job's limit keys.
    """
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, RetryAfter):
            return current
        delay = _http_delay(getattr(current, "response", None), now)
        if delay is not None:
            return RetryAfter(
                delay, f"HTTP {_status(current)}: the server asked to wait {delay:g} s", pause_limits=True
            )
        current = current.__cause__ or current.__context__
    return None


def _status(error: BaseException) -> int | None:
    response = getattr(error, "response", None)
    status = getattr(response, "status_code", None) or getattr(response, "status", None)
    return status if isinstance(status, int) else None


def _http_delay(response: Any, now: datetime | None) -> float | None:
    status = getattr(response, "status_code", None) or getattr(response, "status", None)
    if status not in SNOOZE_STATUSES:
        return None
    headers = getattr(response, "headers", None)
    if headers is None or not hasattr(headers, "get"):
        return None
    text = headers.get("retry-after-ms") or headers.get("Retry-After-Ms")
    if text is not None:
        try:
            return _bounded(float(text) / 1000)
        except (TypeError, ValueError):
            pass
    text = headers.get("retry-after") or headers.get("Retry-After")
    if text is None:
        return None
    try:
        return _bounded(float(text))
    except (TypeError, ValueError):
        pass
    try:
        when = parsedate_to_datetime(str(text))
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return _bounded((when - (now or datetime.now(UTC))).total_seconds())


def _bounded(seconds: float) -> float | None:
    if math.isnan(seconds):
        return None
    return min(MAX_SNOOZE, max(0.0, seconds))
