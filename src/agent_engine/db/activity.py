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


# Model fallbacks: one counter per (model that was down, model that answered, cause), named
# FALLBACK_PREFIX + the three joined by FALLBACK_SEPARATOR (a character no model name holds).
FALLBACK_PREFIX = "fallback."
FALLBACK_SEPARATOR = "\x1f"


def fallback_name(model: str, fallback: str, cause: str) -> str:
    return FALLBACK_PREFIX + FALLBACK_SEPARATOR.join((model, fallback, cause))


def fallback_labels(name: str) -> tuple[str, str, str] | None:
    """(model, fallback, cause) of a `fallback_name`, or None for another counter."""
    if not name.startswith(FALLBACK_PREFIX):
        return None
    parts = name.removeprefix(FALLBACK_PREFIX).split(FALLBACK_SEPARATOR)
    return (parts[0], parts[1], parts[2]) if len(parts) == 3 else None


def tick_name(tick: str) -> str:
    return TICK_PREFIX + tick


async def bump(conn: AsyncConnection, name: str, by: int = 1) -> None:
    """Add `by` to the counter and stamp it with the database's `now()`, in the caller's
    transaction (so pruned rows and their count commit together)."""
    await conn.execute(_BUMP_SQL, {"name": name, "by": by})
