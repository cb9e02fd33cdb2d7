"""Schedules: cron expressions (UTC) and `every` intervals, as tables of expected slots."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

import nbqueue
from nbqueue.schedule import Cron, Every


def _at(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


# June 2024: the 7th and 14th are Fridays, the 8th a Saturday, the 9th a Sunday, the 13th a Thursday.
@pytest.mark.parametrize(
    ("expression", "at", "latest"),
    [
        ("*/5 * * * *", "2024-06-10 12:07:30", "2024-06-10 12:05"),
        ("*/5 * * * *", "2024-06-10 12:05:00", "2024-06-10 12:05"),
        ("* * * * *", "2024-06-10 12:05:59", "2024-06-10 12:05"),
        ("0-10/5 * * * *", "2024-06-10 12:59", "2024-06-10 12:10"),
        ("7,19,45 * * * *", "2024-06-10 12:30", "2024-06-10 12:19"),
        ("0 9-17 * * 1-5", "2024-06-08 10:00", "2024-06-07 17:00"),
        ("0 9-17 * * 1-5", "2024-06-10 08:59", "2024-06-07 17:00"),
        ("30 2 * * 7", "2024-06-10 00:00", "2024-06-09 02:30"),
        ("30 2 * * 0", "2024-06-10 00:00", "2024-06-09 02:30"),
        ("0 0 * * 1,3", "2024-06-11 12:00", "2024-06-10 00:00"),
        ("0 0 1,15 * *", "2024-06-14 08:00", "2024-06-01 00:00"),
        ("0 12 13 * 5", "2024-06-12 13:00", "2024-06-07 12:00"),  # day 13 OR Friday
        ("0 12 13 * 5", "2024-06-13 13:00", "2024-06-13 12:00"),  # the 13th, a Thursday
        ("0 12 13 * 5", "2024-06-14 12:30", "2024-06-14 12:00"),  # a Friday, not the 13th
        ("15 10 * 2 *", "2024-06-01 00:00", "2024-02-29 10:15"),
        ("0 0 29 2 *", "2025-06-01 00:00", "2024-02-29 00:00"),
        ("59 23 31 12 *", "2024-06-01 00:00", "2023-12-31 23:59"),
    ],
)
def test_cron_latest_slot(expression: str, at: str, latest: str) -> None:
    assert Cron.parse(expression).latest(_at(at)) == _at(latest)


def test_cron_evaluates_in_utc() -> None:
    at = datetime(2024, 6, 10, 16, 7, tzinfo=timezone(timedelta(hours=2)))  # 14:07 UTC
    latest = Cron.parse("0 15 * * *").latest(at)
    assert latest == _at("2024-06-09 15:00")  # 15:00 UTC yesterday, not 15:00 here today
    assert latest is not None and latest.tzinfo == UTC


def test_every_slots_are_aligned_to_the_epoch() -> None:
    assert Every(3600).latest(_at("2024-06-10 12:34:56")) == _at("2024-06-10 12:00")
    assert Every(90).latest(_at("2024-06-10 00:01:31")) == _at("2024-06-10 00:01:30")


def test_a_cron_that_never_matches_gives_up() -> None:
    """30 February never comes: documented to give up (None), not to loop or crash."""
    for expression in ("0 0 30 2 *", "0 0 31 4 *"):
        try:
            cron = Cron.parse(expression)
        except nbqueue.InvalidArgument:
            continue  # refusing it up front would be fine too
        assert cron.latest(_at("2024-06-01 00:00")) is None


@pytest.mark.parametrize(
    "expression",
    [
        "",
        "* * * *",
        "* * * * * *",
        "60 * * * *",
        "* 24 * * *",
        "* * 0 * *",
        "* * 32 * *",
        "* * * 0 *",
        "* * * 13 *",
        "* * * * 8",
        "*/0 * * * *",
        "a * * * *",
        "5-1 * * * *",
        "1,,2 * * * *",
        "-1 * * * *",
        None,
        5,
    ],
)
def test_bad_crons_are_refused(expression: Any) -> None:
    with pytest.raises(nbqueue.InvalidArgument):
        Cron.parse(expression)
