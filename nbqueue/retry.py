"""Backoff: how long to wait before retry k."""

from __future__ import annotations

import math
import random
from dataclasses import asdict, dataclass
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
