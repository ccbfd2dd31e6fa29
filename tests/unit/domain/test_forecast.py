"""The budget forecast: remaining slots to the window's end, the pace, and where the cap is hit."""

from __future__ import annotations

import heapq
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, available_timezones

from hypothesis import given, settings
from hypothesis import strategies as st

from agent_engine.domain.budget import Budget, week_window
from agent_engine.domain.forecast import (
    AgentPace,
    BudgetForecast,
    expected_tokens_per_run,
    forecast_budget,
)
from agent_engine.domain.schedule import CalendarSchedule, IntervalSchedule, Schedule, next_slots

NEW_YORK = ZoneInfo("America/New_York")
UTC_ZONE = ZoneInfo("UTC")
HOURLY = IntervalSchedule(every_hours=1)


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)  # type: ignore[misc]


def budget(now: datetime, zone: ZoneInfo, *, used: int = 0, cap: int | None = None) -> Budget:
    return Budget(cap_tokens=cap, used_tokens=used, window=week_window(now, zone))


# --- the pace -----------------------------------------------------------------------------------


def test_expected_tokens_is_the_median_of_the_newest_ten() -> None:
    assert expected_tokens_per_run([]) is None
    assert expected_tokens_per_run([7]) == 7
    assert expected_tokens_per_run([30, 10, 20]) == 20
    # Even samples: the mean of the middle two, rounded half up.
    assert expected_tokens_per_run([10, 20]) == 15
    assert expected_tokens_per_run([10, 11]) == 11
    # Only the newest ten count (newest first): the eleventh, a huge outlier, is ignored.
    assert expected_tokens_per_run([100] * 10 + [1_000_000]) == 100


# --- slots to the window's end, across DST ------------------------------------------------------


def test_an_hourly_agent_counts_absolute_hours_across_spring_forward() -> None:
    # Sunday 2025-03-09 00:30 in New York; clocks jump 02:00 -> 03:00 that night, so the week
    # (to Sunday 2025-03-16 00:00 EDT = 04:00 UTC) is 167 hours long.
    now = utc(2025, 3, 9, 5, 30)
    pace = AgentPace(HOURLY, next_run_at=utc(2025, 3, 9, 6), zone=NEW_YORK, expected_tokens=100)

    result = forecast_budget(budget(now, NEW_YORK, used=400), [pace], now=now)

    # 06:00 UTC on the 9th to 03:00 UTC on the 16th: 166 slots.
    assert result == BudgetForecast(400 + 166 * 100, None, 0)


def test_a_daily_agent_keeps_its_wall_clock_time_across_spring_forward() -> None:
    now = utc(2025, 3, 9, 5, 30)
    daily = CalendarSchedule(cadence="daily", time="01:30")
    # 01:30 EST on the 9th (06:30 UTC), then 01:30 EDT (05:30 UTC) on the 10th to the 15th.
    pace = AgentPace(daily, next_run_at=utc(2025, 3, 9, 6, 30), zone=NEW_YORK, expected_tokens=1)

    assert forecast_budget(budget(now, NEW_YORK), [pace], now=now).projected_tokens == 7


def test_exhausts_at_is_the_slot_where_the_running_total_reaches_the_cap() -> None:
    now = utc(2025, 3, 9, 5, 30)
    hourly = AgentPace(HOURLY, next_run_at=utc(2025, 3, 9, 6), zone=NEW_YORK, expected_tokens=100)
    daily = AgentPace(
        CalendarSchedule(cadence="daily", time="01:30"),
        next_run_at=utc(2025, 3, 9, 6, 30),
        zone=NEW_YORK,
        expected_tokens=1000,
    )
    week = budget(now, NEW_YORK, used=400, cap=5000)

    result = forecast_budget(week, [hourly, daily], now=now)

    # 400 +100 (06:00) +1000 (06:30) = 1500; 23 hourly slots to 05:00 on the 10th = 3800;
    # the daily slot at 05:30 UTC (01:30 EDT) = 4800; 06:00 = 4900; 07:00 = 5000.
    assert result.exhausts_at == utc(2025, 3, 10, 7)
    assert result.projected_tokens == 400 + 166 * 100 + 7 * 1000


def test_no_exhaustion_without_a_cap_below_it_or_once_spent() -> None:
    now = utc(2025, 3, 9, 5, 30)
    pace = AgentPace(HOURLY, next_run_at=utc(2025, 3, 9, 6), zone=NEW_YORK, expected_tokens=100)
    assert forecast_budget(budget(now, NEW_YORK), [pace], now=now).exhausts_at is None
    below = budget(now, NEW_YORK, cap=1_000_000)
    assert forecast_budget(below, [pace], now=now).exhausts_at is None
    spent = budget(now, NEW_YORK, used=500, cap=500)
    assert forecast_budget(spent, [pace], now=now).exhausts_at is None


def test_exactly_reaching_the_cap_at_the_first_slot() -> None:
    now = utc(2025, 3, 12, 10)
    pace = AgentPace(HOURLY, next_run_at=utc(2025, 3, 12, 11), zone=UTC_ZONE, expected_tokens=50)
    result = forecast_budget(budget(now, UTC_ZONE, used=50, cap=100), [pace], now=now)
    assert result.exhausts_at == utc(2025, 3, 12, 11)


def test_agents_without_history_are_left_out_and_counted() -> None:
    now = utc(2025, 3, 12, 10)
    new = AgentPace(HOURLY, next_run_at=utc(2025, 3, 12, 11), zone=UTC_ZONE, expected_tokens=None)
    idle = AgentPace(HOURLY, next_run_at=utc(2025, 3, 12, 11), zone=UTC_ZONE, expected_tokens=0)
    # Its next slot is after the window: nothing was left out of this week.
    later = AgentPace(
        CalendarSchedule(cadence="weekly", weekday=0, time="09:00"),
        next_run_at=utc(2025, 3, 17, 9),
        zone=UTC_ZONE,
        expected_tokens=None,
    )
    result = forecast_budget(budget(now, UTC_ZONE, used=5), [new, idle, later], now=now)
    assert result == BudgetForecast(5, None, 1)


def test_an_overdue_slot_fires_once_now_then_the_schedule_goes_on() -> None:
    now = utc(2025, 3, 12, 10, 30)
    # Due since 07:00 (the scheduler was down): one run now, then 11:00, 12:00 … (grid kept).
    pace = AgentPace(HOURLY, next_run_at=utc(2025, 3, 12, 7), zone=UTC_ZONE, expected_tokens=10)
    result = forecast_budget(budget(now, UTC_ZONE, cap=20), [pace], now=now)
    # To Sunday 2025-03-16 00:00 UTC: now + 11:00 .. 23:00 on the 15th.
    assert result.projected_tokens == 10 * (1 + 3 * 24 + 13)
    assert result.exhausts_at == utc(2025, 3, 12, 11)


# --- against a brute-force walk of next_slots ---------------------------------------------------

ZONES = [ZoneInfo(z) for z in sorted(available_timezones()) if "/" in z][::7]
times = st.builds(lambda h, m: f"{h:02d}:{m:02d}", st.integers(0, 23), st.sampled_from([0, 30]))
schedules: st.SearchStrategy[Schedule] = st.one_of(
    st.builds(IntervalSchedule, every_hours=st.sampled_from([1, 2, 5, 24, 100, 168])),
    st.builds(CalendarSchedule, cadence=st.just("daily"), time=times),
    st.builds(CalendarSchedule, cadence=st.just("weekly"), weekday=st.integers(0, 6), time=times),
)


def brute_force(
    week: Budget, agents: list[AgentPace], now: datetime
) -> tuple[int, datetime | None]:
    """Every slot enumerated one by one with next_slots, merged in time order."""
    end = week.window.end
    events: list[tuple[datetime, int]] = []
    for agent in agents:
        if agent.expected_tokens is None:
            continue
        slot = max(agent.next_run_at, now)
        while slot < end:
            events.append((slot, agent.expected_tokens))
            (slot,) = next_slots(
                agent.schedule, after=slot, zone=agent.zone, count=1, anchor=agent.next_run_at
            )
    total = week.used_tokens
    exhausts = None
    for slot, tokens in heapq.nsmallest(len(events), events):
        total += tokens
        if (
            exhausts is None
            and week.cap_tokens is not None
            and week.used_tokens < week.cap_tokens <= total
        ):
            exhausts = slot
    return total, exhausts


@settings(max_examples=150, deadline=None)
@given(
    zone=st.sampled_from(ZONES),
    now=st.datetimes(min_value=datetime(2020, 1, 1), max_value=datetime(2030, 12, 31)),
    plans=st.lists(
        st.tuples(schedules, st.integers(-3 * 24, 8 * 24), st.integers(0, 500)),
        min_size=1,
        max_size=6,
    ),
    used=st.integers(0, 5_000),
    cap=st.one_of(st.none(), st.integers(0, 60_000)),
)
def test_matches_a_brute_force_walk_of_the_slots(
    zone: ZoneInfo,
    now: datetime,
    plans: list[tuple[Schedule, int, int]],
    used: int,
    cap: int | None,
) -> None:
    now = now.replace(tzinfo=UTC)
    agents = []
    for schedule, offset_hours, tokens in plans:
        after = now + timedelta(hours=offset_hours)
        (first,) = next_slots(schedule, after=after, zone=zone, count=1)
        agents.append(AgentPace(schedule, next_run_at=first, zone=zone, expected_tokens=tokens))
    week = Budget(cap_tokens=cap, used_tokens=used, window=week_window(now, zone))

    result = forecast_budget(week, agents, now=now)

    assert (result.projected_tokens, result.exhausts_at) == brute_force(week, agents, now)
