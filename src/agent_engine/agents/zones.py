"""A zone change moves calendar slots.

Calendar slots are wall-clock in the owner's zone (`users.timezone`, else the organisation's), so
when that zone changes -- a new `zoneinfo` claim, or a new organisation zone for owners without
one -- the stored `next_run_at` of their calendar agents is recomputed in the same transaction.
Interval slots are absolute time and stay. The new slot also skips the local day (or week) in
which the agent last fired under the old zone, so a zone change never makes it fire twice in one
(`domain.schedule.slot_after_zone_change`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

from sqlalchemy import Row, text
from sqlalchemy.ext.asyncio import AsyncConnection

from agent_engine.domain.schedule import ScheduleError, parse_schedule, slot_after_zone_change

log = logging.getLogger(__name__)

# next_run_at IS NOT NULL: the startable, scheduled, live agents (the gate trigger clears it for
# every other one). Locked so the scheduler's claim (SKIP LOCKED) leaves them to us meanwhile.
_CALENDAR_AGENTS_OF_OWNER = text(
    "SELECT a.id, a.schedule FROM agents a"
    " WHERE a.user_id = :owner AND a.next_run_at IS NOT NULL"
    " AND a.schedule->>'type' = 'calendar'"
    " ORDER BY a.id FOR UPDATE"
)
_CALENDAR_AGENTS_WITHOUT_OWNER_ZONE = text(
    "SELECT a.id, a.schedule FROM agents a JOIN users u ON u.id = a.user_id"
    " WHERE u.timezone IS NULL AND a.next_run_at IS NOT NULL"
    " AND a.schedule->>'type' = 'calendar'"
    " ORDER BY a.id FOR UPDATE OF a"
)
_LAST_SCHEDULED_FIRES = text(
    "SELECT agent_id, max(created_at) AS fired FROM agent_runs"
    " WHERE agent_id = ANY(CAST(:ids AS bigint[])) AND trigger = 'scheduled'"
    " GROUP BY agent_id"
)
_SET_NEXT_RUN_AT = text("UPDATE agents SET next_run_at = :next_run_at WHERE id = :id")


async def reslot_owner_calendar_agents(
    conn: AsyncConnection, owner_id: int, *, zone: ZoneInfo, now: datetime
) -> int:
    """After the owner's zone changed to `zone`; returns how many agents moved."""
    rows = (await conn.execute(_CALENDAR_AGENTS_OF_OWNER, {"owner": owner_id})).all()
    return await _reslot(conn, rows, zone=zone, now=now)


async def reslot_calendar_agents_without_owner_zone(
    conn: AsyncConnection, *, zone: ZoneInfo, now: datetime
) -> int:
    """After the organisation zone changed to `zone`: the agents of owners with no zone."""
    rows = (await conn.execute(_CALENDAR_AGENTS_WITHOUT_OWNER_ZONE)).all()
    return await _reslot(conn, rows, zone=zone, now=now)


async def _reslot(
    conn: AsyncConnection, rows: Sequence[Row[Any]], *, zone: ZoneInfo, now: datetime
) -> int:
    if not rows:
        return 0
    fired = {
        int(row.agent_id): row.fired
        for row in await conn.execute(_LAST_SCHEDULED_FIRES, {"ids": [int(r.id) for r in rows]})
    }
    updates = []
    for row in rows:
        try:
            schedule = parse_schedule(row.schedule)
        except ScheduleError:
            # Stored schedules are checked on write; an unreadable one must not fail sign-in.
            log.exception("agent %s has an invalid schedule; its slot is left as it is", row.id)
            continue
        if schedule is None:
            continue
        slot = slot_after_zone_change(
            schedule, now=now, zone=zone, last_fired=fired.get(int(row.id))
        )
        updates.append({"id": int(row.id), "next_run_at": slot})
    if updates:
        await conn.execute(_SET_NEXT_RUN_AT, updates)
    return len(updates)
