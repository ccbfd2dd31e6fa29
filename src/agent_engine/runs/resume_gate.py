"""A parked run goes on only while its agent may still run.

A run parked on its owner's approval was admitted once, but the wait may last a day, and meanwhile
an admin may pause the agent, its owner switch it off or delete it, an admin deactivate the owner
or remove the model from the allowed list. Each of those writes the agent row and, in the same
transaction, ends the agent's parked runs (`stop_parked_runs`): failed/cancelled with the reason in
`error`, their pending (or approved, not yet called) approvals `cancelled`. Three later checks catch
what that misses (a run that was executing then, a lock written some other way):

- the park (`refuse_park`) reads the gate holding the agent row: a run whose agent was locked
  while it ran ends instead of asking its owner;
- the resume (`refuse_resume`, in the claim's transaction) reads the gate and ends the run the
  same way instead of taking it back;
- the approved call's compare-and-set (`claim_call`) first reads the gate holding the agent row
  (FOR SHARE): a lock that committed before it stops the call, one that commits after it waited
  for it. So a call is never started after a pause (or any of the others) committed.

The budget does not stop a resume: the run was admitted when it started, and its spent tokens
already count (they were written when it parked).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from agent_engine.db import approvals as approvals_db
from agent_engine.db import connection_waits as waits_db
from agent_engine.db import runs as runs_sql
from agent_engine.domain.gate import RESUME_STOP_MESSAGES, ResumeStop, resume_stop
from agent_engine.runs.cancel import CHANNEL as CANCEL_CHANNEL

log = logging.getLogger(__name__)


async def stop_parked_runs(
    conn: AsyncConnection, agent_ids: Sequence[int], stop: ResumeStop, *, actor_id: int | None
) -> list[int]:
    """In the transaction that closed the agents' gate: end their parked runs and cancel their
    approvals. Returns the ended runs' ids, sorted."""
    error = RESUME_STOP_MESSAGES[stop]
    # The runs waiting for a connection end the same way (their waits first, their steps keep
    # the reason).
    await waits_db.cancel_open_of_agents(conn, agent_ids, error=error)
    ended = await approvals_db.end_parked_of_agents(conn, agent_ids, error=error, actor_id=actor_id)
    if ended:
        log.info("%s: ended the parked runs %s", stop, ended)
    return ended


async def refuse_resume(conn: AsyncConnection, run_id: int) -> ResumeStop | None:
    """In the claim's transaction (the run row locked, the agent row not: a pause holding it waits
    for this run's row): end the decided parked run if its agent may no longer run. Returns why,
    or None when it may go on."""
    stop = await _stop_of(conn, run_id, shared=False)
    if stop is not None:
        await _end(conn, run_id, stop)
    return stop


async def refuse_park(
    conn: AsyncConnection, run_id: int, *, step_end: dict[str, Any], step_index: int
) -> ResumeStop | None:
    """In the park's transaction, before the run parks (holding the agent row): a run whose
    agent was locked while it ran ends here instead of asking its owner. `step_end` (the step
    before the call, its tokens) is written first so it counts; the call's step is closed with
    the reason."""
    stop = await _stop_of(conn, run_id, shared=True)
    if stop is None:
        return None
    error = RESUME_STOP_MESSAGES[stop]
    await approvals_db.end_pending_step(conn, run_id, step_end)
    await approvals_db.close_step(conn, run_id, step_index, error=error)
    if (await conn.execute(runs_sql.CANCEL, {"run_id": run_id, "error": error})).first():
        log.info("run %s ended instead of parking: %s", run_id, error)
    return stop


async def claim_call(
    engine: AsyncEngine, run_id: int, wait_id: int, *, connection: bool = False
) -> bool:
    """The compare-and-set before an approved call (or, `connection`, the call its owner's new
    connection lets go on): True for exactly one attempt, and only while the agent may run. A
    closed gate ends the run (its worker is told, like a cancel's)."""
    async with engine.begin() as conn:
        stop = await _stop_of(conn, run_id, shared=True)
        if stop is None:
            if connection:
                return await waits_db.claim_call(conn, wait_id)
            return await approvals_db.claim_call(conn, wait_id)
        await _end(conn, run_id, stop)
        await conn.execute(runs_sql.NOTIFY, {"channel": CANCEL_CHANNEL, "payload": str(run_id)})
        return False


async def _stop_of(conn: AsyncConnection, run_id: int, *, shared: bool) -> ResumeStop | None:
    gate = await approvals_db.gate_of_run(conn, run_id, shared=shared)
    if gate is None:
        return ResumeStop.DELETED
    return resume_stop(
        enabled=gate.enabled,
        admin_paused=gate.admin_paused,
        has_model=gate.has_model,
        deleted=gate.deleted,
        owner_active=gate.owner_active,
    )


async def _end(conn: AsyncConnection, run_id: int, stop: ResumeStop) -> None:
    """End the run like a cancelled one; its approval first, so its waiting step keeps the reason
    (the run's end would close it with a generic one)."""
    error = RESUME_STOP_MESSAGES[stop]
    await waits_db.cancel_open(conn, [run_id], error=error)
    await approvals_db.cancel_open(conn, [run_id], actor_id=None, error=error)
    if (await conn.execute(runs_sql.CANCEL, {"run_id": run_id, "error": error})).first():
        log.info("run %s ended instead of going on: %s", run_id, error)
