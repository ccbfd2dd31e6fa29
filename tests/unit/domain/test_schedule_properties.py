"""Property tests: slot invariants over many zones and dates."""

from __future__ import annotations

from datetime import UTC, date, datetime, time, timedelta
from itertools import pairwise
from zoneinfo import ZoneInfo, available_timezones

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from agent_engine.domain.schedule import (
    CalendarSchedule,
    IntervalSchedule,
    next_slots,
    slot_after_fire,
)

ZONES = sorted(available_timezones())
SLOTS = 20
fast = settings(max_examples=200, deadline=None)

zones = st.sampled_from(ZONES).map(ZoneInfo)
instants = st.datetimes(
    min_value=datetime(1970, 1, 1), max_value=datetime(2037, 12, 31), timezones=st.just(UTC)
)
times = st.builds(lambda h, m: f"{h:02d}:{m:02d}", st.integers(0, 23), st.integers(0, 59))
intervals = st.builds(IntervalSchedule, every_hours=st.integers(1, 168))
dailies = st.builds(CalendarSchedule, cadence=st.just("daily"), time=times)
weeklies = st.builds(
    CalendarSchedule, cadence=st.just("weekly"), weekday=st.integers(0, 6), time=times
)
schedules = st.one_of(intervals, dailies, weeklies)


def transitions(zone: ZoneInfo, year: int) -> list[datetime]:
    """The instants (to the minute) in a year at which the zone's UTC offset changes."""
    found = []
    day = datetime(year, 1, 1, tzinfo=UTC)
    while day.year == year:
        nxt = day + timedelta(days=1)
        if day.astimezone(zone).utcoffset() != nxt.astimezone(zone).utcoffset():
            low, high = day, nxt
            while high - low > timedelta(minutes=1):
                mid = low + (high - low) / 2
                same = mid.astimezone(zone).utcoffset() == low.astimezone(zone).utcoffset()
                low, high = (mid, high) if same else (low, mid)
            found.append(high)
        day = nxt
    return found


@st.composite
def zone_and_after(draw: st.DrawFn) -> tuple[ZoneInfo, datetime]:
    """Half the time an arbitrary instant, half the time a few days before an offset change."""
    zone = draw(zones)
    if draw(st.booleans()):
        changes = transitions(zone, draw(st.integers(1970, 2037)))
        if changes:
            change = draw(st.sampled_from(changes))
            before = draw(st.timedeltas(timedelta(0), timedelta(days=8)))
            return zone, change - before
    return zone, draw(instants)


def stays_on_its_date(day: date, at: str, zone: ZoneInfo) -> bool:
    """False where the zone skipped the date or a gap pushed this wall time into the next day.

    There (Pacific/Apia 2011-12-30; America/Nuuk 23:xx on the last Saturday of March) the slot of
    a date fires on the next one; test_schedule_slots pins that behaviour instead.
    """
    hours, minutes = map(int, at.split(":"))
    fired = datetime.combine(day, time(hours, minutes), tzinfo=zone).astimezone(UTC)
    return fired.astimezone(zone).date() == day


def regular_days(first: date, last: date, at: str, zone: ZoneInfo) -> bool:
    days = (last - first).days
    return all(stays_on_its_date(first + timedelta(days=i), at, zone) for i in range(-1, days + 2))


@fast
@given(schedule=schedules, case=zone_and_after())
def test_slots_strictly_increase_and_follow_after(
    schedule: IntervalSchedule | CalendarSchedule, case: tuple[ZoneInfo, datetime]
) -> None:
    zone, after = case
    slots = next_slots(schedule, after=after, zone=zone, count=SLOTS)
    assert len(slots) == SLOTS
    assert slots[0] > after
    assert all(a < b for a, b in pairwise(slots))


@fast
@given(schedule=intervals, after=instants, anchor=instants, zone=zones)
def test_interval_slots_are_a_fixed_grid(
    schedule: IntervalSchedule, after: datetime, anchor: datetime, zone: ZoneInfo
) -> None:
    slots = next_slots(schedule, after=after, zone=zone, count=5, anchor=anchor)
    step = timedelta(hours=schedule.every_hours)
    assert slots[0] > after
    assert slots[0] - step <= max(after, anchor)  # the first one after `after`, none skipped
    assert (slots[0] - anchor) % step == timedelta(0)
    assert all(b - a == step for a, b in pairwise(slots))


@fast
@given(schedule=dailies, case=zone_and_after())
def test_daily_fires_exactly_once_per_local_day(
    schedule: CalendarSchedule, case: tuple[ZoneInfo, datetime]
) -> None:
    zone, after = case
    slots = next_slots(schedule, after=after, zone=zone, count=SLOTS)
    days = [slot.astimezone(zone).date() for slot in slots]
    assume(regular_days(days[0], days[-1], schedule.time, zone))
    assert all(b - a == timedelta(days=1) for a, b in pairwise(days))
    # No day between `after` and the first slot was left out.
    assert days[0] - after.astimezone(zone).date() <= timedelta(days=1)


@fast
@given(schedule=weeklies, case=zone_and_after())
def test_weekly_lands_on_its_weekday_once_a_week(
    schedule: CalendarSchedule, case: tuple[ZoneInfo, datetime]
) -> None:
    zone, after = case
    slots = next_slots(schedule, after=after, zone=zone, count=SLOTS)
    days = [slot.astimezone(zone).date() for slot in slots]
    assume(regular_days(days[0] - timedelta(days=7), days[-1], schedule.time, zone))
    assert all(day.weekday() == schedule.weekday for day in days)
    assert all(b - a == timedelta(days=7) for a, b in pairwise(days))
    assert days[0] - after.astimezone(zone).date() <= timedelta(days=7)


@fast
@given(schedule=dailies, case=zone_and_after())
def test_calendar_keeps_the_wall_time_unless_it_does_not_exist(
    schedule: CalendarSchedule, case: tuple[ZoneInfo, datetime]
) -> None:
    zone, after = case
    at = schedule.local_time
    for slot in next_slots(schedule, after=after, zone=zone, count=5):
        wall = slot.astimezone(zone)
        assume(stays_on_its_date(wall.date(), schedule.time, zone))
        naive = datetime.combine(wall.date(), at)
        if wall.time() == at:
            # An ambiguous time fires at its first occurrence: no earlier instant reads the same.
            other = naive.replace(tzinfo=zone, fold=1).astimezone(UTC)
            assert slot <= other
        else:
            # Only a nonexistent wall time moves, and only forward past the gap.
            round_trip = naive.replace(tzinfo=zone).astimezone(UTC).astimezone(zone)
            assert round_trip.replace(tzinfo=None) != naive
            assert wall.replace(tzinfo=None) > naive


@fast
@given(
    schedule=schedules,
    fired=instants,
    late=st.timedeltas(min_value=timedelta(0), max_value=timedelta(days=60)),
    zone=zones,
)
def test_coalescing_never_yields_a_past_slot(
    schedule: IntervalSchedule | CalendarSchedule,
    fired: datetime,
    late: timedelta,
    zone: ZoneInfo,
) -> None:
    now = fired + late
    nxt = slot_after_fire(schedule, fired_slot=fired, now=now, zone=zone)
    assert nxt > now
    assert nxt > fired
    # Coalesced into one: it is the first slot after now, not a catch-up of the missed ones.
    if isinstance(schedule, IntervalSchedule):
        assert nxt == next_slots(schedule, after=now, zone=zone, count=1, anchor=fired)[0]
        assert nxt - timedelta(hours=schedule.every_hours) <= now
    else:
        assert nxt == next_slots(schedule, after=now, zone=zone, count=1)[0]
