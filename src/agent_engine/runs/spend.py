"""Each scheduled agent's pace, the input of the owner's forecast.

There is one forecast: the API's `Budget.forecast` (api/types/budget.py) reads the agents and
their recent tokens through the request's loaders and calls `agent_paces` and the domain's
`forecast.forecast_budget`; bench/budget_gate.py times that request.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any, Protocol
from zoneinfo import ZoneInfo

from agent_engine.domain.forecast import (
    AgentPace,
)
from agent_engine.domain.gate import gate_open
from agent_engine.domain.schedule import Schedule, ScheduleError, parse_schedule


class PacedAgent(Protocol):
    """What a pace needs of an agent row (an `AgentRow`, or a row of the forecast's read)."""

    @property
    def id(self) -> int: ...
    @property
    def enabled(self) -> bool: ...
    @property
    def admin_paused(self) -> bool: ...
    @property
    def model_id(self) -> int | None: ...
    @property
    def schedule(self) -> Any: ...
    @property
    def next_run_at(self) -> datetime | None: ...


def agent_paces(
    agents: Iterable[PacedAgent],
    expected: Mapping[int, int | None],
    *,
    zone: ZoneInfo,
) -> list[AgentPace]:
    """The owner's startable, scheduled agents (those with a `next_run_at`) and their pace."""
    paces = []
    # Agents often share a schedule ("daily at 09:00"): each distinct one is validated once.
    parsed: dict[tuple[tuple[str, Any], ...], Schedule | None] = {}
    for row in agents:
        if row.next_run_at is None or not gate_open(
            enabled=row.enabled,
            admin_paused=row.admin_paused,
            has_model=row.model_id is not None,
        ):
            continue
        stored = row.schedule
        key = tuple(sorted(stored.items())) if isinstance(stored, dict) else (("", stored),)
        if key not in parsed:
            try:
                parsed[key] = parse_schedule(stored)
            except ScheduleError:  # a hand-edited row: it cannot run either
                parsed[key] = None
        schedule = parsed[key]
        if schedule is None:
            continue
        paces.append(
            AgentPace(
                schedule=schedule,
                next_run_at=row.next_run_at,
                zone=zone,
                expected_tokens=expected.get(int(row.id)),
            )
        )
    return paces
