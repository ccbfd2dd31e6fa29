"""Journal writes shared by the manual and the scheduled request paths.

One set of statements for one agent or a batch of thousands: the manual start calls them with a
list of one. The partial unique index `(agent_id) WHERE state IN ('queued','running')` settles
races; a refused insert becomes a `skipped`/`already_running` row.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from agent_engine.domain.runs import RunReason, RunTrigger

# ON CONFLICT names the partial index by its columns and predicate: the refused rows are simply
# not returned, with no exception and no aborted transaction.
# `model_id` records the model the run is queued for: a model's limit counts its runs, and its
# waiting runs are found oldest first by it (the claim refreshes it if the owner switched models).
_INSERT_QUEUED_SQL = text(
    "INSERT INTO agent_runs (agent_id, model_id, trigger, state, tokens_used, created_at)"
    " SELECT t.agent_id, a.model_id, :trigger, 'queued', 0, :now"
    " FROM unnest(CAST(:agent_ids AS bigint[])) AS t(agent_id)"
    " JOIN agents a ON a.id = t.agent_id"
    " ORDER BY t.agent_id"
    " ON CONFLICT (agent_id) WHERE state IN ('queued', 'running') DO NOTHING"
    " RETURNING *"
)

# Skipped rows are terminal at once: no loop ran (tokens 0, started_at NULL), and finished_at
# shows in the journal when the engine refused.
_INSERT_SKIPPED_SQL = text(
    "INSERT INTO agent_runs"
    " (agent_id, trigger, state, reason, tokens_used, finished_at, created_at)"
    " SELECT t.agent_id, :trigger, 'skipped', t.reason, 0, :now, :now"
    " FROM unnest(CAST(:agent_ids AS bigint[]), CAST(:reasons AS text[])) AS t(agent_id, reason)"
    " RETURNING *"
)


async def insert_requested_runs(
    conn: AsyncConnection,
    agent_ids: Sequence[int],
    *,
    trigger: RunTrigger,
    now: datetime,
    budget_spent: Collection[int] = (),
) -> dict[int, dict[str, Any]]:
    """One journal row per agent: `queued`, or `skipped` with the reason. Keyed by agent id.

    `budget_spent` holds the agents whose owner's weekly budget is spent. Agents must be distinct.
    """
    rows: dict[int, dict[str, Any]] = {}
    candidates = sorted(a for a in agent_ids if a not in budget_spent)
    if candidates:
        result = await conn.execute(
            _INSERT_QUEUED_SQL,
            {"agent_ids": candidates, "trigger": str(trigger), "now": now},
        )
        for row in result:
            mapping = dict(row._mapping)
            rows[int(mapping["agent_id"])] = mapping
    skipped: list[tuple[int, str]] = [
        (a, str(RunReason.BUDGET_EXCEEDED)) for a in agent_ids if a in budget_spent
    ]
    skipped += [(a, str(RunReason.ALREADY_RUNNING)) for a in candidates if a not in rows]
    if skipped:
        result = await conn.execute(
            _INSERT_SKIPPED_SQL,
            {
                "agent_ids": [a for a, _ in skipped],
                "reasons": [reason for _, reason in skipped],
                "trigger": str(trigger),
                "now": now,
            },
        )
        for row in result:
            mapping = dict(row._mapping)
            rows[int(mapping["agent_id"])] = mapping
    return rows
