"""The budget forecast (docs/architecture.md §10.7): what the owner's scheduled agents will spend
by the end of the budget week at their current pace, and the slot at which that spend first
reaches the cap.

Pace: an agent's `expected_tokens_per_run` is the median `tokens_used` of its last 10 succeeded or
failed runs (None without such runs: the agent is left out and counted in
`agents_without_history`). Slots: every remaining slot of a startable scheduled agent from its
stored `next_run_at` to the window's end (exclusive), walked with the schedule's own slot rules
(`domain.schedule.next_slots`: interval slots in absolute time, calendar slots wall-clock in the
owner's zone, exact across DST). An overdue `next_run_at` (the scheduler is behind) fires once,
now, and the schedule goes on strictly after now -- the scheduler's coalescing.

Cheap for a dashboard: interval agents (up to 168 slots a week each) are counted arithmetically on
their grid, a calendar schedule's slots are walked once however many agents share it, and
`exhausts_at` is found by a binary search over the window's hours, then among the few slots of the
hour found, so hundreds of agents cost a few milliseconds.
"""

from __future__ import annotations

import bisect
import datetime as dt
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from zoneinfo import ZoneInfo

from agent_engine.domain.budget import Budget
from agent_engine.domain.schedule import (
    CalendarSchedule,
    IntervalSchedule,
    Schedule,
    next_slots,
)

# How many of an agent's latest succeeded or failed runs set its pace.
EXPECTED_TOKENS_SAMPLE_RUNS = 10
_MICROSECOND = dt.timedelta(microseconds=1)
# No schedule fires more often than hourly (MIN_EVERY_HOURS), so an hour holds at most one slot
# of each agent: the search for `exhausts_at` narrows to an hour first.
_SEARCH_STEP = dt.timedelta(hours=1)


def expected_tokens_per_run(recent_tokens: Sequence[int]) -> int | None:
    """The median of the newest `EXPECTED_TOKENS_SAMPLE_RUNS` values (newest first); None when
    there are none. An even sample takes the mean of its middle two, rounded half up."""
    sample = sorted(recent_tokens[:EXPECTED_TOKENS_SAMPLE_RUNS])
    if not sample:
        return None
    middle = len(sample) // 2
    if len(sample) % 2:
        return sample[middle]
    return (sample[middle - 1] + sample[middle] + 1) // 2


@dataclass(frozen=True)
class AgentPace:
    """One startable, scheduled agent of the owner."""

    schedule: Schedule
    next_run_at: dt.datetime
    zone: ZoneInfo  # the owner's zone: where calendar slots are wall-clock
    expected_tokens: int | None


@dataclass(frozen=True)
class BudgetForecast:
    projected_tokens: int
    # The slot at which the projected spend first reaches the cap; None without a cap, when the
    # cap is not reached within the window, or when the week's spend has reached it already.
    exhausts_at: dt.datetime | None
    agents_without_history: int


class _CalendarSlots:
    """The slots of calendar schedules in the window, walked once per schedule and zone."""

    def __init__(self, *, origin: dt.datetime, end: dt.datetime) -> None:
        self._origin = origin
        self._end = end
        self._walked: dict[tuple[Schedule, ZoneInfo], list[int]] = {}

    def after(self, schedule: Schedule, zone: ZoneInfo, instant: int) -> list[int]:
        """The schedule's slots strictly after `instant` and before the end (microseconds after
        the origin). A calendar schedule's slots do not depend on when it was set."""
        walked = self._walked.get((schedule, zone))
        if walked is None:
            slots: list[dt.datetime] = []
            after = self._origin - _MICROSECOND
            while not slots or slots[-1] < self._end:
                # A week holds at most 2 weekly and 8 daily slots.
                weekly = isinstance(schedule, CalendarSchedule) and schedule.weekday is not None
                chunk = 2 if weekly else 8
                slots += next_slots(schedule, after=after, zone=zone, count=chunk)
                after = slots[-1]
            walked = [(s - self._origin) // _MICROSECOND for s in slots if s < self._end]
            self._walked[schedule, zone] = walked
        return walked[bisect.bisect_right(walked, instant) :]


class _RemainingSlots:
    """An agent's remaining slots before the window's end, as microseconds after `origin`."""

    def __init__(
        self,
        pace: AgentPace,
        *,
        now: dt.datetime,
        end: dt.datetime,
        origin: dt.datetime,
        calendar: _CalendarSlots,
    ) -> None:
        first = max(pace.next_run_at, now)
        # After an overdue slot the schedule goes on strictly after now (coalescing); otherwise
        # after the stored slot. Interval grids stay anchored on the stored slot.
        self._grid_step: int | None = None
        self._instants: list[int] = []
        self.count = 0
        if first >= end:
            return
        self._first = (first - origin) // _MICROSECOND
        if isinstance(pace.schedule, IntervalSchedule):
            (second,) = next_slots(
                pace.schedule, after=first, zone=pace.zone, count=1, anchor=pace.next_run_at
            )
            self._grid_start = (second - origin) // _MICROSECOND
            self._grid_step = pace.schedule.step // _MICROSECOND
            end_us = (end - origin) // _MICROSECOND
            following = 0
            if self._grid_start < end_us:
                following = (end_us - 1 - self._grid_start) // self._grid_step + 1
            self.count = 1 + following
            return
        self._instants = [self._first, *calendar.after(pace.schedule, pace.zone, self._first)]
        self.count = len(self._instants)

    @property
    def first(self) -> int:
        return self._first if self._grid_step is not None else self._instants[0]

    @property
    def last(self) -> int:
        return self.instant(self.count - 1)

    def instant(self, index: int) -> int:
        """The `index`-th remaining slot (0 = the first)."""
        if self._grid_step is None:
            return self._instants[index]
        if index == 0:
            return self._first
        return self._grid_start + (index - 1) * self._grid_step

    def count_until(self, instant: int) -> int:
        """How many of the slots fall at or before `instant`."""
        if self._grid_step is None:
            return bisect.bisect_right(self._instants, instant)
        if instant < self._first:
            return 0
        if instant < self._grid_start:
            return 1
        return min(self.count, 2 + (instant - self._grid_start) // self._grid_step)


def forecast_budget(
    budget: Budget, agents: Iterable[AgentPace], *, now: dt.datetime
) -> BudgetForecast:
    """The week's projected spend: used so far plus each remaining slot times its agent's pace."""
    origin = budget.window.start
    end = budget.window.end
    projected = budget.used_tokens
    without_history = 0
    paced: list[tuple[_RemainingSlots, int]] = []
    calendar = _CalendarSlots(origin=origin, end=end)
    for agent in agents:
        slots = _RemainingSlots(agent, now=now, end=end, origin=origin, calendar=calendar)
        if slots.count == 0:
            continue
        if agent.expected_tokens is None:
            without_history += 1
            continue
        if agent.expected_tokens > 0:
            projected += slots.count * agent.expected_tokens
            paced.append((slots, agent.expected_tokens))
    exhausts_at = None
    cap = budget.cap_tokens
    if cap is not None and budget.used_tokens < cap <= projected:
        instant = _first_instant_reaching(cap - budget.used_tokens, paced)
        exhausts_at = origin + instant * _MICROSECOND
    return BudgetForecast(
        projected_tokens=projected,
        exhausts_at=exhausts_at,
        agents_without_history=without_history,
    )


def _first_instant_reaching(needed: int, paced: list[tuple[_RemainingSlots, int]]) -> int:
    """The earliest instant at which the paced slots up to it add up to `needed` (which they do by
    the last slot). The projection only grows at slots, so that instant is a slot.

    A binary search over whole hours finds the hour that reaches it; then the slots within that
    hour (at most one per agent) are added in time order.
    """

    def spent_until(instant: int) -> int:
        return sum(slots.count_until(instant) * tokens for slots, tokens in paced)

    step = _SEARCH_STEP // _MICROSECOND
    # spent_until(low * step) < needed <= spent_until(high * step)
    low = (min(slots.first for slots, _ in paced) - 1) // step
    high = -(-max(slots.last for slots, _ in paced) // step)
    while high - low > 1:
        middle = (low + high) // 2
        if spent_until(middle * step) >= needed:
            high = middle
        else:
            low = middle
    spent = spent_until(low * step)
    within: list[tuple[int, int]] = []
    for slots, tokens in paced:
        before, upto = slots.count_until(low * step), slots.count_until(high * step)
        within += [(slots.instant(index), tokens) for index in range(before, upto)]
    for instant, tokens in sorted(within):
        spent += tokens
        if spent >= needed:
            return instant
    raise AssertionError("the projection reaches the cap by the last slot")
