"""Reads of spend beyond the token sum: the week's cost, each agent's pace, the forecast and the
admin's spend report.

The rules live in `domain/` (`forecast.forecast_budget`, `forecast.expected_tokens_per_run`); the
statements that read the rows they need in `db/spend.py`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any, Protocol
from zoneinfo import ZoneInfo

from sqlalchemy.ext.asyncio import AsyncConnection

from agent_engine.db import spend as spend_sql
from agent_engine.db.platform import PlatformSettings, load_platform_settings
from agent_engine.domain.forecast import (
    AgentPace,
    BudgetForecast,
    expected_tokens_per_run,
    forecast_budget,
)
from agent_engine.domain.gate import gate_open
from agent_engine.domain.schedule import Schedule, ScheduleError, parse_schedule
from agent_engine.runs.budget import owners_budgets


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


async def owner_forecast(
    conn: AsyncConnection,
    owner_id: int,
    *,
    now: datetime,
    platform: PlatformSettings | None = None,
) -> BudgetForecast:
    """The owner's forecast for the week containing `now`, in three statements (two with
    `platform` given): the settings, the week's sum, the scheduled agents with their pace."""
    if platform is None:
        platform = await load_platform_settings(conn)
    budget = (await owners_budgets(conn, [owner_id], now=now, platform=platform))[owner_id]
    rows = (await conn.execute(spend_sql.SCHEDULED_AGENTS_OF_OWNER, {"owner_id": owner_id})).all()
    owner_zone = rows[0].owner_timezone if rows else None
    zone = platform.zone_of(owner_zone)
    expected = {int(r.id): expected_tokens_per_run(r.recent_tokens) for r in rows}
    return forecast_budget(budget, agent_paces(rows, expected, zone=zone), now=now)
