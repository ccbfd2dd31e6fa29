"""Deleting an agent without refunding the week.

The weekly budget is a sum over the runs of the owner's agents, and `agent_runs` cascades with its
agent (the seed's model). Deleting an agent row whose runs still count would lower the owner's
spend -- an owner at the cap could delete the agent, create another and run on. So `deleteAgent`:

- deletes the row (runs and tool links cascade) when none of its runs can count any more: no
  unfinished run, and no run that spent tokens finished within `COUNTED_SPEND_HORIZON`;
- otherwise *hides* it: `deleted_at` is set and the owner's switch turned off in the same write
  (a CHECK holds it: a hidden agent is always switched off, so the gate stays closed and the
  scheduler never sees it), its queued run is failed, and every read of agents leaves it out. A
  run already running finishes and its tokens count. The budget sum alone still reads it.

`purge_hidden_agents` (on the reaper's tick) deletes hidden agents once their runs stopped
counting.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from agent_engine.agents.errors import Missing

# A run that finished longer ago than this lies before the current budget week in every zone: a
# week is 7 days (7 days and an hour across a DST change) and contains now.
COUNTED_SPEND_HORIZON = timedelta(days=8)
PURGE_BATCH_SIZE = 500
DELETED_ERROR = "the agent was deleted before the run started"

# Whether any run of agent `a` counts, or may still count, in a budget week.
_STILL_COUNTED = (
    "EXISTS (SELECT 1 FROM agent_runs r WHERE r.agent_id = a.id"
    " AND (r.state IN ('queued', 'running')"
    " OR (r.tokens_used > 0 AND r.finished_at >= :horizon)))"
)

_LOCK_LIVE_AGENT = text("SELECT id FROM agents WHERE id = :id AND deleted_at IS NULL FOR UPDATE")
# Hidden before its runs change, so the NOTIFY trigger is already silent for them.
_HIDE = text("UPDATE agents SET deleted_at = :now, enabled = false WHERE id = :id")
_FAIL_QUEUED = text(
    "UPDATE agent_runs SET state = 'failed', reason = 'error', error = :error, finished_at = :now"
    " WHERE agent_id = :id AND state = 'queued'"
)
_DELETE_IF_UNCOUNTED = text(
    f"DELETE FROM agents a WHERE a.id = :id AND NOT {_STILL_COUNTED} RETURNING a.id"
)
_PURGE = text(
    "DELETE FROM agents WHERE id IN ("
    " SELECT a.id FROM agents a WHERE a.deleted_at IS NOT NULL"
    f" AND NOT {_STILL_COUNTED}"
    " ORDER BY a.id LIMIT :limit FOR UPDATE SKIP LOCKED)"
    " RETURNING id"
)


async def delete_agent(conn: AsyncConnection, agent_id: int, *, now: datetime) -> bool:
    """Delete or hide the agent; True when the row was deleted, False when it is hidden.

    The row lock orders this after (or before) a concurrent manual start, which holds a key-share
    lock on the agent from its gate check to its journal insert.
    """
    if (await conn.execute(_LOCK_LIVE_AGENT, {"id": agent_id})).first() is None:
        raise Missing("agent", agent_id)
    await conn.execute(_HIDE, {"id": agent_id, "now": now})
    await conn.execute(_FAIL_QUEUED, {"id": agent_id, "now": now, "error": DELETED_ERROR})
    deleted = await conn.execute(
        _DELETE_IF_UNCOUNTED, {"id": agent_id, "horizon": now - COUNTED_SPEND_HORIZON}
    )
    return deleted.first() is not None


async def purge_hidden_agents(
    conn: AsyncConnection, *, now: datetime, limit: int = PURGE_BATCH_SIZE
) -> list[int]:
    """Delete hidden agents none of whose runs can count any more; returns their ids."""
    rows = await conn.execute(_PURGE, {"horizon": now - COUNTED_SPEND_HORIZON, "limit": limit})
    return sorted(int(row.id) for row in rows)
