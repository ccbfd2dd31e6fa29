"""What the live streams read when woken: the runs named by a burst of run-event notifications
(on the live bus's own asyncpg connection, `api/live/postgres.py`) and a run's steps since a
runSteps subscriber last looked."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import asyncpg
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

# asyncpg's own placeholders: the live bus's loader is a plain asyncpg connection, not the pool's.
RUNS_BY_ID = "SELECT * FROM agent_runs WHERE id = ANY($1::bigint[])"
# The run's state and its steps from `from_index` on, in one read (one row with NULL step columns
# when there are none; no row when the run is gone).
STEPS_SINCE = text(
    "SELECT r.state AS run_state, s.* FROM agent_runs r"
    " LEFT JOIN agent_run_steps s ON s.run_id = r.id AND s.index >= :from_index"
    " WHERE r.id = :run_id ORDER BY s.index"
)


async def load_runs(conn: asyncpg.Connection, run_ids: Sequence[int]) -> dict[int, dict[str, Any]]:
    """The runs of `run_ids` that still exist, by id."""
    records = await conn.fetch(RUNS_BY_ID, list(run_ids))
    return {int(r["id"]): dict(r) for r in records}


async def steps_since(
    conn: AsyncConnection, run_id: int, *, from_index: int
) -> list[dict[str, Any]]:
    """The `STEPS_SINCE` rows; empty when the run is gone."""
    result = await conn.execute(STEPS_SINCE, {"run_id": run_id, "from_index": from_index})
    return [dict(r) for r in result.mappings()]
