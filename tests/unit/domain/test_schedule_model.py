"""The schedule's shape: what is accepted, what is rejected and how the error reads."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from agent_engine.domain.schedule import (
    CalendarSchedule,
    IntervalSchedule,
    ScheduleError,
    parse_schedule,
    schedule_to_json,
)


def reject(data: object) -> ScheduleError:
    with pytest.raises(ScheduleError) as caught:
        parse_schedule(data)
    return caught.value


def test_null_means_manual_only() -> None:
    assert parse_schedule(None) is None


@pytest.mark.parametrize("hours", [1, 6, 24, 168])
def test_interval_within_range_is_accepted(hours: int) -> None:
    schedule = parse_schedule({"type": "interval", "every_hours": hours})
    assert schedule == IntervalSchedule(every_hours=hours)


@pytest.mark.parametrize("hours", [0, -1, 169, 10_000])
def test_interval_out_of_range_names_the_rule(hours: int) -> None:
    error = reject({"type": "interval", "every_hours": hours})
    assert error.field == "every_hours"
    assert "every_hours must be between 1 and 168" in error.message
    assert str(error).startswith("schedule.every_hours: every_hours must be between 1 and 168")


@pytest.mark.parametrize("hours", ["6", 6.0, 6.5, True, None])
def test_interval_hours_must_be_an_integer(hours: object) -> None:
    error = reject({"type": "interval", "every_hours": hours})
    assert error.field == "every_hours"
    assert "every_hours must be between 1 and 168" in error.message


def test_interval_without_hours_names_the_missing_field() -> None:
    error = reject({"type": "interval"})
    assert error.field == "every_hours"
    assert "every_hours is required" in error.message


@pytest.mark.parametrize(
    "data",
    [
        {"type": "calendar", "cadence": "daily", "time": "00:00"},
        {"type": "calendar", "cadence": "daily", "time": "23:59"},
        {"type": "calendar", "cadence": "weekly", "weekday": 0, "time": "09:30"},
        {"type": "calendar", "cadence": "weekly", "weekday": 6, "time": "18:05"},
    ],
)
def test_calendar_valid_forms_round_trip(data: dict[str, Any]) -> None:
    schedule = parse_schedule(data)
    assert isinstance(schedule, CalendarSchedule)
    assert schedule_to_json(schedule) == data
    assert parse_schedule(schedule_to_json(schedule)) == schedule


def test_weekly_without_weekday_is_rejected() -> None:
    error = reject({"type": "calendar", "cadence": "weekly", "time": "09:00"})
    assert error.field == "weekday"
    assert "weekday is required for a weekly schedule" in error.message


def test_weekly_with_null_weekday_is_rejected() -> None:
    error = reject({"type": "calendar", "cadence": "weekly", "weekday": None, "time": "09:00"})
    assert error.field == "weekday"
    assert "weekday is required for a weekly schedule" in error.message


@pytest.mark.parametrize("cadence", ["daily", "weekly"])
@pytest.mark.parametrize("weekday", [-1, 7, 100])
def test_weekday_out_of_range_is_rejected(cadence: str, weekday: int) -> None:
    error = reject({"type": "calendar", "cadence": cadence, "weekday": weekday, "time": "09:00"})
    assert error.field == "weekday"
    assert "weekday must be between 0 and 6" in error.message


@pytest.mark.parametrize("weekday", ["1", 1.0, True])
def test_weekday_must_be_an_integer(weekday: object) -> None:
    error = reject({"type": "calendar", "cadence": "weekly", "weekday": weekday, "time": "09:00"})
    assert error.field == "weekday"
    assert "weekday must be between 0 and 6" in error.message


def test_daily_weekday_is_dropped() -> None:
    schedule = parse_schedule(
        {"type": "calendar", "cadence": "daily", "weekday": 3, "time": "07:00"}
    )
    assert isinstance(schedule, CalendarSchedule)
    assert schedule.weekday is None
    assert schedule_to_json(schedule) == {"type": "calendar", "cadence": "daily", "time": "07:00"}


@pytest.mark.parametrize(
    "time",
    ["9:00", "09:0", "24:00", "12:60", "0900", "09:00:00", " 09:00", "09:00\n", "", "ab:cd", 900],
)
def test_time_must_be_hh_mm(time: object) -> None:
    error = reject({"type": "calendar", "cadence": "daily", "time": time})
    assert error.field == "time"
    assert "time must be HH:MM" in error.message


def test_calendar_without_time_is_rejected() -> None:
    error = reject({"type": "calendar", "cadence": "daily"})
    assert error.field == "time"
    assert "time is required" in error.message


@pytest.mark.parametrize("cadence", ["monthly", "DAILY", None, 1])
def test_unknown_cadence_is_rejected(cadence: object) -> None:
    error = reject({"type": "calendar", "cadence": cadence, "weekday": 1, "time": "09:00"})
    assert error.field == "cadence"
    assert "'daily' or 'weekly'" in error.message


@pytest.mark.parametrize("kind", ["cron", "INTERVAL", "", 5])
def test_unknown_type_lists_the_known_ones(kind: object) -> None:
    error = reject({"type": kind, "every_hours": 6})
    assert error.field == "type"
    assert "unknown type" in error.message
    assert "'interval'" in error.message
    assert "'calendar'" in error.message


def test_missing_type_is_rejected() -> None:
    error = reject({"every_hours": 6})
    assert error.field == "type"
    assert "'interval' or 'calendar'" in error.message


@pytest.mark.parametrize("data", [[], "interval", 6, ["type", "interval"]])
def test_non_objects_are_rejected_as_a_whole(data: object) -> None:
    error = reject(data)
    assert error.field == ""
    assert str(error).startswith("schedule: ")


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"type": "interval", "every_hours": 6, "timezone": "UTC"}, "timezone"),
        ({"type": "interval", "every_hours": 6, "weekday": 1}, "weekday"),
        (
            {"type": "calendar", "cadence": "daily", "time": "09:00", "every_hours": 2},
            "every_hours",
        ),
    ],
)
def test_extra_fields_are_named(data: dict[str, Any], field: str) -> None:
    error = reject(data)
    assert error.field == field
    assert f"unknown field {field!r}" in error.message


def test_first_problem_is_reported() -> None:
    error = reject({"type": "calendar", "cadence": "weekly", "weekday": 9, "time": "25:00"})
    assert error.field == "weekday"


def test_schedule_error_is_a_value_error() -> None:
    assert isinstance(reject({"type": "interval", "every_hours": 0}), ValueError)


def test_parsed_models_pass_through() -> None:
    schedule = CalendarSchedule(cadence="weekly", weekday=2, time="10:15")
    assert parse_schedule(schedule) is schedule


def test_models_are_frozen_and_validate_on_construction() -> None:
    schedule = IntervalSchedule(every_hours=3)
    with pytest.raises(ValidationError):
        schedule.every_hours = 4  # type: ignore[misc]
    with pytest.raises(ValidationError, match="weekday is required"):
        CalendarSchedule(cadence="weekly", time="09:00")
    with pytest.raises(ValidationError, match="every_hours must be between 1 and 168"):
        IntervalSchedule(every_hours=0)


def test_json_form_has_no_null_keys() -> None:
    assert schedule_to_json(IntervalSchedule(every_hours=12)) == {
        "type": "interval",
        "every_hours": 12,
    }
