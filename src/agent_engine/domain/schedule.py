"""The agent's schedule: a tagged union on `type`, the single source of truth for the JSONB column.

    {"type": "interval", "every_hours": N}                                  1 <= N <= 168
    {"type": "calendar", "cadence": "daily" | "weekly", "weekday": 0-6, "time": "HH:MM"}

`weekday` (0 = Monday) is required for weekly. For daily it may be given (it must still be 0-6)
and is normalised to None, so a stored daily schedule never carries a meaningless weekday.

Slots (docs/architecture.md §4.1):
- Interval slots are absolute time: `anchor + k * every_hours`, k >= 1. The anchor is when the
  schedule was set or the agent became startable (`first_slot`), then the slot that just fired
  (`slot_after_fire`); missed slots coalesce into the first one strictly after `now`.
- Calendar slots are wall-clock in the owner's zone. A local time inside a DST gap fires the same
  offset past the gap (02:30 in a 02:00-03:00 gap fires at 03:30); a local time that occurs twice
  fires once, at the first occurrence. That is exactly PEP 495's `fold=0` reading of a wall time,
  which is what `_wall_clock_slot` relies on. Each local date (daily) or week (weekly) gets
  exactly one slot. Where a gap swallows the end of a day (America/Nuuk jumps 23:00 -> 00:00 on
  the last Saturday of March), a time in it still fires the same offset past the gap, so that
  day's slot lands early on the next date (Saturday 23:30 fires Sunday 00:30); a local date the
  zone skipped entirely (Pacific/Apia 2011-12-30) has no slot.
"""

from __future__ import annotations

import datetime as dt
import re
from enum import StrEnum
from typing import Annotated, Any, Literal
from zoneinfo import ZoneInfo

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    field_validator,
)
from pydantic_core import ErrorDetails, PydanticCustomError

MIN_EVERY_HOURS = 1
MAX_EVERY_HOURS = 168  # one week
SCHEDULE_TYPES = ("interval", "calendar")

_TIME_RE = re.compile(r"(?:[01]\d|2[0-3]):[0-5]\d")
# Error type of our own rules, so `parse_schedule` passes their messages through unchanged.
_RULE = "schedule_rule"


def _rule(message: str) -> PydanticCustomError:
    return PydanticCustomError(_RULE, message)


class Cadence(StrEnum):
    DAILY = "daily"
    WEEKLY = "weekly"


class IntervalSchedule(BaseModel):
    """Every N hours, in absolute time."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    type: Literal["interval"] = "interval"
    every_hours: int = Field(strict=True)

    @field_validator("every_hours")
    @classmethod
    def _every_hours_in_range(cls, value: int) -> int:
        if not MIN_EVERY_HOURS <= value <= MAX_EVERY_HOURS:
            raise _rule(
                f"every_hours must be between {MIN_EVERY_HOURS} and {MAX_EVERY_HOURS} (got {value})"
            )
        return value

    @property
    def step(self) -> dt.timedelta:
        return dt.timedelta(hours=self.every_hours)


class CalendarSchedule(BaseModel):
    """Daily, or weekly on a weekday, at a wall-clock time in the owner's zone."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    type: Literal["calendar"] = "calendar"
    cadence: Cadence
    weekday: int | None = Field(default=None, strict=True, validate_default=True)
    time: str = Field(strict=True)

    @field_validator("weekday")
    @classmethod
    def _weekday_fits_cadence(cls, value: int | None, info: ValidationInfo) -> int | None:
        cadence = info.data.get("cadence")
        if value is None:
            if cadence == "weekly":
                raise _rule("weekday is required for a weekly schedule (0 = Monday .. 6 = Sunday)")
            return None
        if not 0 <= value <= 6:
            raise _rule(f"weekday must be between 0 and 6 (0 = Monday; got {value})")
        # A daily schedule runs every day; a weekday there would only mislead a reader.
        return value if cadence == "weekly" else None

    @field_validator("time")
    @classmethod
    def _time_is_hh_mm(cls, value: str) -> str:
        if not _TIME_RE.fullmatch(value):
            raise _rule(f"time must be HH:MM, 24-hour, e.g. 09:30 (got {value!r})")
        return value

    @property
    def local_time(self) -> dt.time:
        hours, minutes = self.time.split(":")
        return dt.time(int(hours), int(minutes))


Schedule = Annotated[IntervalSchedule | CalendarSchedule, Field(discriminator="type")]

_SCHEDULE_ADAPTER: TypeAdapter[IntervalSchedule | CalendarSchedule] = TypeAdapter(Schedule)


class ScheduleError(ValueError):
    """An invalid schedule; `field` is the dotted path inside it ("" = the whole object)."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        self.message = message
        where = f"schedule.{field}" if field else "schedule"
        super().__init__(f"{where}: {message}")


_TYPES_TEXT = " or ".join(repr(t) for t in SCHEDULE_TYPES)


def _error_from_pydantic(error: ErrorDetails) -> ScheduleError:
    kind = error["type"]
    loc = error["loc"]
    # With the discriminated union the first element of `loc` is the tag; a model validated on its
    # own (parse_schedule(IntervalSchedule(...)) never fails) would not have it.
    path = [str(part) for part in loc]
    if path and path[0] in SCHEDULE_TYPES:
        tag, path = path[0], path[1:]
    else:
        tag = ""
    field = ".".join(path)
    name = path[-1] if path else ""
    if kind == _RULE:
        return ScheduleError(field, error["msg"])
    if kind == "union_tag_invalid":
        got = error.get("input", {}).get("type") if isinstance(error.get("input"), dict) else None
        return ScheduleError("type", f"unknown type {got!r}; type must be {_TYPES_TEXT}")
    if kind == "union_tag_not_found":
        return ScheduleError("type", f"type is required and must be {_TYPES_TEXT}")
    if kind in {"model_attributes_type", "model_type", "dict_type"}:
        return ScheduleError("", f"must be an object with a type of {_TYPES_TEXT}")
    if kind == "extra_forbidden":
        allowed = ", ".join(_fields_of(tag))
        return ScheduleError(
            field, f"unknown field {name!r} for {_article(tag)} schedule (allowed: {allowed})"
        )
    if kind == "missing":
        return ScheduleError(field, f"{name} is required for {_article(tag)} schedule")
    if name == "every_hours":
        return ScheduleError(
            field,
            f"every_hours must be a whole number; every_hours must be between"
            f" {MIN_EVERY_HOURS} and {MAX_EVERY_HOURS}",
        )
    if name == "weekday":
        return ScheduleError(
            field, "weekday must be a whole number; weekday must be between 0 and 6 (0 = Monday)"
        )
    if name == "time":
        return ScheduleError(field, "time must be HH:MM, 24-hour, e.g. 09:30")
    if name == "cadence":
        return ScheduleError(field, "cadence must be 'daily' or 'weekly'")
    if name == "type":
        return ScheduleError(field, f"type must be {tag!r}")
    return ScheduleError(field, error["msg"])


def _fields_of(tag: str) -> list[str]:
    model = IntervalSchedule if tag == "interval" else CalendarSchedule
    return list(model.model_fields)


def parse_schedule(data: object) -> Schedule | None:
    """The schedule of a JSONB value or API input; None means manual only.

    Raises ScheduleError naming the first problem's field (never pydantic's ValidationError).
    """
    if data is None:
        return None
    if isinstance(data, IntervalSchedule | CalendarSchedule):
        return data
    try:
        return _SCHEDULE_ADAPTER.validate_python(data)
    except ValidationError as exc:
        raise _error_from_pydantic(exc.errors()[0]) from None


def schedule_to_json(schedule: Schedule) -> dict[str, Any]:
    """The JSONB form: the same shape `parse_schedule` accepts, without null keys."""
    return schedule.model_dump(mode="json", exclude_none=True)


def _require_aware(name: str, value: dt.datetime) -> None:
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"{name} must be a timezone-aware datetime, got {value!r}")


def _wall_clock_slot(day: dt.date, at: dt.time, zone: ZoneInfo) -> dt.datetime:
    """The instant a wall-clock time on a local date fires, in UTC.

    fold=0 reads an ambiguous time as its first occurrence and a time inside a gap with the offset
    from before the gap, i.e. the same distance past the gap (PEP 495).
    """
    return dt.datetime.combine(day, at, tzinfo=zone).astimezone(dt.UTC)


def _interval_slots(
    schedule: IntervalSchedule, *, after: dt.datetime, anchor: dt.datetime, count: int
) -> list[dt.datetime]:
    step = schedule.step
    anchor = anchor.astimezone(dt.UTC)
    elapsed = after - anchor
    # Integer timedelta division: the first k >= 1 with anchor + k*step > after, however many
    # slots were missed in between (coalescing).
    first = 1 if elapsed < dt.timedelta(0) else elapsed // step + 1
    return [anchor + (first + i) * step for i in range(count)]


def _calendar_slots(
    schedule: CalendarSchedule, *, after: dt.datetime, zone: ZoneInfo, count: int
) -> list[dt.datetime]:
    at = schedule.local_time
    # Start a day early: yesterday's slot may have been pushed past a gap into today.
    day = after.astimezone(zone).date() - dt.timedelta(days=1)
    step = dt.timedelta(days=1)
    if schedule.weekday is not None:
        day += dt.timedelta(days=(schedule.weekday - day.weekday()) % 7)
        step = dt.timedelta(days=7)
    slots: list[dt.datetime] = []
    while len(slots) < count:
        slot = _wall_clock_slot(day, at, zone)
        # A local date the zone skipped entirely (Pacific/Apia 2011-12-30) resolves to the same
        # instant as the next day's slot; keeping slots strictly increasing drops the duplicate.
        if slot > after and (not slots or slot > slots[-1]):
            slots.append(slot)
        day += step
    return slots


def next_slots(
    schedule: Schedule,
    *,
    after: dt.datetime,
    zone: ZoneInfo,
    count: int,
    anchor: dt.datetime | None = None,
) -> list[dt.datetime]:
    """The next `count` slots strictly after `after`, increasing, as UTC datetimes.

    `zone` is the owner's zone (used by calendar schedules only). `anchor` is the start of an
    interval schedule's grid (default: `after`); calendar schedules ignore it.
    """
    _require_aware("after", after)
    if count < 0:
        raise ValueError(f"count must be >= 0, got {count}")
    after = after.astimezone(dt.UTC)
    if isinstance(schedule, IntervalSchedule):
        if anchor is None:
            anchor = after
        _require_aware("anchor", anchor)
        return _interval_slots(schedule, after=after, anchor=anchor, count=count)
    return _calendar_slots(schedule, after=after, zone=zone, count=count)


def first_slot(schedule: Schedule, *, now: dt.datetime, zone: ZoneInfo) -> dt.datetime:
    """The slot to store when a schedule is set or the agent becomes startable again."""
    return next_slots(schedule, after=now, zone=zone, count=1)[0]


def slot_after_fire(
    schedule: Schedule,
    *,
    fired_slot: dt.datetime,
    now: dt.datetime,
    zone: ZoneInfo,
) -> dt.datetime:
    """The slot to store after `fired_slot` fired at `now`: the first one strictly in the future.

    Interval slots stay on the grid of the fired slot. `max` guards a fire observed early (clock
    skew): the fired slot itself must never come back.
    """
    _require_aware("fired_slot", fired_slot)
    _require_aware("now", now)
    after = max(now, fired_slot)
    return next_slots(schedule, after=after, zone=zone, count=1, anchor=fired_slot)[0]


def slot_after_zone_change(
    schedule: Schedule,
    *,
    now: dt.datetime,
    zone: ZoneInfo,
    last_fired: dt.datetime | None,
) -> dt.datetime:
    """The slot to store when the owner's zone changed to `zone` (interval slots stay put: they
    are absolute time, the caller keeps them).

    The first calendar slot in the new zone strictly after `now` that is not in the local day
    (daily) or week (weekly, Monday first) of `last_fired` read in the new zone: a slot that fired
    under the old zone already used that day or week, and the agent must not fire twice in one.
    """
    _require_aware("now", now)
    after = now
    if last_fired is not None and isinstance(schedule, CalendarSchedule):
        _require_aware("last_fired", last_fired)
        fired_on = last_fired.astimezone(zone).date()
        days = 7 - fired_on.weekday() if schedule.cadence == "weekly" else 1
        # Strictly after the instant just before the next local day (or week) begins.
        period_end = dt.datetime.combine(fired_on + dt.timedelta(days=days), dt.time(), zone)
        after = max(now, period_end.astimezone(dt.UTC) - dt.timedelta(microseconds=1))
    return next_slots(schedule, after=after, zone=zone, count=1)[0]


def _article(tag: str) -> str:
    return f"an {tag}" if tag[:1] in "aeiou" else f"a {tag}"
