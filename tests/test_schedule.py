"""Schedules: cron expressions (UTC or a named zone, across daylight saving) and `every`
intervals, as tables of expected slots."""

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


# -- steps, boundaries, whole minutes, impossible dates -------------------------------------------


def slots(expression: str, start: str, end: str) -> list[str]:
    """Every slot of `expression` from `start` to `end` (both included), found through latest() alone."""
    cron = Cron.parse(expression)
    found = []
    moment = cron.latest(_at(end))
    while moment is not None and moment >= _at(start):
        found.append(moment.strftime("%Y-%m-%d %H:%M"))
        moment = cron.latest(moment - timedelta(minutes=1))
    return found[::-1]


@pytest.mark.parametrize(
    ("expression", "start", "end", "expected"),
    [
        # a/n: from a, every n, to the end of the field's range
        ("5/15 * * * *", "2024-06-10 12:00", "2024-06-10 12:59", ["12:05", "12:20", "12:35", "12:50"]),
        ("10-50/20 * * * *", "2024-06-10 12:00", "2024-06-10 12:59", ["12:10", "12:30", "12:50"]),
        ("0/25 * * * *", "2024-06-10 12:00", "2024-06-10 12:59", ["12:00", "12:25", "12:50"]),
        ("50/5 * * * *", "2024-06-10 12:00", "2024-06-10 12:59", ["12:50", "12:55"]),
        ("58/7 * * * *", "2024-06-10 12:00", "2024-06-10 12:59", ["12:58"]),
        ("1,40/10 * * * *", "2024-06-10 12:00", "2024-06-10 12:59", ["12:01", "12:40", "12:50"]),
        ("*/20 * * * *", "2024-06-10 12:00", "2024-06-10 12:59", ["12:00", "12:20", "12:40"]),
        ("0 5/6 * * *", "2024-06-10 00:00", "2024-06-10 23:59", ["05:00", "11:00", "17:00", "23:00"]),
        ("0 0 10/10 6 *", "2024-06-01 00:00", "2024-06-30 23:59", ["06-10", "06-20", "06-30"]),
        ("0 0 1 2/5 *", "2024-01-01 00:00", "2024-12-31 23:59", ["02-01", "07-01", "12-01"]),
    ],
)
def test_cron_steps_run_to_the_end_of_the_range(
    expression: str, start: str, end: str, expected: list[str]
) -> None:
    found = slots(expression, start, end)
    if ":" in expected[0]:  # times of one day
        assert [slot[-5:] for slot in found] == expected
        assert {slot[:10] for slot in found} == {start[:10]}
    else:  # midnights, as month-day
        assert [slot[5:10] for slot in found] == expected
        assert {slot[-5:] for slot in found} == {"00:00"}


@pytest.mark.parametrize(
    ("expression", "at", "latest"),
    [
        ("59 * * * *", "2024-06-10 10:58:30", "2024-06-10 09:59"),  # back over an hour
        ("59 * * * *", "2024-06-10 10:00", "2024-06-10 09:59"),
        ("59 * * * *", "2024-06-10 10:59:59", "2024-06-10 10:59"),
        ("59 * * * *", "2024-06-10 00:30", "2024-06-09 23:59"),  # back over a day
        ("30 * * * *", "2024-06-10 00:10", "2024-06-09 23:30"),
        ("59 22 * * *", "2024-06-10 23:00", "2024-06-10 22:59"),
        ("59 23 * * *", "2024-06-11 00:30", "2024-06-10 23:59"),  # the previous day's 23:59
        ("59 23 * * *", "2024-06-10 23:58", "2024-06-09 23:59"),
        ("59 23 * * *", "2024-07-01 00:30", "2024-06-30 23:59"),  # back over a month
        ("59 23 * * *", "2024-03-01 00:00", "2024-02-29 23:59"),  # into a leap day
        ("59 23 * * *", "2023-03-01 00:00", "2023-02-28 23:59"),
        ("59 23 * * *", "2024-01-01 00:00:30", "2023-12-31 23:59"),  # back over a year
        ("59 * * * *", "2025-01-01 00:30", "2024-12-31 23:59"),
        ("59 23 31 * *", "2024-07-01 00:00", "2024-05-31 23:59"),  # June has no 31st
        ("59 23 * * 5", "2024-06-10 00:00", "2024-06-07 23:59"),  # the last Friday
        ("59 23 * 2 *", "2024-06-01 00:00", "2024-02-29 23:59"),
    ],
)
def test_cron_latest_slot_at_minute_59_across_hours_days_months_and_years(
    expression: str, at: str, latest: str
) -> None:
    assert Cron.parse(expression).latest(_at(at)) == _at(latest)


@pytest.mark.parametrize(
    ("expression", "latest"),
    [
        ("* * * * *", "2024-06-10 12:34"),
        ("*/5 * * * *", "2024-06-10 12:30"),
        ("34 * * * *", "2024-06-10 12:34"),
        ("59 * * * *", "2024-06-10 11:59"),
        ("0 0 * * *", "2024-06-10 00:00"),
    ],
)
def test_cron_slots_are_whole_minutes(expression: str, latest: str) -> None:
    slot = Cron.parse(expression).latest(datetime(2024, 6, 10, 12, 34, 56, 789123, tzinfo=UTC))
    assert slot == _at(latest)
    assert slot is not None and (slot.second, slot.microsecond) == (0, 0)
    assert slot.tzinfo == UTC


@pytest.mark.parametrize(
    ("seconds", "latest"),
    [
        (1, "2024-06-10 12:34:56"),
        (60, "2024-06-10 12:34:00"),
        (3600, "2024-06-10 12:00:00"),
    ],
)
def test_every_slots_are_whole_seconds(seconds: float, latest: str) -> None:
    slot = Every(seconds).latest(datetime(2024, 6, 10, 12, 34, 56, 789123, tzinfo=UTC))
    assert slot == _at(latest)
    assert slot is not None and slot.microsecond == 0
    assert slot.tzinfo == UTC


@pytest.mark.parametrize(
    "expression",
    [
        "0 0 30 2 *",
        "0 0 31 2 *",
        "0 0 30-31 2 *",
        "0 0 31 4 *",
        "0 0 31 6 *",
        "0 0 31 9,11 *",
        "0 0 31 4,6 *",
    ],
)
def test_a_date_that_never_comes_is_refused_at_parse(expression: str) -> None:
    with pytest.raises(nbqueue.InvalidArgument):
        Cron.parse(expression)


@pytest.mark.parametrize(
    ("expression", "at", "latest"),
    [
        ("0 0 29 2 *", "2024-02-29 12:00", "2024-02-29 00:00"),
        ("0 0 29 2 *", "2024-02-28 23:59", "2020-02-29 00:00"),
        ("0 0 29 2 *", "2028-03-01 00:00", "2028-02-29 00:00"),
        ("0 0 29 2 *", "2101-01-01 00:00", "2096-02-29 00:00"),  # 2100 is not a leap year
        ("0 0 31 4,5 *", "2024-06-01 00:00", "2024-05-31 00:00"),  # one possible month is enough
        ("0 0 30 2 1", "2024-06-01 00:00", "2024-02-26 00:00"),  # day 30 OR a Monday: Mondays come
    ],
)
def test_a_date_that_comes_is_accepted(expression: str, at: str, latest: str) -> None:
    assert Cron.parse(expression).latest(_at(at)) == _at(latest)


@pytest.mark.parametrize(
    ("seconds", "at", "latest"),
    [
        (1, "2024-06-10 12:34:56", "2024-06-10 12:34:56"),
        (7, "1970-01-01 00:00:20", "1970-01-01 00:00:14"),  # counted from the epoch
        (45, "2024-06-10 00:00:44", "2024-06-10 00:00:00"),
        (90, "2024-06-10 00:01:29", "2024-06-10 00:00:00"),
        (90, "2024-06-10 00:01:30", "2024-06-10 00:01:30"),  # a slot is its own latest
        (300, "2024-06-10 12:07:30", "2024-06-10 12:05:00"),
        (3600, "2024-06-10 12:00:00", "2024-06-10 12:00:00"),
        (3600, "2024-06-10 11:59:59", "2024-06-10 11:00:00"),
        (5400, "2024-06-10 01:29:59", "2024-06-10 00:00:00"),  # 90 minutes: 16 slots a day
        (5400, "2024-06-10 01:30:00", "2024-06-10 01:30:00"),
        (7200, "2024-06-10 13:59:00", "2024-06-10 12:00:00"),  # even hours
        (86400, "2024-06-10 23:59:59", "2024-06-10 00:00:00"),  # midnight UTC
        (604800, "2024-06-10 12:00:00", "2024-06-06 00:00:00"),  # weeks start on Thursday, as 1970-01-01
        (604800, "2024-06-06 00:00:00", "2024-06-06 00:00:00"),
    ],
)
def test_every_table(seconds: float, at: str, latest: str) -> None:
    assert Every(seconds).latest(_at(at)) == _at(latest)


def test_every_evaluates_in_utc() -> None:
    at = datetime(2024, 6, 10, 1, 30, tzinfo=timezone(timedelta(hours=2)))  # 23:30 UTC on the 9th
    latest = Every(86400).latest(at)
    assert latest == _at("2024-06-09 00:00")  # the UTC midnight, not the local one
    assert latest is not None and latest.tzinfo == UTC


# -- names, aliases and time zones (cronsim) --------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "at", "latest"),
    [
        ("0 9 * * MON-FRI", "2024-06-09 12:00", "2024-06-07 09:00"),  # Sunday: Friday's
        ("0 9 * * mon-fri", "2024-06-10 09:30", "2024-06-10 09:00"),
        ("0 0 1 JAN *", "2024-06-01 00:00", "2024-01-01 00:00"),
        ("@daily", "2024-06-10 12:00", "2024-06-10 00:00"),
        ("@midnight", "2024-06-10 12:00", "2024-06-10 00:00"),
        ("@hourly", "2024-06-10 12:34", "2024-06-10 12:00"),
        ("@weekly", "2024-06-12 12:00", "2024-06-09 00:00"),
        ("@monthly", "2024-06-12 12:00", "2024-06-01 00:00"),
        ("@yearly", "2024-06-12 12:00", "2024-01-01 00:00"),
        ("@annually", "2024-06-12 12:00", "2024-01-01 00:00"),
    ],
)
def test_cron_names_and_aliases(expression: str, at: str, latest: str) -> None:
    assert Cron.parse(expression).latest(_at(at)) == _at(latest)


def berlin(text: str, fold: int = 0) -> datetime:
    from zoneinfo import ZoneInfo

    return datetime.fromisoformat(text).replace(tzinfo=ZoneInfo("Europe/Berlin"), fold=fold)


def run_times(cron: Cron, start: datetime, end: datetime) -> list[str]:
    """The slots a worker ticking every minute from `start` to `end` enqueues (due_slot's rule)."""
    from nbqueue.clock import to_us
    from nbqueue.policy import due_slot

    last: int | None = None
    fired = []
    moment = start
    while moment <= end:
        slot = due_slot(cron, moment, last)
        if slot is not None:
            last = to_us(slot.at.timestamp())
            if slot.enqueue:
                fired.append(slot.at.astimezone(berlin("2024-01-01").tzinfo).strftime("%m-%d %H:%M%z"))
        moment += timedelta(minutes=1)
    return fired


def test_cron_in_a_time_zone_runs_at_local_time() -> None:
    cron = Cron.parse("0 9 * * MON-FRI", tz="Europe/Berlin")
    assert cron.latest(_at("2024-06-10 07:30")) == _at("2024-06-10 07:00")  # 09:00 CEST is 07:00 UTC
    assert cron.latest(_at("2024-12-09 08:30")) == _at("2024-12-09 08:00")  # 09:00 CET is 08:00 UTC
    assert cron.next_after(_at("2024-06-10 07:00")) == _at("2024-06-11 07:00")
    assert str(cron) == "cron 0 9 * * MON-FRI (Europe/Berlin)"


def test_a_job_in_the_hour_that_spring_forward_skips_runs_once() -> None:
    # 2024-03-31 in Berlin: 02:00 CET jumps to 03:00 CEST; 02:30 does not exist that day.
    cron = Cron.parse("30 2 * * *", tz="Europe/Berlin")
    fired = run_times(cron, berlin("2024-03-30 00:00"), berlin("2024-04-01 12:00"))
    assert fired == ["03-30 02:30+0100", "03-31 03:00+0200", "04-01 02:30+0200"]


def test_a_job_in_the_hour_that_fall_back_repeats_runs_once() -> None:
    # 2024-10-27 in Berlin: 03:00 CEST falls back to 02:00 CET; 02:30 happens twice.
    cron = Cron.parse("30 2 * * *", tz="Europe/Berlin")
    fired = run_times(cron, berlin("2024-10-26 00:00"), berlin("2024-10-28 12:00"))
    assert fired == ["10-26 02:30+0200", "10-27 02:30+0200", "10-28 02:30+0100"]


def test_an_hourly_job_runs_in_each_real_hour_across_a_fall_back() -> None:
    cron = Cron.parse("15 * * * *", tz="Europe/Berlin")
    fired = run_times(cron, berlin("2024-10-27 01:00"), berlin("2024-10-27 04:00"))
    assert fired == ["10-27 01:15+0200", "10-27 02:15+0200", "10-27 02:15+0100", "10-27 03:15+0100"]


@pytest.mark.parametrize("tz", ["Mars/Olympus", "", 5, "../etc/passwd"])
def test_a_bad_time_zone_is_refused(tz: Any) -> None:
    with pytest.raises(nbqueue.InvalidArgument, match="time zone"):
        Cron.parse("@daily", tz=tz)


def test_tz_with_every_is_refused(tmp_path: Any) -> None:
    q = nbqueue.Queue(tmp_path / "jobs.db")
    with pytest.raises(nbqueue.InvalidArgument, match="tz applies to cron"):
        q.periodic(every=60, tz="Europe/Berlin")
    q.close()
