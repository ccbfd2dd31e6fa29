"""Journal writes shared by the manual and the scheduled request paths.

One set of statements for one agent or a batch of thousands: the manual start calls them with a
list of one. The partial unique index `(agent_id) WHERE state IN ('queued','running')` settles
races; a refused insert becomes a `skipped`/`already_running` row.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from datetime import datetime

from sqlalchemy.ext.asyncio import AsyncConnection

from agent_engine.db import runs as runs_sql
from agent_engine.domain.runs import RunReason, RunTrigger


async def insert_requested_runs(
    conn: AsyncConnection,
    agent_ids: Sequence[int],
    *,
    trigger: RunTrigger,
    now: datetime | None,
    budget_spent: Collection[int] = (),
    agent_cap_spent: Collection[int] = (),
    retry_of: int | None = None,
) -> dict[int, runs_sql.RunRow]:
    """One journal row per agent: `queued`, or `skipped` with the reason. Keyed by agent id.

    `budget_spent` holds the agents whose owner's weekly budget is spent, `agent_cap_spent` those
    whose own weekly cap is (the owner's budget is named first when both are). `retry_of`: the
    failed run a (single) retry request continues. Agents must be distinct.
    The rows' times are `now`, or the database's `now()` when it is None.
    """
    rows: dict[int, runs_sql.RunRow] = {}
    candidates = sorted(a for a in agent_ids if a not in budget_spent and a not in agent_cap_spent)
    if candidates:
        result = await conn.execute(
            runs_sql.INSERT_QUEUED,
            {"agent_ids": candidates, "trigger": str(trigger), "now": now, "retry_of": retry_of},
        )
        for row in result:
            run = runs_sql.RunRow.from_row(row)
            rows[run.agent_id] = run
    skipped: list[tuple[int, str]] = [
        (a, str(RunReason.BUDGET_EXCEEDED)) for a in agent_ids if a in budget_spent
    ]
    skipped += [
        (a, str(RunReason.AGENT_BUDGET_EXCEEDED))
        for a in agent_ids
        if a in agent_cap_spent and a not in budget_spent
    ]
    skipped += [(a, str(RunReason.ALREADY_RUNNING)) for a in candidates if a not in rows]
    if skipped:
        result = await conn.execute(
            runs_sql.INSERT_SKIPPED,
            {
                "agent_ids": [a for a, _ in skipped],
                "reasons": [reason for _, reason in skipped],
                "trigger": str(trigger),
                "now": now,
            },
        )
        for row in result:
            run = runs_sql.RunRow.from_row(row)
            rows[run.agent_id] = run
    return rows
