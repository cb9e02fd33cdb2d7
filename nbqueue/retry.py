"""What a failure leads to: Backoff (how long before retry k) and RetryAfter (a snooze)."""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
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
MIN_HTTP_SNOOZE = 1.0  # "Retry-After: 0" answered at once, a hundred times over, is no pause at all
SNOOZE_STATUSES = (429, 503, 529)  # 529: Anthropic's "overloaded"


def retry_after(error: BaseException, now: datetime | None = None) -> RetryAfter | None:
    """The snooze an error asks for: a RetryAfter, or an HTTP 429/503/529 with a delay header.

    The status and headers are looked for where the clients put them: on the error's
    response (`error.response.status_code` / `.status`, `.headers`: httpx, requests, OpenAI,
    Anthropic) or on the error itself (`err.status` / `err.code`, `err.headers`: aiohttp's
    ClientResponseError, urllib's HTTPError); on the error, each member of an exception
    group (asyncio.TaskGroup), and what caused each. `retry-after-ms`, then `Retry-After`
    (seconds or an HTTP date), are read, and a delay below one second counts as one second;
    a 429/503 that names no delay is not a snooze (it fails, and is retried by its backoff).
    A snooze from an HTTP response pauses the job's limit keys.
    """
    for current in _related(error):
        if isinstance(current, RetryAfter):
            return current
        for source in (getattr(current, "response", None), current):
            status, delay = _http_delay(source, now)
            if delay is not None:
                asked = f"HTTP {status}: the server asked to wait {delay:g} s"
                if delay < MIN_HTTP_SNOOZE:
                    asked += f"; waiting {MIN_HTTP_SNOOZE:g} s, the least"
                return RetryAfter(max(delay, MIN_HTTP_SNOOZE), asked, pause_limits=True)
    return None


def _related(error: BaseException) -> Iterator[BaseException]:
    """The error, then (depth first) each member of a group and what caused each, once each."""
    seen: set[int] = set()
    stack: list[BaseException] = [error]
    while stack:
        current = stack.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        cause = current.__cause__ or current.__context__
        following = list(current.exceptions) if isinstance(current, BaseExceptionGroup) else []
        stack.extend(reversed([*following, *([cause] if cause is not None else [])]))


def _status(source: Any) -> int | None:
    for name in ("status_code", "status", "code"):
        value = getattr(source, name, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def _http_delay(source: Any, now: datetime | None) -> tuple[int | None, float | None]:
    """(status, seconds to wait) from a response or an HTTP error; seconds is None if none asked."""
    status = _status(source)
    if status not in SNOOZE_STATUSES:
        return status, None
    headers = getattr(source, "headers", None)
    if headers is None or not hasattr(headers, "get"):
        return status, None
    text = headers.get("retry-after-ms") or headers.get("Retry-After-Ms")
    if text is not None:
        try:
            return status, _bounded(float(text) / 1000)
        except (TypeError, ValueError):
            pass
    text = headers.get("retry-after") or headers.get("Retry-After")
    if text is None:
        return status, None
    try:
        return status, _bounded(float(text))
    except (TypeError, ValueError):
        pass
    try:
        when = parsedate_to_datetime(str(text))
    except (TypeError, ValueError, IndexError):
        return status, None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return status, _bounded((when - (now or datetime.now(UTC))).total_seconds())


def _bounded(seconds: float) -> float | None:
    if math.isnan(seconds):
        return None
    return min(MAX_SNOOZE, max(0.0, seconds))
