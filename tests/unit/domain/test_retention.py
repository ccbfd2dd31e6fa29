"""The retention cutoff: older than the setting and before the current budget week."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from agent_engine.domain.retention import retention_cutoff


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)  # type: ignore[misc]


def test_the_setting_decides_when_it_reaches_before_the_week() -> None:
    now = utc(2025, 3, 12, 10)  # a Wednesday; the UTC week began Sunday 2025-03-09
    assert retention_cutoff(now, retention_days=30, zone=ZoneInfo("UTC")) == now - timedelta(
        days=30
    )


def test_a_run_of_the_current_budget_week_is_never_old_enough() -> None:
    now = utc(2025, 3, 12, 10)
    # One day ago is Tuesday, inside the week: the cutoff stays at the week's start.
    assert retention_cutoff(now, retention_days=1, zone=ZoneInfo("UTC")) == utc(2025, 3, 9)


def test_the_week_is_the_organisation_zone_s_week() -> None:
    now = utc(2025, 3, 12, 10)
    # In Tokyo the week began Sunday 00:00 +09:00, i.e. Saturday 15:00 UTC.
    assert retention_cutoff(now, retention_days=1, zone=ZoneInfo("Asia/Tokyo")) == utc(
        2025, 3, 8, 15
    )


@pytest.mark.parametrize("days", [0, -1, 3_651])
def test_out_of_range_settings_are_refused(days: int) -> None:
    with pytest.raises(ValueError, match="retention_days"):
        retention_cutoff(utc(2025, 3, 12), retention_days=days, zone=ZoneInfo("UTC"))
