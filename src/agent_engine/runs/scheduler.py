"""The schedule tick: claim due agents, journal a scheduled run each, advance their slots.

Each batch is one transaction of a fixed number of statements, whatever its size: claim
(`FOR NO KEY UPDATE … SKIP LOCKED`, so several clocks and workers split the due agents instead of
duplicating them; db/runs.py says why not `FOR UPDATE`), platform settings, the budget of the
batch's owners, the journal inserts and one `UPDATE … FROM unnest(…)` for the new slots. Messages
are sent after the commit, while the next batch is claimed.
"""

from __future__ import annotations

import asyncio
import json
import logging
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from agent_engine.db import runs as runs_sql
from agent_engine.db.platform import PlatformSettings, load_platform_settings
from agent_engine.domain.runs import RunState, RunTrigger
from agent_engine.domain.schedule import (
    Schedule,
    ScheduleError,
    parse_schedule,
    slot_after_fire,
)
from agent_engine.runs.budget import agents_over_cap, owners_over_budget
from agent_engine.runs.journal import insert_requested_runs
from agent_engine.runs.request import Enqueue, send_after_commit

log = logging.getLogger(__name__)

DEFAULT_BATCH_SIZE = 500


async def schedule_due_agents(
    engine: AsyncEngine,
    *,
    now: datetime,
    batch_size: int = DEFAULT_BATCH_SIZE,
    enqueue: Enqueue,
) -> int:
    """Process every agent due at `now`, batch by batch; returns how many agents were claimed.

    A committed batch's messages are sent while the next batch is claimed (the tick takes the
    longer of the two, not their sum); at most one batch's sends are in flight. Every committed
    batch's sends are awaited, also when a later batch fails.
    """
    total = 0
    sending: asyncio.Future[None] | None = None
    try:
        while True:
            claimed, queued_run_ids = await _process_batch(engine, now=now, batch_size=batch_size)
            if sending is not None:
                await asyncio.shield(sending)
            sending = asyncio.ensure_future(send_after_commit(enqueue, queued_run_ids))
            total += claimed
            # A short batch means nothing due is left unlocked; locked rows belong to another tick.
            if claimed < batch_size:
                return total
    finally:
        if sending is not None:
            # Shielded: a cancelled tick still hands every committed run's message to the broker.
            await asyncio.shield(sending)


async def _process_batch(
    engine: AsyncEngine, *, now: datetime, batch_size: int
) -> tuple[int, list[int]]:
    async with engine.begin() as conn:
        result = await conn.execute(
            runs_sql.CLAIM_DUE_AGENTS, {"now": now, "batch_size": batch_size}
        )
        due = [runs_sql.DueAgent.from_row(row) for row in result]
        if not due:
            return 0, []
        platform = await load_platform_settings(conn)
        spent_owners = await owners_over_budget(
            conn, {d.owner_id for d in due}, now=now, platform=platform
        )
        budget_spent = {d.agent_id for d in due if d.owner_id in spent_owners}
        capped = await agents_over_cap(
            conn,
            [d.agent_id for d in due if d.agent_id not in budget_spent],
            now=now,
            platform=platform,
        )
        rows = await insert_requested_runs(
            conn,
            [d.agent_id for d in due],
            trigger=RunTrigger.SCHEDULED,
            now=now,
            budget_spent=budget_spent,
            agent_cap_spent=capped,
        )
        await _advance_slots(conn, due, now=now, platform=platform)
    queued = [r.id for r in rows.values() if r.state == RunState.QUEUED]
    return len(due), queued


async def _advance_slots(
    conn: AsyncConnection,
    due: list[runs_sql.DueAgent],
    *,
    now: datetime,
    platform: PlatformSettings,
) -> None:
    schedules = _ScheduleCache()
    zones: dict[str | None, ZoneInfo] = {}
    next_run_ats: list[datetime | None] = []
    for agent in due:
        zone = zones.get(agent.owner_timezone)
        if zone is None:
            zone = zones[agent.owner_timezone] = platform.zone_of(agent.owner_timezone)
        next_run_ats.append(_next_slot(agent, schedules, now=now, zone=zone))
    await conn.execute(
        runs_sql.ADVANCE_SLOTS,
        {"agent_ids": [d.agent_id for d in due], "next_run_ats": next_run_ats},
    )


def _next_slot(
    agent: runs_sql.DueAgent, schedules: _ScheduleCache, *, now: datetime, zone: ZoneInfo
) -> datetime | None:
    try:
        schedule = schedules.get(agent.schedule_json)
    except (ValueError, ScheduleError):
        # An unreadable stored schedule must not be claimed again on every tick.
        log.exception("agent %s has an invalid schedule; clearing its next slot", agent.agent_id)
        return None
    if schedule is None:
        return None
    slot = slot_after_fire(schedule, fired_slot=agent.fired_slot, now=now, zone=zone)
    if slot <= now:
        log.error("agent %s: next slot %s is not after %s; clearing it", agent.agent_id, slot, now)
        return None
    return slot


class _ScheduleCache:
    """Schedules repeat across agents ("every 6 hours"): parse each distinct JSON once a batch."""

    def __init__(self) -> None:
        self._parsed: dict[str, Schedule | None] = {}

    def get(self, schedule_json: str | None) -> Schedule | None:
        if schedule_json is None:
            return None
        if schedule_json not in self._parsed:
            data: Any = json.loads(schedule_json)
            self._parsed[schedule_json] = parse_schedule(data)
        return self._parsed[schedule_json]
