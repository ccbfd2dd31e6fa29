"""`engine_activity`: cluster-wide counters and last-seen times of the engine's periodic work.

The workers that do the work bump them in the database (any worker may run any tick), and every
api replica reads the same numbers at scrape time (`observability/metrics.py`).
"""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

RUNS_PRUNED = "runs_pruned"
TICK_PREFIX = "tick."

_BUMP_SQL = text(
    "INSERT INTO engine_activity (name, count, last_at) VALUES (:name, :by, now())"
    " ON CONFLICT (name) DO UPDATE"
    " SET count = engine_activity.count + EXCLUDED.count, last_at = EXCLUDED.last_at"
)


def tick_name(tick: str) -> str:
    return TICK_PREFIX + tick


async def bump(conn: AsyncConnection, name: str, by: int = 1) -> None:
    """Add `by` to the counter and stamp it with the database's `now()`, in the caller's
    transaction (so pruned rows and their count commit together)."""
    await conn.execute(_BUMP_SQL, {"name": name, "by": by})
