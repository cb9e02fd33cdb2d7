"""Backoff: the delay before retry k is min(cap, base**k), spread by jitter."""

from __future__ import annotations

import math
import random

import pytest

import nbqueue
from nbqueue import Backoff


@pytest.mark.parametrize(
    ("base", "cap", "k", "expected"),
    [
        (2, 3600, 1, 2.0),
        (2, 3600, 2, 4.0),
        (2, 3600, 3, 8.0),
        (2, 3600, 11, 2048.0),
        (2, 3600, 12, 3600.0),  # 4096 capped
        (2, 3600, 500, 3600.0),
        (2, 3600, 5000, 3600.0),  # 2**5000 overflows a float: still the cap
        (3, 100, 1, 3.0),
        (3, 100, 4, 81.0),
        (3, 100, 5, 100.0),
        (1.5, 3600, 2, 2.25),
        (10, 5, 1, 5.0),
        (2, 0, 3, 0.0),
        (0, 3600, 2, 0.0),
    ],
)
def test_delay_without_jitter(base: float, cap: float, k: int, expected: float) -> None:
    delay = Backoff(base=base, cap=cap, jitter=0).delay(k)
    assert delay == expected
    assert isinstance(delay, float)


def test_default_policy() -> None:
    assert Backoff() == Backoff(base=2, cap=3600, jitter=0.1)


@pytest.mark.parametrize("k", [1, 2, 3, 6, 12, 20])
def test_jitter_stays_within_ten_percent(k: int) -> None:
    policy = Backoff(base=2, cap=3600, jitter=0.1)
    nominal = min(3600.0, 2.0**k)
    rng = random.Random(1234 + k)
    samples = [policy.delay(k, rng) for _ in range(2000)]
    assert all(nominal * 0.9 <= s <= nominal * 1.1 for s in samples)
    # It really spreads: both sides of the nominal delay, and not all the same.
    assert min(samples) < nominal < max(samples)
    assert max(samples) - min(samples) > nominal * 0.15


def test_jitter_is_reproducible_with_a_seeded_rng() -> None:
    policy = Backoff(jitter=0.1)
    first = [policy.delay(3, random.Random(7)) for _ in range(3)]
    assert first[0] == first[1] == first[2]


def test_retry_numbers_start_at_one() -> None:
    with pytest.raises(nbqueue.InvalidArgument):
        Backoff().delay(0)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"base": -1},
        {"cap": -5},
        {"jitter": -0.1},
        {"jitter": 1.5},
        {"base": math.nan},
        {"cap": math.inf},
        {"jitter": math.nan},
        {"base": "2"},
        {"cap": None},
        {"base": True},
    ],
    ids=repr,
)
def test_bad_arguments_are_refused(kwargs: dict[str, object]) -> None:
    with pytest.raises(nbqueue.InvalidArgument):
        Backoff(**kwargs)  # type: ignore[arg-type]


def test_round_trips_through_its_stored_form() -> None:
    policy = Backoff(base=3, cap=60, jitter=0.2)
    assert Backoff.from_dict(policy.to_dict()) == policy
    assert Backoff.from_dict(None) == Backoff()
