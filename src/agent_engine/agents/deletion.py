"""Deleting an agent without refunding the week.

The weekly budget is a sum over the runs of the owner's agents, and `agent_runs` cascades with its
agent (the seed's model). Deleting an agent row whose runs still count would lower the owner's
spend -- an owner at the cap could delete the agent, create another and run on. So `deleteAgent`:

- deletes the row (runs and tool links cascade) when none of its runs can count any more: no
  unfinished run, and no run that spent tokens finished within `COUNTED_SPEND_HORIZON`;
- otherwise *hides* it: `deleted_at` is set and the owner's switch turned off in the same write
  (a CHECK holds it: a hidden agent is always switched off, so the gate stays closed and the
  scheduler never sees it), its queued run is failed, a run parked on its owner's approval is
  ended (failed/cancelled, `runs/resume_gate.py`), and every read of agents leaves it out. A
  run already running finishes and its tokens count. The budget sum alone still reads it.

`purge_hidden_agents` (on the reaper's tick) deletes hidden agents once their runs stopped
counting.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy.ext.asyncio import AsyncConnection

from agent_engine.agents.errors import Missing, UnderReview
from agent_engine.db import agents as agents_db
from agent_engine.domain.gate import ResumeStop
from agent_engine.runs import resume_gate

# A run that finished longer ago than this lies before the current budget week in every zone: a
# week is 7 days (7 days and an hour across a DST change) and contains now.
COUNTED_SPEND_HORIZON = timedelta(days=8)
PURGE_BATCH_SIZE = 500
DELETED_ERROR = "the agent was deleted before the run started"


async def delete_agent(
    conn: AsyncConnection,
    agent_id: int,
    *,
    now: datetime,
    by_admin: bool = True,
    database_clock: bool = False,
    actor_id: int | None = None,
) -> bool:
    """Delete or hide the agent; True when the row was deleted, False when it is hidden.

    An agent an admin paused is under review: only an admin may delete it (`by_admin`), or its
    owner could escape the pause by deleting and creating it again. `database_clock`: the hidden
    row's and the failed run's times are the database's `now()` rather than `now` (which still
    decides which runs count). `actor_id`: who deleted it, recorded on the approvals of its
    parked runs, which are cancelled.

    The row lock orders this after (or before) a concurrent manual start, which holds a key-share
    lock on the agent from its gate check to its journal insert, and after a concurrent pause.
    """
    locked = await agents_db.lock_live_agent(conn, agent_id)
    if locked is None:
        raise Missing("agent", agent_id)
    if locked.admin_paused and not by_admin:
        raise UnderReview(agent_id, locked.admin_pause_note)
    written_at = None if database_clock else now
    await agents_db.hide_agent(conn, agent_id, now=written_at)
    await agents_db.fail_queued_run(conn, agent_id, error=DELETED_ERROR, now=written_at)
    # A run parked on its owner's approval ends too (it counts on, as a finished run).
    await resume_gate.stop_parked_runs(conn, [agent_id], ResumeStop.DELETED, actor_id=actor_id)
    return await agents_db.delete_if_uncounted(conn, agent_id, horizon=now - COUNTED_SPEND_HORIZON)


async def purge_hidden_agents(
    conn: AsyncConnection, *, now: datetime, limit: int = PURGE_BATCH_SIZE
) -> list[int]:
    """Delete hidden agents none of whose runs can count any more; returns their ids."""
    return await agents_db.purge_hidden(conn, horizon=now - COUNTED_SPEND_HORIZON, limit=limit)
