"""Slots of interval and calendar schedules, including DST in several zones."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from agent_engine.domain.schedule import (
    CalendarSchedule,
    IntervalSchedule,
    first_slot,
    next_slots,
    slot_after_fire,
)

NEW_YORK = ZoneInfo("America/New_York")
BERLIN = ZoneInfo("Europe/Berlin")
LORD_HOWE = ZoneInfo("Australia/Lord_Howe")  # 30-minute DST: +10:30 / +11:00
KOLKATA = ZoneInfo("Asia/Kolkata")  # no DST
UTC_ZONE = ZoneInfo("UTC")


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)  # type: ignore[misc]


def daily(time: str) -> CalendarSchedule:
    return CalendarSchedule(cadence="daily", time=time)


def weekly(weekday: int, time: str) -> CalendarSchedule:
    return CalendarSchedule(cadence="weekly", weekday=weekday, time=time)


def local(slots: list[datetime], zone: ZoneInfo) -> list[str]:
    return [slot.astimezone(zone).isoformat() for slot in slots]


# --- interval ---------------------------------------------------------------------------------


def test_interval_first_slot_is_n_hours_after_now() -> None:
    now = utc(2024, 5, 1, 10, 17, 3)
    assert first_slot(IntervalSchedule(every_hours=6), now=now, zone=NEW_YORK) == now + timedelta(
        hours=6
    )


def test_interval_slots_are_absolute_time_across_dst() -> None:
    # Every 24 h in New York across the spring-forward night: UTC stays fixed, wall clock moves.
    slots = next_slots(
        IntervalSchedule(every_hours=24), after=utc(2024, 3, 9, 14), zone=NEW_YORK, count=3
    )
    assert slots == [utc(2024, 3, 10, 14), utc(2024, 3, 11, 14), utc(2024, 3, 12, 14)]
    assert local(slots, NEW_YORK) == [
        "2024-03-10T10:00:00-04:00",
        "2024-03-11T10:00:00-04:00",
        "2024-03-12T10:00:00-04:00",
    ]


def test_interval_slots_follow_the_anchor_grid() -> None:
    anchor = utc(2024, 1, 1, 0)
    slots = next_slots(
        IntervalSchedule(every_hours=5),
        after=utc(2024, 1, 1, 12),
        zone=UTC_ZONE,
        count=3,
        anchor=anchor,
    )
    assert slots == [utc(2024, 1, 1, 15), utc(2024, 1, 1, 20), utc(2024, 1, 2, 1)]


def test_interval_slot_equal_to_after_is_excluded() -> None:
    anchor = utc(2024, 1, 1, 0)
    slots = next_slots(
        IntervalSchedule(every_hours=6),
        after=utc(2024, 1, 1, 12),
        zone=UTC_ZONE,
        count=1,
        anchor=anchor,
    )
    assert slots == [utc(2024, 1, 1, 18)]


def test_interval_anchor_in_the_future_starts_one_step_after_it() -> None:
    slots = next_slots(
        IntervalSchedule(every_hours=2),
        after=utc(2024, 1, 1, 0),
        zone=UTC_ZONE,
        count=2,
        anchor=utc(2024, 1, 1, 5),
    )
    assert slots == [utc(2024, 1, 1, 7), utc(2024, 1, 1, 9)]


def test_interval_missed_slots_coalesce_into_the_first_future_one() -> None:
    fired = utc(2024, 6, 1, 10)
    now = fired + timedelta(days=3, hours=1)  # the scheduler was down for three days
    nxt = slot_after_fire(IntervalSchedule(every_hours=6), fired_slot=fired, now=now, zone=BERLIN)
    assert nxt == utc(2024, 6, 4, 16)


def test_interval_slot_after_an_on_time_fire_is_one_step_later() -> None:
    fired = utc(2024, 6, 1, 10)
    nxt = slot_after_fire(
        IntervalSchedule(every_hours=168),
        fired_slot=fired,
        now=fired + timedelta(seconds=2),
        zone=BERLIN,
    )
    assert nxt == fired + timedelta(days=7)


def test_slot_after_fire_never_returns_the_fired_slot_when_now_is_early() -> None:
    fired = utc(2024, 6, 1, 9)
    schedule = daily("11:00")  # 09:00 UTC in Berlin summer time
    nxt = slot_after_fire(schedule, fired_slot=fired, now=fired - timedelta(seconds=5), zone=BERLIN)
    assert nxt == utc(2024, 6, 2, 9)


# --- calendar in zones with and without DST ------------------------------------------------------


def test_daily_in_a_zone_without_dst() -> None:
    slots = next_slots(daily("09:00"), after=utc(2024, 3, 9, 12), zone=KOLKATA, count=3)
    assert slots == [utc(2024, 3, 10, 3, 30), utc(2024, 3, 11, 3, 30), utc(2024, 3, 12, 3, 30)]


def test_daily_in_utc_excludes_a_slot_equal_to_after() -> None:
    slots = next_slots(daily("06:00"), after=utc(2024, 2, 28, 6), zone=UTC_ZONE, count=3)
    assert slots == [utc(2024, 2, 29, 6), utc(2024, 3, 1, 6), utc(2024, 3, 2, 6)]


def test_daily_later_today_comes_first() -> None:
    assert first_slot(daily("23:59"), now=utc(2024, 1, 1, 0, 0), zone=UTC_ZONE) == utc(
        2024, 1, 1, 23, 59
    )


def test_new_york_spring_forward_fires_past_the_gap() -> None:
    slots = next_slots(daily("02:30"), after=utc(2024, 3, 9, 12), zone=NEW_YORK, count=3)
    assert local(slots, NEW_YORK) == [
        "2024-03-10T03:30:00-04:00",  # 02:30 does not exist: the same 30 minutes past the gap
        "2024-03-11T02:30:00-04:00",
        "2024-03-12T02:30:00-04:00",
    ]


def test_new_york_fall_back_fires_once_at_the_first_occurrence() -> None:
    slots = next_slots(daily("01:30"), after=utc(2024, 11, 2, 12), zone=NEW_YORK, count=3)
    assert slots == [utc(2024, 11, 3, 5, 30), utc(2024, 11, 4, 6, 30), utc(2024, 11, 5, 6, 30)]
    assert local(slots, NEW_YORK)[0] == "2024-11-03T01:30:00-04:00"


def test_new_york_weekly_on_the_spring_forward_sunday() -> None:
    slots = next_slots(weekly(6, "02:30"), after=utc(2024, 3, 4), zone=NEW_YORK, count=2)
    assert local(slots, NEW_YORK) == ["2024-03-10T03:30:00-04:00", "2024-03-17T02:30:00-04:00"]


def test_berlin_spring_forward_and_fall_back() -> None:
    spring = next_slots(daily("02:30"), after=utc(2024, 3, 30, 12), zone=BERLIN, count=2)
    assert local(spring, BERLIN) == ["2024-03-31T03:30:00+02:00", "2024-04-01T02:30:00+02:00"]
    autumn = next_slots(daily("02:30"), after=utc(2024, 10, 26, 12), zone=BERLIN, count=2)
    assert autumn == [utc(2024, 10, 27, 0, 30), utc(2024, 10, 28, 1, 30)]
    assert local(autumn, BERLIN) == ["2024-10-27T02:30:00+02:00", "2024-10-28T02:30:00+01:00"]


def test_berlin_weekly_lands_on_its_weekday() -> None:
    slots = next_slots(weekly(2, "08:00"), after=utc(2024, 3, 25), zone=BERLIN, count=3)
    assert local(slots, BERLIN) == [
        "2024-03-27T08:00:00+01:00",
        "2024-04-03T08:00:00+02:00",
        "2024-04-10T08:00:00+02:00",
    ]


def test_lord_howe_half_hour_gap_fires_half_an_hour_later() -> None:
    # 2024-10-06 02:00 -> 02:30: 02:15 does not exist and fires at 02:45.
    slots = next_slots(daily("02:15"), after=utc(2024, 10, 5, 12), zone=LORD_HOWE, count=2)
    assert local(slots, LORD_HOWE) == ["2024-10-06T02:45:00+11:00", "2024-10-07T02:15:00+11:00"]
    assert slots[0] == utc(2024, 10, 5, 15, 45)


def test_lord_howe_half_hour_overlap_fires_once() -> None:
    # 2024-04-07 02:00 -> 01:30: 01:45 happens twice; only the first counts.
    slots = next_slots(daily("01:45"), after=utc(2024, 4, 6, 12), zone=LORD_HOWE, count=2)
    assert slots == [utc(2024, 4, 6, 14, 45), utc(2024, 4, 7, 15, 15)]
    assert local(slots, LORD_HOWE) == ["2024-04-07T01:45:00+11:00", "2024-04-08T01:45:00+10:30"]


def test_calendar_slot_after_fire_coalesces() -> None:
    fired = utc(2024, 1, 1, 9)  # Monday 09:00 UTC
    nxt = slot_after_fire(daily("09:00"), fired_slot=fired, now=utc(2024, 1, 4, 10), zone=UTC_ZONE)
    assert nxt == utc(2024, 1, 5, 9)
    weekly_next = slot_after_fire(
        weekly(0, "09:00"), fired_slot=fired, now=utc(2024, 1, 20), zone=UTC_ZONE
    )
    assert weekly_next == utc(2024, 1, 22, 9)


def test_a_skipped_local_day_yields_no_duplicate() -> None:
    # Samoa skipped 2011-12-30 when it crossed the date line.
    apia = ZoneInfo("Pacific/Apia")
    slots = next_slots(daily("09:00"), after=utc(2011, 12, 28), zone=apia, count=3)
    assert local(slots, apia) == [
        "2011-12-28T09:00:00-10:00",
        "2011-12-29T09:00:00-10:00",
        "2011-12-31T09:00:00+14:00",
    ]


def test_a_gap_over_midnight_pushes_the_slot_into_the_next_day() -> None:
    # Pyongyang went from +08:30 to +09:00 at 23:30 on 2018-05-04: 23:45 that day did not exist.
    pyongyang = ZoneInfo("Asia/Pyongyang")
    slots = next_slots(daily("23:45"), after=utc(2018, 5, 4), zone=pyongyang, count=2)
    assert local(slots, pyongyang) == ["2018-05-05T00:15:00+09:00", "2018-05-05T23:45:00+09:00"]


# --- arguments ---------------------------------------------------------------------------------


def test_count_zero_gives_no_slots() -> None:
    assert next_slots(daily("09:00"), after=utc(2024, 1, 1), zone=UTC_ZONE, count=0) == []


def test_negative_count_is_rejected() -> None:
    with pytest.raises(ValueError, match="count"):
        next_slots(daily("09:00"), after=utc(2024, 1, 1), zone=UTC_ZONE, count=-1)


@pytest.mark.parametrize("schedule", [daily("09:00"), IntervalSchedule(every_hours=1)])
def test_naive_datetimes_are_rejected(schedule: CalendarSchedule | IntervalSchedule) -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        next_slots(schedule, after=datetime(2024, 1, 1), zone=UTC_ZONE, count=1)


def test_naive_anchor_is_rejected() -> None:
    with pytest.raises(ValueError, match="anchor"):
        next_slots(
            IntervalSchedule(every_hours=1),
            after=utc(2024, 1, 1),
            zone=UTC_ZONE,
            count=1,
            anchor=datetime(2024, 1, 1),
        )


def test_after_in_another_offset_is_the_same_instant() -> None:
    after = datetime(2024, 3, 9, 7, tzinfo=ZoneInfo("Asia/Tokyo"))  # 2024-03-08 22:00 UTC
    assert next_slots(daily("23:00"), after=after, zone=UTC_ZONE, count=1) == [utc(2024, 3, 8, 23)]


def test_slots_are_utc() -> None:
    slots = next_slots(weekly(4, "17:00"), after=utc(2024, 1, 1), zone=NEW_YORK, count=2)
    assert all(slot.utcoffset() == timedelta(0) for slot in slots)


def test_a_gap_at_the_end_of_the_day_fires_early_the_next_day() -> None:
    # Nuuk goes from -02:00 to -01:00 at 23:00 on the last Saturday of March (2025-03-29):
    # 23:30 that Saturday never happens, so it fires the same 30 minutes past the gap.
    nuuk = ZoneInfo("America/Nuuk")
    slots = next_slots(daily("23:30"), after=utc(2025, 3, 28, 12), zone=nuuk, count=3)
    assert local(slots, nuuk) == [
        "2025-03-28T23:30:00-02:00",
        "2025-03-30T00:30:00-01:00",
        "2025-03-30T23:30:00-01:00",
    ]
    saturday = next_slots(weekly(5, "23:30"), after=utc(2025, 3, 23, 12), zone=nuuk, count=2)
    assert local(saturday, nuuk) == ["2025-03-30T00:30:00-01:00", "2025-04-05T23:30:00-01:00"]
