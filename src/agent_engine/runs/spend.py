"""Reads of spend beyond the token sum: the week's cost, each agent's pace, the forecast and the
admin's spend report (DESIGN §10).

The rules live in `domain/` (`forecast.forecast_budget`, `forecast.expected_tokens_per_run`); this
module reads the rows they need, a constant number of statements however many agents or owners.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any
from zoneinfo import ZoneInfo

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from agent_engine.db.platform import PlatformSettings, load_platform_settings, zone_or_utc
from agent_engine.domain.budget import BudgetWindow
from agent_engine.domain.forecast import (
    EXPECTED_TOKENS_SAMPLE_RUNS,
    AgentPace,
    BudgetForecast,
    expected_tokens_per_run,
    forecast_budget,
)
from agent_engine.domain.gate import gate_open
from agent_engine.domain.schedule import Schedule, ScheduleError, parse_schedule
from agent_engine.runs.budget import owners_budgets

# SUM ignores NULLs: NULL when none of the week's runs was priced.
_COST_BY_OWNER_SQL = text(
    "SELECT a.user_id, SUM(r.cost) AS cost"
    " FROM agents a JOIN agent_runs r ON r.agent_id = a.id"
    " WHERE a.user_id = ANY(CAST(:owner_ids AS bigint[]))"
    " AND r.finished_at >= :start AND r.finished_at < :end"
    " GROUP BY a.user_id"
)

# The newest succeeded or failed runs of each agent, newest first: one index-only probe of
# `ix_agent_runs_pace` per agent.
_RECENT_TOKENS_SQL = text(
    "SELECT t.agent_id, ARRAY("
    "   SELECT r.tokens_used FROM agent_runs r"
    "   WHERE r.agent_id = t.agent_id AND r.state IN ('succeeded', 'failed')"
    f"  ORDER BY r.id DESC LIMIT {EXPECTED_TOKENS_SAMPLE_RUNS}"
    " ) AS recent"
    " FROM unnest(CAST(:agent_ids AS bigint[])) AS t(agent_id)"
)

# The owner's agents with a next slot, each with its recent tokens and the owner's zone (only the
# columns the forecast reads: a dashboard asks for it on every page view).
_SCHEDULED_AGENTS_SQL = text(
    "SELECT a.id, a.schedule, a.next_run_at, a.enabled, a.admin_paused, a.model_id,"
    " u.timezone AS owner_timezone, ARRAY("
    "   SELECT r.tokens_used FROM agent_runs r"
    "   WHERE r.agent_id = a.id AND r.state IN ('succeeded', 'failed')"
    f"  ORDER BY r.id DESC LIMIT {EXPECTED_TOKENS_SAMPLE_RUNS}"
    " ) AS recent_tokens"
    " FROM agents a JOIN users u ON u.id = a.user_id"
    " WHERE a.user_id = :owner_id AND a.next_run_at IS NOT NULL ORDER BY a.id"
)

# The admin's report: one aggregate over the week's finished runs, read through the
# `finished_at` index, whatever the number of owners. Skipped runs spent nothing and are left out.
_SPEND_BY_OWNER_SQL = text(
    "SELECT a.user_id AS owner_id, COALESCE(SUM(r.tokens_used), 0) AS tokens,"
    " SUM(r.cost) AS cost, count(*) AS runs"
    " FROM agent_runs r JOIN agents a ON a.id = r.agent_id"
    " WHERE r.finished_at >= :start AND r.finished_at < :end AND r.state <> 'skipped'"
    " GROUP BY a.user_id"
    " ORDER BY tokens DESC, a.user_id"
)


@dataclass(frozen=True)
class OwnerSpend:
    owner_id: int
    tokens: int
    cost: Decimal | None  # None: none of the week's runs was priced
    runs: int


async def spent_costs(
    conn: AsyncConnection, owner_ids: Collection[int], *, window: BudgetWindow
) -> dict[int, Decimal | None]:
    """The week's cost per owner; None for owners with no priced run in the window."""
    if not owner_ids:
        return {}
    rows = await conn.execute(
        _COST_BY_OWNER_SQL,
        {"owner_ids": list(owner_ids), "start": window.start, "end": window.end},
    )
    found = {int(owner_id): cost for owner_id, cost in rows}
    return {owner_id: found.get(owner_id) for owner_id in owner_ids}


async def recent_tokens(conn: AsyncConnection, agent_ids: Collection[int]) -> dict[int, list[int]]:
    """Tokens of each agent's newest succeeded or failed runs (at most 10), newest first."""
    if not agent_ids:
        return {}
    rows = await conn.execute(_RECENT_TOKENS_SQL, {"agent_ids": list(agent_ids)})
    return {int(agent_id): [int(t) for t in recent] for agent_id, recent in rows}


def agent_paces(
    agents: Iterable[Mapping[Any, Any]],
    expected: Mapping[int, int | None],
    *,
    zone: ZoneInfo,
) -> list[AgentPace]:
    """The owner's startable, scheduled agents (those with a `next_run_at`) and their pace."""
    paces = []
    # Agents often share a schedule ("daily at 09:00"): each distinct one is validated once.
    parsed: dict[tuple[tuple[str, Any], ...], Schedule | None] = {}
    for row in agents:
        if row["next_run_at"] is None or not gate_open(
            enabled=row["enabled"],
            admin_paused=row["admin_paused"],
            has_model=row["model_id"] is not None,
        ):
            continue
        stored = row["schedule"]
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
                next_run_at=row["next_run_at"],
                zone=zone,
                expected_tokens=expected.get(int(row["id"])),
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
    rows = (await conn.execute(_SCHEDULED_AGENTS_SQL, {"owner_id": owner_id})).mappings().all()
    owner_zone = rows[0]["owner_timezone"] if rows else None
    zone = zone_or_utc(owner_zone) if owner_zone else platform.zone
    expected = {int(r["id"]): expected_tokens_per_run(r["recent_tokens"]) for r in rows}
    return forecast_budget(budget, agent_paces(rows, expected, zone=zone), now=now)


async def spend_by_owner(conn: AsyncConnection, *, window: BudgetWindow) -> list[OwnerSpend]:
    """Every owner's tokens, cost and runs in the window, most tokens first: one statement."""
    rows = await conn.execute(_SPEND_BY_OWNER_SQL, {"start": window.start, "end": window.end})
    return [
        OwnerSpend(owner_id=int(r.owner_id), tokens=int(r.tokens), cost=r.cost, runs=int(r.runs))
        for r in rows
    ]
