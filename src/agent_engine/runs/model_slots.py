"""Per-model concurrency: at most `agent_models.max_concurrent_runs` runs of a model `running`.

The limit is held by PostgreSQL, not by a worker: the claim of a run of a limited model locks the
model's row (`FOR NO KEY UPDATE`, so claims of that model take turns across every worker and
process, while agents referencing the model are not blocked), then counts the model's `running`
runs and the runs waiting ahead of this one. Over the limit, the run stays `queued` and its
message is dropped — nothing polls. A slot is handed on by whoever frees it: a finishing (or
parking) run, a claim that ended a queued run without running it, the reaper (a dead worker's
runs), a raised limit. Each sends the execute messages of the model's waiting runs, as many as
there are free slots; duplicates are harmless (the claim is a compare-and-set) and the reaper
repeats the hand-on as a safety net.

A parked run (a WRITE call waiting for its owner) stays `running` but holds no slot. Once its
approval is decided it waits for a slot to resume, under the same lock: it is resumed only while
the model's running (unparked) runs are under the limit; otherwise the decision stays recorded,
the run stays parked and the message is dropped, like a queued run's. Decided parked runs come
first — they were admitted once already — so they count as ahead of every queued run, and the
hand-on sends them before the queued ones.

Oldest first: a queued run is admitted only if the runs waiting before it for the same model (the
decided parked runs and the runs queued before it) leave it a slot, so a new request cannot
overtake runs that have been waiting.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import TextClause
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from agent_engine.db import model_slots as slots_sql
from agent_engine.db.lane import autocommit
from agent_engine.runs.request import Enqueue, send_after_commit


@dataclass(frozen=True)
class Admission:
    admitted: bool
    limit: int | None
    running: int = 0
    ahead: int = 0


async def admit(
    conn: AsyncConnection, *, model_id: int, run_id: int, limit: int | None
) -> Admission:
    """Inside the claim's transaction: may this run of a model with `limit` start now?

    Takes the model's row lock (held to the claim's commit) when the model has a limit; a model
    without one is admitted with no lock and no count, so its claims never wait for each other.
    """
    if limit is None:
        return Admission(admitted=True, limit=None)
    locked = (await conn.execute(slots_sql.LOCK_MODEL, {"model_id": model_id})).one_or_none()
    limit = locked.max_concurrent_runs if locked is not None else None
    if limit is None:  # the limit was lifted (or the model removed) since the claim's read
        return Admission(admitted=True, limit=None)
    row = (
        await conn.execute(
            slots_sql.OCCUPANCY, {"model_id": model_id, "run_id": run_id, "limit": limit}
        )
    ).one()
    running, ahead = int(row.running), int(row.ahead)
    return Admission(admitted=running + ahead < limit, limit=limit, running=running, ahead=ahead)


async def admit_resume(conn: AsyncConnection, *, model_id: int | None) -> Admission:
    """Inside the claim's transaction: may this parked run of `model_id` (the model it started
    on), its approval decided, go on now? Only the model's running runs count: no queued run is
    ahead of a resume.

    Takes the model's row lock (held to the claim's commit) only when the model has a limit.
    """
    if model_id is None:
        return Admission(admitted=True, limit=None)
    locked = (
        await conn.execute(slots_sql.LOCK_LIMITED_MODEL, {"model_id": model_id})
    ).one_or_none()
    if locked is None:  # no limit (or the model was removed): nothing to wait for
        return Admission(admitted=True, limit=None)
    limit = int(locked.max_concurrent_runs)
    running = int((await conn.execute(slots_sql.RUNNING, {"model_id": model_id})).scalar_one())
    return Admission(admitted=running < limit, limit=limit, running=running)


async def hand_on_slots(engine: AsyncEngine, model_id: int, *, enqueue: Enqueue) -> list[int]:
    """Send the execute messages of the model's waiting runs, one per free slot: its decided
    parked runs first, then its oldest queued runs.

    Called after something freed a slot or raised the limit; returns the runs it sent.
    """
    return await _send_waiting(engine, slots_sql.NEXT_WAITING, model_id, enqueue)


async def wake_after_limit_change(
    engine: AsyncEngine, model_id: int, *, limit: int | None, enqueue: Enqueue
) -> list[int]:
    """The admin raised the model's limit (new slots) or lifted it (every waiting run may go)."""
    statement = slots_sql.ALL_WAITING if limit is None else slots_sql.NEXT_WAITING
    return await _send_waiting(engine, statement, model_id, enqueue)


async def _send_waiting(
    engine: AsyncEngine, statement: TextClause, model_id: int, enqueue: Enqueue
) -> list[int]:
    async with autocommit(engine) as conn:
        result = await conn.execute(statement, {"model_id": model_id})
        waiting = [int(row.id) for row in result]
    await send_after_commit(enqueue, waiting)
    return waiting


async def waiting_with_free_slots(conn: AsyncConnection, *, cutoff: datetime) -> list[int]:
    """For the reaper: runs of limited models waiting since before `cutoff` (queued, or parked
    with their approval decided) that have a slot."""
    result = await conn.execute(slots_sql.WAITING_WITH_FREE_SLOTS, {"cutoff": cutoff})
    return [int(row.id) for row in result]
