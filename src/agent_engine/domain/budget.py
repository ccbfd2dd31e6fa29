"""The weekly token budget (docs/architecture.md §4).

The window is the calendar week from Sunday 00:00 to the next Sunday 00:00 in the organisation
zone, so it lasts 168 hours give or take the week's DST shift (167 or 169 hours; 167.5 or 168.5
in Australia/Lord_Howe). The cap covers all of an owner's agents; no cap means unlimited.

Alerts: the platform's `budgetAlertPercents` are thresholds in percent of the cap; one is reached
when the week's spend is at least that share of the cap (recorded once per owner and week).
"""

from __future__ import annotations

import datetime as dt
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from zoneinfo import ZoneInfo

_SUNDAY = 6  # date.weekday(): Monday = 0


@dataclass(frozen=True)
class BudgetWindow:
    start: dt.datetime
    end: dt.datetime
    timezone: str

    def contains(self, instant: dt.datetime) -> bool:
        return self.start <= instant < self.end

    @property
    def duration(self) -> dt.timedelta:
        return self.end - self.start


def _local_midnight(day: dt.date, zone: ZoneInfo) -> dt.datetime:
    """The first instant of a local date, in UTC.

    fold=0 picks the first 00:00 when it occurs twice and, when midnight falls in a DST gap
    (e.g. America/Santiago), the end of the gap, which is when the local date begins.
    """
    return dt.datetime.combine(day, dt.time(0), tzinfo=zone).astimezone(dt.UTC)


def week_window(now: dt.datetime, zone: ZoneInfo) -> BudgetWindow:
    """The budget week containing `now` (timezone-aware) in `zone`, as UTC instants."""
    if now.tzinfo is None or now.utcoffset() is None:
        raise ValueError(f"now must be a timezone-aware datetime, got {now!r}")
    today = now.astimezone(zone).date()
    sunday = today - dt.timedelta(days=(today.weekday() - _SUNDAY) % 7)
    return BudgetWindow(
        start=_local_midnight(sunday, zone),
        end=_local_midnight(sunday + dt.timedelta(days=7), zone),
        timezone=zone.key,
    )


@dataclass(frozen=True)
class Budget:
    cap_tokens: int | None  # None: no cap, unlimited
    used_tokens: int
    window: BudgetWindow

    @property
    def remaining_tokens(self) -> int | None:
        if self.cap_tokens is None:
            return None
        return max(self.cap_tokens - self.used_tokens, 0)

    @property
    def exceeded(self) -> bool:
        return self.cap_tokens is not None and self.used_tokens >= self.cap_tokens


# --- alerts (docs/architecture.md §10.7) ----------------------------------------------------------

DEFAULT_ALERT_PERCENTS: tuple[int, ...] = (80, 100)
MIN_ALERT_PERCENT = 1
MAX_ALERT_PERCENT = 100


class AlertPercentsError(ValueError):
    """Thresholds that are not 1-100, sorted and unique."""


def parse_alert_percents(values: Sequence[int]) -> tuple[int, ...]:
    """Thresholds in percent of the cap: each 1-100, ascending, no duplicates (empty: no alerts)."""
    for value in values:
        if isinstance(value, bool) or not isinstance(value, int):
            raise AlertPercentsError(f"each threshold must be a whole number (got {value!r})")
        if not MIN_ALERT_PERCENT <= value <= MAX_ALERT_PERCENT:
            raise AlertPercentsError(
                f"each threshold must be between {MIN_ALERT_PERCENT} and {MAX_ALERT_PERCENT}"
                f" (got {value})"
            )
    if any(later <= earlier for earlier, later in itertools.pairwise(values)):
        raise AlertPercentsError(
            f"thresholds must be sorted ascending without duplicates (got {list(values)})"
        )
    return tuple(values)


def thresholds_reached(
    used_tokens: int, cap_tokens: int | None, percents: Sequence[int]
) -> list[int]:
    """The thresholds the week's spend has reached: used >= percent % of the cap; none without a
    cap.

    Integer arithmetic, so 80 % of a cap of 15 is reached at 12 tokens exactly, not at 11.999….
    """
    if cap_tokens is None:
        return []
    return [p for p in percents if used_tokens * 100 >= cap_tokens * p]
