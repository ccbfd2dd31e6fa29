"""The statements `/metrics` reads at scrape time: cluster-wide facts from the journal.

Every query is bounded by an index (the budget window on `finished_at`, the partial unfinished-run
index, the due-scan index), so a scrape stays cheap on a large journal.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

# Runs finished this long ago still count in the "recent" families (a PostgreSQL interval).
RECENT_WINDOW = "1 hour"


@dataclass(frozen=True, slots=True)
class Fact:
    """One line of a snapshot: what it counts (`kind`), up to two labels, and the number."""

    kind: str
    label: str | None
    detail: str | None
    value: float


RUNS_SNAPSHOT = text(
    f"""
    WITH recent AS (
        SELECT state, reason, tokens_used,
               EXTRACT(EPOCH FROM finished_at - started_at) AS seconds
        FROM agent_runs
        WHERE finished_at >= now() - interval '{RECENT_WINDOW}'
    )
    SELECT 'finished' AS kind, state, reason, count(*)::float8 AS value FROM recent
        GROUP BY state, reason
    UNION ALL
    SELECT 'unfinished', state, NULL, count(*)::float8 FROM agent_runs
        WHERE state IN ('queued', 'running') GROUP BY state
    UNION ALL
    SELECT 'tokens', NULL, NULL, coalesce(sum(tokens_used), 0)::float8 FROM recent
    UNION ALL
    SELECT 'duration_q', NULL, q::text,
           coalesce(percentile_cont(q) WITHIN GROUP (ORDER BY seconds), 0)::float8
        FROM recent, unnest(ARRAY[0.5, 0.9, 0.99]) AS q
        WHERE seconds IS NOT NULL GROUP BY q
    UNION ALL
    SELECT 'lag', NULL, NULL,
           coalesce(EXTRACT(EPOCH FROM now() - min(next_run_at)), 0)::float8
        FROM agents WHERE next_run_at IS NOT NULL AND next_run_at <= now()
    UNION ALL
    SELECT 'queue_age', NULL, NULL,
           coalesce(EXTRACT(EPOCH FROM now() - min(created_at)), 0)::float8
        FROM agent_runs WHERE state = 'queued'
    UNION ALL
    SELECT 'heartbeat_age', NULL, NULL,
           coalesce(EXTRACT(EPOCH FROM now() - min(coalesce(heartbeat_at, started_at))), 0)::float8
        FROM agent_runs WHERE state = 'running' AND parked_at IS NULL
    UNION ALL
    SELECT 'activity_count', name, NULL, count::float8 FROM engine_activity
    UNION ALL
    SELECT 'activity_age', name, NULL, EXTRACT(EPOCH FROM now() - last_at)::float8
        FROM engine_activity WHERE last_at IS NOT NULL
    """
)

# Budget alerts ever recorded, by threshold: a counter read from the table (a few rows per owner
# and week), so every replica reports the same, whichever worker recorded them.
BUDGET_ALERTS_BY_PERCENT = text("SELECT percent, count(*) FROM budget_alerts GROUP BY percent")

# Deliveries (the outbox): pending ones now (and how many are overdue, i.e. not sent when due --
# no clock or no worker on the `deliveries` queue), and those finished in the recent window by
# outcome. Index-backed: the partial due index and the partial finished_at index.
DELIVERIES_SNAPSHOT = text(
    f"""
    SELECT 'pending' AS kind, NULL AS status, count(*)::float8 AS value
        FROM run_deliveries WHERE status = 'pending'
    UNION ALL
    SELECT 'overdue', NULL, count(*)::float8 FROM run_deliveries
        WHERE status = 'pending' AND next_attempt_at < now() - interval '1 minute'
        AND (leased_until IS NULL OR leased_until < now())
    UNION ALL
    SELECT 'finished', status, count(*)::float8 FROM run_deliveries
        WHERE finished_at >= now() - interval '{RECENT_WINDOW}' GROUP BY status
    """
)


async def runs_snapshot(conn: AsyncConnection) -> list[Fact]:
    """Runs, scheduler and engine activity in one statement: `label` is the state (or the
    activity's name), `detail` the reason (or the quantile)."""
    rows = await conn.execute(RUNS_SNAPSHOT)
    return [Fact(kind, state, reason, value) for kind, state, reason, value in rows]


async def budget_alerts_by_percent(conn: AsyncConnection) -> dict[int, int]:
    return {
        int(percent): int(count) for percent, count in await conn.execute(BUDGET_ALERTS_BY_PERCENT)
    }


async def deliveries_snapshot(conn: AsyncConnection) -> list[Fact]:
    """Pending, overdue, and finished-recently by status (`label`)."""
    rows = await conn.execute(DELIVERIES_SNAPSHOT)
    return [Fact(kind, status, None, value) for kind, status, value in rows]
