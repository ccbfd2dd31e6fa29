"""Input parsing shared by the mutations: errors name the GraphQL input field."""

from __future__ import annotations

from decimal import Decimal
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import strawberry

from agent_engine.agents.admin_rules import base_url_problem
from agent_engine.api.errors import BadUserInput
from agent_engine.api.guards import BASE_URL_MAX_CHARS, MAX_TOOL_IDS, checked_text
from agent_engine.api.ids import parse_id
from agent_engine.api.inputs import AgentModelInput, ScheduleInput
from agent_engine.domain.money import MoneyError, parse_price
from agent_engine.domain.schedule import ScheduleError, parse_schedule, schedule_to_json


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


def schedule_json(value: ScheduleInput | None, field: str) -> dict[str, Any] | None:
    """The input's variant through the domain's Schedule union; errors name the input field."""
    if value is None:
        return None
    raw: dict[str, Any]
    if value.interval:
        variant = "interval"
        raw = {"type": "interval", "every_hours": value.interval.every_hours}
    elif value.calendar:
        variant = "calendar"
        calendar = value.calendar
        raw = {"type": "calendar", "cadence": calendar.cadence.value, "time": calendar.time}
        if calendar.weekday is not None:
            raw["weekday"] = calendar.weekday
    else:  # the @oneOf rule makes this unreachable over GraphQL
        raise BadUserInput(field, "give exactly one of interval or calendar")
    try:
        parsed = parse_schedule(raw)
    except ScheduleError as exc:
        path = ".".join(_camel(p) for p in str(exc.field or "").split(".") if p and p != "type")
        raise BadUserInput(
            f"{field}.{variant}" + (f".{path}" if path else ""), exc.message
        ) from exc
    return schedule_to_json(parsed) if parsed is not None else None


def parse_tool_ids(values: list[strawberry.ID], field: str) -> list[int]:
    if len(values) > MAX_TOOL_IDS:
        raise BadUserInput(field, f"at most {MAX_TOOL_IDS} tools")
    return [parse_id(v, field) for v in values]


def checked_base_url(field: str, value: str | None) -> str | None:
    if value is None:
        return None
    checked_text(field, value, BASE_URL_MAX_CHARS)
    if problem := base_url_problem(value):
        raise BadUserInput(field, problem)
    return value


# The price fields of AgentModelInput and their GraphQL names.
_PRICE_FIELDS = {
    "input_price_per_million": "input.inputPricePerMillion",
    "output_price_per_million": "input.outputPricePerMillion",
}


def price_changes(input: AgentModelInput) -> dict[str, Decimal | None]:
    """The prices the input sets: absent = unchanged, null = not priced, else a valid price."""
    changes: dict[str, Decimal | None] = {}
    for name, field in _PRICE_FIELDS.items():
        value = getattr(input, name)
        if value is strawberry.UNSET:
            continue
        try:
            changes[name] = parse_price(value) if value is not None else None
        except MoneyError as exc:
            raise BadUserInput(field, str(exc)) from exc
    return changes


def zone_name(field: str, value: str | None) -> str:
    if value is None:
        raise BadUserInput(field, "cannot be null")
    try:
        ZoneInfo(value)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise BadUserInput(field, f"unknown IANA time zone {value[:64]!r}") from exc
    return value


def token_cap(field: str, value: int | None) -> int | None:
    """An agent's token cap (`weeklyTokenCap`, `maxTokensPerRun`): a positive number of tokens,
    or None (no cap)."""
    if value is None:
        return None
    if value <= 0:
        raise BadUserInput(
            field, f"must be a positive number of tokens, or null for no cap (got {value})"
        )
    return value
