"""An agent's schedule as the API shows it."""

from __future__ import annotations

from typing import Annotated, Any

import strawberry

from agent_engine.domain.schedule import Cadence


@strawberry.type
class IntervalSchedule:
    every_hours: int


@strawberry.type
class CalendarSchedule:
    cadence: Cadence
    weekday: int | None
    time: str


Schedule = Annotated[IntervalSchedule | CalendarSchedule, strawberry.union("Schedule")]


def schedule_from_json(value: dict[str, Any] | None) -> IntervalSchedule | CalendarSchedule | None:
    if value is None:
        return None
    if value.get("type") == "interval":
        return IntervalSchedule(every_hours=int(value["every_hours"]))
    return CalendarSchedule(
        cadence=Cadence(value["cadence"]),
        weekday=value.get("weekday"),
        time=str(value["time"]),
    )
