"""The owner's weekly budget: a sum over the journal, never a counter.

`SUM(tokens_used)` over the runs of all the owner's agents whose `finished_at` falls in the current
week of the organisation zone, against the cap read from `platform_settings` at that moment. The
sum is `db.spend.spent_tokens`.
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from agent_engine.db.platform import PlatformSettings, load_platform_settings
from agent_engine.db.spend import agent_week_tokens, spent_tokens
from agent_engine.domain.budget import Budget, week_window


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


# The agents whose own cap (`weekly_token_cap`) their week has reached: one statement for a batch,
# an index probe per capped agent (agents without a cap are not summed).
_AGENTS_OVER_CAP_SQL = text(
    "SELECT a.id FROM agents a WHERE a.id = ANY(CAST(:agent_ids AS bigint[]))"
    " AND a.weekly_token_cap IS NOT NULL AND "
    + agent_week_tokens("a.id")
    + " >= a.weekly_token_cap"
)


async def agents_over_cap(
    conn: AsyncConnection,
    agent_ids: Collection[int],
    *,
    now: datetime,
    platform: PlatformSettings,
) -> set[int]:
    """The agents whose owner-set weekly cap is spent in the budget week containing `now` (the
    same week as the owner's budget: the organisation zone's, Sunday to Sunday)."""
    if not agent_ids:
        return set()
    window = week_window(now, platform.zone)
    rows = await conn.execute(
        _AGENTS_OVER_CAP_SQL,
        {"agent_ids": list(agent_ids), "start": window.start, "end": window.end},
    )
    return {int(agent_id) for (agent_id,) in rows}
