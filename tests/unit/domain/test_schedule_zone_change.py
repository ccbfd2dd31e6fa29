"""A zone change moves calendar slots, never firing twice in one local day or week."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from hypothesis import given
from hypothesis import strategies as st

from agent_engine.domain.schedule import CalendarSchedule, next_slots, slot_after_zone_change

NEW_YORK = ZoneInfo("America/New_York")
BERLIN = ZoneInfo("Europe/Berlin")
TOKYO = ZoneInfo("Asia/Tokyo")
ZONES = [NEW_YORK, BERLIN, TOKYO, ZoneInfo("Australia/Lord_Howe"), ZoneInfo("Pacific/Apia")]

DAILY_9 = CalendarSchedule(cadence="daily", time="09:00")
MONDAY_9 = CalendarSchedule(cadence="weekly", weekday=0, time="09:00")


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)  # type: ignore[misc]


def test_with_no_slot_fired_it_is_the_next_slot_in_the_new_zone() -> None:
    now = utc(2025, 3, 12, 10, 0)  # 06:00 in New York
    slot = slot_after_zone_change(DAILY_9, now=now, zone=NEW_YORK, last_fired=None)
    assert slot.astimezone(NEW_YORK).isoformat() == "2025-03-12T09:00:00-04:00"


def test_a_slot_fired_earlier_that_local_day_moves_the_next_one_to_the_next_day() -> None:
    # 09:00 in Berlin fired at 08:00 UTC, 04:00 in New York; at 10:00 UTC the owner moves there.
    fired = utc(2025, 3, 12, 8, 0)
    now = utc(2025, 3, 12, 10, 0)
    slot = slot_after_zone_change(DAILY_9, now=now, zone=NEW_YORK, last_fired=fired)
    # Not 09:00 New York today, which would be a second run on the same local date.
    assert slot.astimezone(NEW_YORK).isoformat() == "2025-03-13T09:00:00-04:00"


def test_a_slot_fired_on_the_previous_local_day_leaves_today_free() -> None:
    # 09:00 in New York fired at 13:00 UTC; the owner moves to Berlin at 20:00 UTC (21:00 there).
    fired = utc(2025, 3, 11, 13, 0)
    now = utc(2025, 3, 11, 20, 0)
    slot = slot_after_zone_change(DAILY_9, now=now, zone=BERLIN, last_fired=fired)
    assert slot.astimezone(BERLIN).isoformat() == "2025-03-12T09:00:00+01:00"


def test_weekly_slots_skip_the_local_week_of_the_last_fire() -> None:
    # Monday 09:00 in Tokyo fired: Sunday 20:00 in New York, the week before there.
    fired = utc(2025, 3, 10, 0, 0)
    now = utc(2025, 3, 10, 1, 0)
    # In New York that fire was on Sunday: Monday 09:00 of the new week is free.
    in_new_york = slot_after_zone_change(MONDAY_9, now=now, zone=NEW_YORK, last_fired=fired)
    assert in_new_york.astimezone(NEW_YORK).isoformat() == "2025-03-10T09:00:00-04:00"
    # A Berlin owner whose Monday 09:00 fired this morning moves to New York: next Monday.
    fired_berlin = utc(2025, 3, 10, 8, 0)
    later = slot_after_zone_change(
        MONDAY_9, now=utc(2025, 3, 10, 9, 0), zone=NEW_YORK, last_fired=fired_berlin
    )
    assert later.astimezone(NEW_YORK).isoformat() == "2025-03-17T09:00:00-04:00"


@given(
    old=st.sampled_from(ZONES),
    new=st.sampled_from(ZONES),
    start=st.datetimes(min_value=datetime(2024, 1, 1), max_value=datetime(2026, 12, 31)),
    gap_minutes=st.integers(min_value=0, max_value=3 * 24 * 60),
    weekly=st.booleans(),
)
def test_never_twice_in_one_local_day_or_week_of_the_new_zone(
    old: ZoneInfo, new: ZoneInfo, start: datetime, gap_minutes: int, weekly: bool
) -> None:
    schedule = MONDAY_9 if weekly else DAILY_9
    # The last slot that fired under the old zone, then the change some time later.
    fired = next_slots(schedule, after=start.replace(tzinfo=UTC), zone=old, count=1)[0]
    now = fired + timedelta(minutes=gap_minutes)
    slot = slot_after_zone_change(schedule, now=now, zone=new, last_fired=fired)
    assert slot > now
    fired_local, slot_local = fired.astimezone(new).date(), slot.astimezone(new).date()
    if weekly:
        assert slot_local.isocalendar()[:2] != fired_local.isocalendar()[:2]
    else:
        assert slot_local > fired_local
    # And it is a slot of the schedule in the new zone.
    assert next_slots(schedule, after=slot - timedelta(microseconds=1), zone=new, count=1) == [slot]
