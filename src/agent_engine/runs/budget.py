"""The owner's weekly budget: a sum over the journal, never a counter.

`SUM(tokens_used)` over the runs of all the owner's agents whose `finished_at` falls in the current
week of the organisation zone, against the cap read from `platform_settings` at that moment. The
sum is served by `ix_agent_runs_budget (agent_id, finished_at) INCLUDE (tokens_used)`.
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from agent_engine.db.platform import PlatformSettings, load_platform_settings
from agent_engine.domain.budget import Budget, BudgetWindow, week_window

_SPENT_BY_OWNER_SQL = text(
    "SELECT a.user_id, COALESCE(SUM(r.tokens_used), 0) AS used"
    " FROM agents a JOIN agent_runs r ON r.agent_id = a.id"
    " WHERE a.user_id = ANY(CAST(:owner_ids AS bigint[]))"
    " AND r.finished_at >= :start AND r.finished_at < :end"
    " GROUP BY a.user_id"
)


async def owner_budget(conn: AsyncConnection, owner_id: int, *, now: datetime) -> Budget:
    """The owner's budget for the week containing `now`."""
    budgets = await owners_budgets(conn, [owner_id], now=now)
    return budgets[owner_id]


async def owners_budgets(
    conn: AsyncConnection,
    owner_ids: Collection[int],
    *,
    now: datetime,
    platform: PlatformSettings | None = None,
) -> dict[int, Budget]:
    """Budgets of many owners in one statement (the scheduler's batch, the API's page)."""
    if platform is None:
        platform = await load_platform_settings(conn)
    window = week_window(now, platform.zone)
    used = await spent_tokens(conn, owner_ids, window=window)
    return {
        owner_id: Budget(
            cap_tokens=platform.weekly_token_cap,
            used_tokens=used.get(owner_id, 0),
            window=window,
        )
        for owner_id in owner_ids
    }


async def spent_tokens(
    conn: AsyncConnection, owner_ids: Collection[int], *, window: BudgetWindow
) -> dict[int, int]:
    """Tokens spent per owner in the window; owners with no finished runs are absent."""
    if not owner_ids:
        return {}
    rows = await conn.execute(
        _SPENT_BY_OWNER_SQL,
        {"owner_ids": list(owner_ids), "start": window.start, "end": window.end},
    )
    return {int(owner_id): int(used) for owner_id, used in rows}


async def owners_over_budget(
    conn: AsyncConnection,
    owner_ids: Collection[int],
    *,
    now: datetime,
    platform: PlatformSettings,
) -> set[int]:
    """The owners whose weekly budget is spent; no statement at all when there is no cap."""
    if platform.weekly_token_cap is None or not owner_ids:
        return set()
    budgets = await owners_budgets(conn, owner_ids, now=now, platform=platform)
    return {owner_id for owner_id, budget in budgets.items() if budget.exceeded}
