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
from zoneinfo import ZoneInfo

from sqlalchemy.ext.asyncio import AsyncConnection

from agent_engine.db import agents as agents_db
from agent_engine.db.agents import CalendarAgent
from agent_engine.domain.schedule import ScheduleError, parse_schedule, slot_after_zone_change

log = logging.getLogger(__name__)


async def reslot_owner_calendar_agents(
    conn: AsyncConnection, owner_id: int, *, zone: ZoneInfo, now: datetime
) -> int:
    """After the owner's zone changed to `zone`; returns how many agents moved."""
    agents = await agents_db.lock_calendar_agents_of_owner(conn, owner_id)
    return await _reslot(conn, agents, zone=zone, now=now)


async def reslot_calendar_agents_without_owner_zone(
    conn: AsyncConnection, *, zone: ZoneInfo, now: datetime
) -> int:
    """After the organisation zone changed to `zone`: the agents of owners with no zone."""
    agents = await agents_db.lock_calendar_agents_without_owner_zone(conn)
    return await _reslot(conn, agents, zone=zone, now=now)


async def _reslot(
    conn: AsyncConnection, agents: Sequence[CalendarAgent], *, zone: ZoneInfo, now: datetime
) -> int:
    if not agents:
        return 0
    fired = await agents_db.last_scheduled_fires(conn, [agent.id for agent in agents])
    slots: list[tuple[int, datetime | None]] = []
    for agent in agents:
        try:
            schedule = parse_schedule(agent.schedule)
        except ScheduleError:
            # Stored schedules are checked on write; an unreadable one must not fail sign-in.
            log.exception("agent %s has an invalid schedule; its slot is left as it is", agent.id)
            continue
        if schedule is None:
            continue
        slot = slot_after_zone_change(schedule, now=now, zone=zone, last_fired=fired.get(agent.id))
        slots.append((agent.id, slot))
    await agents_db.set_next_run_at(conn, slots)
    return len(slots)
