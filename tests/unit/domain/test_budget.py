"""The weekly budget window and the remaining tokens."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, available_timezones

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent_engine.domain.budget import Budget, BudgetWindow, week_window

HOUR = timedelta(hours=1)


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)  # type: ignore[misc]


def test_window_in_utc_is_sunday_to_sunday() -> None:
    window = week_window(utc(2024, 5, 15, 12), ZoneInfo("UTC"))  # a Wednesday
    assert window == BudgetWindow(start=utc(2024, 5, 12), end=utc(2024, 5, 19), timezone="UTC")
    assert window.duration == 168 * HOUR


def test_window_is_in_the_organisation_zone() -> None:
    # Sunday 02:00 UTC is still Saturday evening in New York: the previous week.
    window = week_window(utc(2024, 5, 19, 2), ZoneInfo("America/New_York"))
    assert window.start == utc(2024, 5, 12, 4)
    assert window.end == utc(2024, 5, 19, 4)
    assert window.timezone == "America/New_York"


def test_sunday_midnight_starts_a_new_week() -> None:
    zone = ZoneInfo("Europe/Berlin")
    sunday = datetime(2024, 5, 19, tzinfo=zone)
    assert week_window(sunday, zone).start == sunday
    assert week_window(sunday - timedelta(microseconds=1), zone).end == sunday


@pytest.mark.parametrize(
    ("zone", "now", "hours"),
    [
        ("America/New_York", utc(2024, 3, 12), 167),  # spring forward inside the week
        ("America/New_York", utc(2024, 11, 5), 169),  # fall back
        ("Europe/Berlin", utc(2024, 4, 2), 167),
        ("Europe/Berlin", utc(2024, 10, 30), 169),
        ("Australia/Lord_Howe", utc(2024, 10, 8), 167.5),  # 30-minute DST
        ("Australia/Lord_Howe", utc(2024, 4, 9), 168.5),
        ("Asia/Kolkata", utc(2024, 3, 12), 168),
        ("America/Santiago", utc(2024, 9, 10), 167),  # midnight itself is in the gap
    ],
)
def test_window_length_across_dst(zone: str, now: datetime, hours: float) -> None:
    window = week_window(now, ZoneInfo(zone))
    assert window.duration == timedelta(hours=hours)
    assert window.contains(now)


def test_window_starting_in_a_midnight_gap_starts_when_sunday_begins() -> None:
    santiago = ZoneInfo("America/Santiago")  # 2024-09-08 00:00 -> 01:00
    window = week_window(utc(2024, 9, 10), santiago)
    assert window.start.astimezone(santiago).isoformat() == "2024-09-08T01:00:00-03:00"


def test_naive_now_is_rejected() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        week_window(datetime(2024, 1, 1), ZoneInfo("UTC"))


WINDOW = BudgetWindow(start=utc(2024, 1, 7), end=utc(2024, 1, 14), timezone="UTC")


def test_no_cap_is_unlimited() -> None:
    budget = Budget(cap_tokens=None, used_tokens=10**9, window=WINDOW)
    assert budget.remaining_tokens is None
    assert not budget.exceeded


@pytest.mark.parametrize(
    ("cap", "used", "remaining", "exceeded"),
    [(1000, 0, 1000, False), (1000, 999, 1, False), (1000, 1000, 0, True), (1000, 1500, 0, True)],
)
def test_remaining_and_exceeded(cap: int, used: int, remaining: int, exceeded: bool) -> None:
    budget = Budget(cap_tokens=cap, used_tokens=used, window=WINDOW)
    assert budget.remaining_tokens == remaining
    assert budget.exceeded is exceeded


def test_zero_cap_is_always_exceeded() -> None:
    assert Budget(cap_tokens=0, used_tokens=0, window=WINDOW).exceeded


def first_instant_of_its_day(instant: datetime, zone: ZoneInfo) -> bool:
    day = instant.astimezone(zone).date()
    return (instant - timedelta(microseconds=1)).astimezone(zone).date() < day


@settings(max_examples=300, deadline=None)
@given(
    zone=st.sampled_from(sorted(available_timezones())).map(ZoneInfo),
    now=st.datetimes(
        min_value=datetime(1970, 1, 1), max_value=datetime(2037, 12, 31), timezones=st.just(UTC)
    ),
)
def test_window_is_the_local_week_around_now(zone: ZoneInfo, now: datetime) -> None:
    window = week_window(now, zone)
    assert window.start <= now < window.end
    start, end = window.start.astimezone(zone), window.end.astimezone(zone)
    assert start.weekday() == 6
    assert end.date() - start.date() == timedelta(days=7)
    assert first_instant_of_its_day(window.start, zone)
    assert first_instant_of_its_day(window.end, zone)


DST_ZONES = [
    "America/New_York",
    "Europe/Berlin",
    "Australia/Lord_Howe",
    "Asia/Kolkata",
    "UTC",
    "America/Santiago",
    "Pacific/Chatham",
    "Europe/London",
    "Australia/Sydney",
]


@settings(max_examples=200, deadline=None)
@given(
    zone=st.sampled_from(DST_ZONES).map(ZoneInfo),
    now=st.datetimes(
        min_value=datetime(2000, 1, 1), max_value=datetime(2037, 12, 31), timezones=st.just(UTC)
    ),
)
def test_window_lasts_a_week_give_or_take_the_dst_shift(zone: ZoneInfo, now: datetime) -> None:
    window = week_window(now, zone)
    assert window.duration in {timedelta(hours=h) for h in (167, 167.5, 168, 168.5, 169)}
    assert window.contains(now)


# --- alert thresholds ---------------------------------------------------------------------------


def test_alert_percents_are_1_to_100_sorted_and_unique() -> None:
    from agent_engine.domain.budget import AlertPercentsError, parse_alert_percents

    assert parse_alert_percents([80, 100]) == (80, 100)
    assert parse_alert_percents([]) == ()
    for bad in ([0, 50], [50, 101], [100, 80], [50, 50], [True]):
        with pytest.raises(AlertPercentsError):
            parse_alert_percents(bad)


def test_a_threshold_is_reached_at_exactly_its_share_of_the_cap() -> None:
    from agent_engine.domain.budget import thresholds_reached

    assert thresholds_reached(11, 15, [80, 100]) == []
    assert thresholds_reached(12, 15, [80, 100]) == [80]  # 80 % of 15 is 12, exactly
    assert thresholds_reached(15, 15, [50, 100]) == [50, 100]  # one run may cross both
    assert thresholds_reached(10**9, None, [50, 100]) == []
