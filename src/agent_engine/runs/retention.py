"""Run retention: the clock's periodic pruning of old finished runs (`runRetentionDays`).

A run is pruned when it finished before the cutoff (`domain.retention.retention_cutoff`: older
than the setting *and* before the current budget week) unless it is one its agent keeps:
- its newest finished run, whatever the state (`lastRun`, "what happened last time"), and
- its newest successful run (the `previous_output` tool reads it).
Unfinished runs have no `finished_at` and are never candidates. Steps, deliveries and anything
else that hangs off a run goes with it (`ON DELETE CASCADE`).

The pass walks the candidates in `(finished_at, id)` order in small batches, each its own short
transaction, and after each batch pauses three times as long as the batch took (within a floor
and a ceiling): the pass works about a quarter of the time and backs off when the database is
busy, so the run pipeline keeps it (a backlog of a million old runs takes minutes, not seconds,
and the pipeline barely notices; see bench/README.md). One pass at a time across the cluster: a
session advisory lock (two clocks send two ticks; the second pass finds the lock taken and
returns). A pass stops after `max_seconds`; the next tick carries on where the data says, since
pruned rows are gone.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from agent_engine.db import activity
from agent_engine.db import retention as retention_sql
from agent_engine.db.platform import load_platform_settings
from agent_engine.domain.retention import retention_cutoff

log = logging.getLogger(__name__)

RETENTION_BATCH_SIZE = 500
# Leaves the database to the run pipeline between batches: the pause is the batch's own duration
# times this factor, and at least the floor.
RETENTION_PAUSE_FACTOR = 3.0
RETENTION_BATCH_PAUSE_SECONDS = 0.02
# ... and at most this: one batch that waited on a lock does not stall the pass.
RETENTION_MAX_PAUSE_SECONDS = 1.0
# Below the tick actor's time limit; the next tick continues.
RETENTION_PASS_MAX_SECONDS = 240.0
# pg_advisory_lock key of the pruning pass ("AEretain" as eight bytes, well clear of other keys).
RETENTION_LOCK_KEY = 0x4145726574616E

_FIRST_CURSOR = (datetime(1, 1, 1, tzinfo=UTC), 0)


@dataclass(frozen=True)
class PruneResult:
    deleted: int = 0
    scanned: int = 0
    batches: int = 0
    cutoff: datetime | None = None
    # False when the pass stopped early (time budget) or another pass held the lock.
    complete: bool = True
    skipped_locked: bool = False


async def prune_finished_runs(
    engine: AsyncEngine,
    *,
    now: datetime,
    batch_size: int = RETENTION_BATCH_SIZE,
    pause_seconds: float = RETENTION_BATCH_PAUSE_SECONDS,
    max_seconds: float = RETENTION_PASS_MAX_SECONDS,
) -> PruneResult:
    """One pruning pass under the settings read now; a no-op while retention is off."""
    async with engine.connect() as conn:
        platform = await load_platform_settings(conn)
        await conn.commit()
        if platform.run_retention_days is None:
            return PruneResult()
        cutoff = retention_cutoff(
            now, retention_days=platform.run_retention_days, zone=platform.zone
        )
        if not await _try_lock(conn):
            return PruneResult(cutoff=cutoff, complete=False, skipped_locked=True)
        try:
            return await _prune(
                conn,
                cutoff=cutoff,
                batch_size=batch_size,
                pause_seconds=pause_seconds,
                max_seconds=max_seconds,
            )
        finally:
            await _unlock(conn)


async def _prune(
    conn: AsyncConnection,
    *,
    cutoff: datetime,
    batch_size: int,
    pause_seconds: float,
    max_seconds: float,
) -> PruneResult:
    deadline = time.monotonic() + max_seconds
    after_at, after_id = _FIRST_CURSOR
    deleted = scanned = batches = 0
    while True:
        batch_started = time.monotonic()
        async with conn.begin():
            row = (
                await conn.execute(
                    retention_sql.PRUNE_BATCH,
                    {
                        "cutoff": cutoff,
                        "after_at": after_at,
                        "after_id": after_id,
                        "batch": batch_size,
                    },
                )
            ).one()
            if row.deleted:
                await activity.bump(conn, activity.RUNS_PRUNED, int(row.deleted))
        batches += 1
        deleted += int(row.deleted)
        scanned += int(row.scanned)
        if row.scanned < batch_size:
            return PruneResult(deleted, scanned, batches, cutoff, complete=True)
        after_at, after_id = row.last_at, int(row.last_id)
        if time.monotonic() >= deadline:
            log.info("retention: pass stopped after %.0fs; the next tick goes on", max_seconds)
            return PruneResult(deleted, scanned, batches, cutoff, complete=False)
        batch_seconds = time.monotonic() - batch_started
        await asyncio.sleep(
            min(
                max(pause_seconds, batch_seconds * RETENTION_PAUSE_FACTOR),
                RETENTION_MAX_PAUSE_SECONDS,
            )
        )


async def _try_lock(conn: AsyncConnection) -> bool:
    locked = bool(
        (await conn.execute(retention_sql.TRY_LOCK, {"key": RETENTION_LOCK_KEY})).scalar_one()
    )
    await conn.commit()
    return locked


async def _unlock(conn: AsyncConnection) -> None:
    """Release the session lock; if that fails, drop the connection (which releases it too)
    rather than return it to the pool still holding the lock."""
    try:
        await conn.rollback()
        await conn.execute(retention_sql.UNLOCK, {"key": RETENTION_LOCK_KEY})
        await conn.commit()
    except Exception:
        await conn.invalidate()
        raise
