"""`agent-engine schedule preview`."""

from __future__ import annotations

from datetime import datetime

from typer.testing import CliRunner

from agent_engine.cli import app

runner = CliRunner()


def preview(*args: str) -> tuple[int, str, str]:
    result = runner.invoke(app, ["schedule", "preview", *args])
    return result.exit_code, result.stdout, result.stderr


def test_prints_slots_with_offsets_in_the_zone() -> None:
    code, out, _ = preview(
        '{"type":"calendar","cadence":"daily","time":"02:30"}',
        "--timezone",
        "America/New_York",
        "--after",
        "2024-03-08T12:00:00Z",
        "--count",
        "3",
    )
    assert code == 0
    assert out.splitlines() == [
        "2024-03-09T02:30:00-05:00",
        "2024-03-10T03:30:00-04:00",
        "2024-03-11T02:30:00-04:00",
    ]


def test_interval_preview_counts_from_after() -> None:
    code, out, _ = preview(
        '{"type":"interval","every_hours":6}',
        "--after",
        "2024-01-01T00:00:00+00:00",
        "--count",
        "2",
    )
    assert code == 0
    assert out.splitlines() == ["2024-01-01T06:00:00+00:00", "2024-01-01T12:00:00+00:00"]


def test_default_count_is_five_and_slots_have_offsets() -> None:
    code, out, _ = preview('{"type":"calendar","cadence":"weekly","weekday":0,"time":"09:00"}')
    assert code == 0
    lines = out.splitlines()
    assert len(lines) == 5
    assert all(datetime.fromisoformat(line).utcoffset() is not None for line in lines)


def test_invalid_schedule_exits_2_naming_the_field() -> None:
    code, _, err = preview('{"type":"interval","every_hours":0}')
    assert code == 2
    assert "schedule.every_hours" in err
    assert "every_hours must be between 1 and 168" in err


def test_weekly_without_weekday_exits_2() -> None:
    code, _, err = preview('{"type":"calendar","cadence":"weekly","time":"09:00"}')
    assert code == 2
    assert "weekday is required for a weekly schedule" in err


def test_unknown_zone_exits_2_naming_it() -> None:
    code, _, err = preview('{"type":"interval","every_hours":6}', "--timezone", "Mars/Olympus")
    assert code == 2
    assert "Mars/Olympus" in err


def test_invalid_json_exits_2() -> None:
    code, _, err = preview("{type: interval}")
    assert code == 2
    assert "JSON" in err
