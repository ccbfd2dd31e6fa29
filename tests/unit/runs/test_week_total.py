"""`runs.alerts.under_every_threshold`: when the week total the finish returned settles the budget
alert check without a statement, and when it is no answer."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from agent_engine.db.platform import PlatformSettings
from agent_engine.domain.budget import week_window
from agent_engine.runs.alerts import under_every_threshold

WINDOW = week_window(datetime(2026, 12, 3, 12, tzinfo=UTC), ZoneInfo("UTC"))
SETTINGS = PlatformSettings(weekly_token_cap=1_000, budget_alert_percents=(50, 100))


def test_a_total_under_the_lowest_threshold_needs_no_check() -> None:
    assert under_every_threshold(WINDOW.start, 499, WINDOW, SETTINGS)


def test_a_total_at_a_threshold_is_checked() -> None:
    assert not under_every_threshold(WINDOW.start, 500, WINDOW, SETTINGS)
    assert not under_every_threshold(WINDOW.start, 5000, WINDOW, SETTINGS)


def test_a_lowered_cap_is_measured_against_the_cap_of_now() -> None:
    lowered = PlatformSettings(weekly_token_cap=400, budget_alert_percents=(50, 100))
    assert not under_every_threshold(WINDOW.start, 300, WINDOW, lowered)


def test_another_week_or_no_total_is_no_answer() -> None:
    assert not under_every_threshold(WINDOW.start - timedelta(days=7), 1, WINDOW, SETTINGS)
    assert not under_every_threshold(None, None, WINDOW, SETTINGS)
    assert not under_every_threshold(WINDOW.start, None, WINDOW, SETTINGS)
