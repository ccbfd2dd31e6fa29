"""The owner's weekly budget: a sum over the journal, never a counter.

`SUM(tokens_used)` over the runs of all the owner's agents whose `finished_at` falls in the current
week of the organisation zone, against the cap read from `platform_settings` at that moment. The
sum is `db.spend.spent_tokens` (for one owner, the gate's case: the week's `budget_weeks` row, which
the database keeps equal to the sum, see `db.spend.owner_week_tokens`).
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime

from sqlalchemy.ext.asyncio import AsyncConnection

from agent_engine.db.platform import PlatformSettings, load_platform_settings
from agent_engine.db.spend import agents_at_cap, spent_tokens
from agent_engine.domain.budget import Budget, week_window


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
    return await agents_at_cap(conn, agent_ids, window=week_window(now, platform.zone))
