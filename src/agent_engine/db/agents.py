"""Statements on `agents` and `agent_tools`: definitions, their tool links, deletion, zone slots.

The rules around them (which model, which tools, when `next_run_at` is recomputed, whether a
deletion hides or deletes) live in `agents/`; this module only names the statements. The row
itself and the API's reads live in `db/agent_reads.py` (re-exported here).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from agent_engine.db.agent_reads import AgentRow as AgentRow
from agent_engine.db.agent_reads import agents_as_they_were as agents_as_they_were
from agent_engine.db.agent_reads import fetch_live_agent as fetch_live_agent
from agent_engine.db.agent_reads import live_agent_page as live_agent_page
from agent_engine.db.agent_reads import live_agents_by_id as live_agents_by_id
from agent_engine.db.agent_reads import live_agents_of_owners as live_agents_of_owners


@dataclass(frozen=True, slots=True)
class ScheduleState:
    """What an update needs of the live agent it locked to recompute `next_run_at`."""

    user_id: int
    schedule: dict[str, Any] | None
    next_run_at: datetime | None


# Columns an update may set; anything else is a programming error.
UPDATABLE_COLUMNS = frozenset(
    {
        "name",
        "description",
        "prompt",
        "schedule",
        "model_id",
        "meta",
        "enabled",
        "admin_paused",
        "admin_pause_note",
        "weekly_token_cap",
        "max_tokens_per_run",
    }
)
JSON_COLUMNS = frozenset({"schedule", "meta"})


def check_updatable(changes: Mapping[str, Any]) -> None:
    unknown = set(changes) - UPDATABLE_COLUMNS
    if unknown:
        raise ValueError(f"not updatable: {sorted(unknown)}")


# --- definitions ------------------------------------------------------------------------------

LIVE_AGENTS_OF_OWNER = text(
    "SELECT count(*) FROM agents WHERE user_id = :id AND deleted_at IS NULL"
)
INSERT_AGENT = text(
    "INSERT INTO agents (user_id, name, description, prompt, schedule, model_id,"
    " enabled, next_run_at, meta, weekly_token_cap, max_tokens_per_run)"
    " VALUES (:user_id, :name, :description, :prompt, CAST(:schedule AS jsonb),"
    " :model_id, :enabled, :next_run_at, CAST(:meta AS jsonb), :weekly_token_cap,"
    " :max_tokens_per_run)"
    " RETURNING id"
)
LOCK_LIVE_SCHEDULE = text(
    "SELECT a.user_id, a.schedule, a.next_run_at FROM agents a"
    " WHERE a.id = :id AND a.deleted_at IS NULL FOR UPDATE"
)
LOCK_AGENT = text("SELECT * FROM agents WHERE id = :id FOR UPDATE")
FIND_BY_OWNER_AND_NAME = text("SELECT id FROM agents WHERE user_id = :u AND name = :n")
# Every agent of the owner (hidden ones too) / of the model: whose parked runs end.
AGENT_IDS_OF_OWNER = text("SELECT id FROM agents WHERE user_id = :id ORDER BY id")
AGENT_IDS_OF_MODEL = text("SELECT id FROM agents WHERE model_id = :id ORDER BY id")
SWITCH_OFF_AGENTS_OF_OWNER = text(
    "UPDATE agents SET enabled = false WHERE user_id = :id AND enabled RETURNING id"
)


async def count_live_agents(conn: AsyncConnection, owner_id: int) -> int:
    return int((await conn.execute(LIVE_AGENTS_OF_OWNER, {"id": owner_id})).scalar_one())


async def insert_agent(
    conn: AsyncConnection,
    *,
    user_id: int,
    name: str,
    description: str | None,
    prompt: str,
    schedule: Mapping[str, Any] | None,
    model_id: int | None,
    enabled: bool,
    next_run_at: datetime | None,
    meta: Mapping[str, Any] | None,
    weekly_token_cap: int | None = None,
    max_tokens_per_run: int | None = None,
) -> int:
    params = {
        "user_id": user_id,
        "name": name,
        "description": description,
        "prompt": prompt,
        "schedule": _json(schedule),
        "model_id": model_id,
        "enabled": enabled,
        "next_run_at": next_run_at,
        "meta": _json(meta),
        "weekly_token_cap": weekly_token_cap,
        "max_tokens_per_run": max_tokens_per_run,
    }
    return int((await conn.execute(INSERT_AGENT, params)).scalar_one())


async def lock_live_schedule(conn: AsyncConnection, agent_id: int) -> ScheduleState | None:
    row = (await conn.execute(LOCK_LIVE_SCHEDULE, {"id": agent_id})).one_or_none()
    if row is None:
        return None
    return ScheduleState(int(row.user_id), row.schedule, row.next_run_at)


async def update_agent_columns(
    conn: AsyncConnection,
    agent_id: int,
    changes: Mapping[str, Any],
    *,
    next_run_at: datetime | None,
) -> None:
    """Set the given columns (names from `UPDATABLE_COLUMNS`) and `next_run_at`."""
    check_updatable(changes)
    assignments = [
        f"{column} = CAST(:{column} AS jsonb)"
        if column in JSON_COLUMNS
        else f"{column} = :{column}"
        for column in changes
    ]
    assignments.append("next_run_at = :next_run_at")
    params: dict[str, Any] = {
        column: _json(value) if column in JSON_COLUMNS else value
        for column, value in changes.items()
    }
    await conn.execute(
        text(f"UPDATE agents SET {', '.join(assignments)} WHERE id = :agent_id"),
        {**params, "next_run_at": next_run_at, "agent_id": agent_id},
    )


async def lock_agent(conn: AsyncConnection, agent_id: int) -> AgentRow | None:
    """The agent's row (hidden ones too), locked for update."""
    row = (await conn.execute(LOCK_AGENT, {"id": agent_id})).mappings().one_or_none()
    return None if row is None else AgentRow.from_row(row)


async def find_agent_by_name(conn: AsyncConnection, owner_id: int, name: str) -> int | None:
    found = (await conn.execute(FIND_BY_OWNER_AND_NAME, {"u": owner_id, "n": name})).scalar()
    return None if found is None else int(found)


async def switch_off_agents_of_owner(conn: AsyncConnection, owner_id: int) -> list[int]:
    """The owner's switch off on every agent that had it on; returns those ids, sorted."""
    rows = await conn.execute(SWITCH_OFF_AGENTS_OF_OWNER, {"id": owner_id})
    return sorted(int(row.id) for row in rows)


async def agent_ids_of_owner(conn: AsyncConnection, owner_id: int) -> list[int]:
    return [
        int(agent_id)
        for agent_id in (await conn.execute(AGENT_IDS_OF_OWNER, {"id": owner_id})).scalars()
    ]


async def agent_ids_of_model(conn: AsyncConnection, model_id: int) -> list[int]:
    return [
        int(agent_id)
        for agent_id in (await conn.execute(AGENT_IDS_OF_MODEL, {"id": model_id})).scalars()
    ]


# --- tool links -------------------------------------------------------------------------------

DELETE_TOOL_LINKS_EXCEPT = text(
    "DELETE FROM agent_tools WHERE agent_id = :id AND NOT (tool_id = ANY(CAST(:keep AS bigint[])))"
)
DELETE_TOOL_LINK = text("DELETE FROM agent_tools WHERE agent_id = :agent_id AND tool_id = :tool_id")
INSERT_TOOL_LINKS = text(
    "INSERT INTO agent_tools (agent_id, tool_id)"
    " SELECT :agent_id, t FROM unnest(CAST(:ids AS bigint[])) AS t"
    " ON CONFLICT (agent_id, tool_id) DO NOTHING"
)


async def delete_tool_links_except(
    conn: AsyncConnection, agent_id: int, keep: Sequence[int]
) -> None:
    await conn.execute(DELETE_TOOL_LINKS_EXCEPT, {"id": agent_id, "keep": list(keep)})


async def delete_tool_link(conn: AsyncConnection, agent_id: int, tool_id: int) -> None:
    await conn.execute(DELETE_TOOL_LINK, {"agent_id": agent_id, "tool_id": tool_id})


async def insert_tool_links(conn: AsyncConnection, agent_id: int, tool_ids: Sequence[int]) -> None:
    """Idempotent: links that exist stay as they are."""
    if not tool_ids:
        return
    await conn.execute(INSERT_TOOL_LINKS, {"agent_id": agent_id, "ids": sorted(set(tool_ids))})


# --- deletion ---------------------------------------------------------------------------------

# Whether any run of agent `a` counts, or may still count, in a budget week.
_STILL_COUNTED = (
    "EXISTS (SELECT 1 FROM agent_runs r WHERE r.agent_id = a.id"
    " AND (r.state IN ('queued', 'running')"
    " OR (r.tokens_used > 0 AND r.finished_at >= :horizon)))"
)

LOCK_LIVE_AGENT = text(
    "SELECT id, admin_paused, admin_pause_note FROM agents"
    " WHERE id = :id AND deleted_at IS NULL FOR UPDATE"
)
# Hidden before its runs change, so the NOTIFY trigger is already silent for them. The times are
# the database's (`now()`) unless the caller gives its own (tests on a fixed clock).
HIDE_AGENT = text(
    "UPDATE agents SET deleted_at = COALESCE(CAST(:now AS timestamptz), now()), enabled = false"
    " WHERE id = :id"
)
FAIL_QUEUED_RUN = text(
    "UPDATE agent_runs SET state = 'failed', reason = 'error', error = :error,"
    " finished_at = COALESCE(CAST(:now AS timestamptz), now())"
    " WHERE agent_id = :id AND state = 'queued'"
)
DELETE_IF_UNCOUNTED = text(
    f"DELETE FROM agents a WHERE a.id = :id AND NOT {_STILL_COUNTED} RETURNING a.id"
)
PURGE_HIDDEN = text(
    "DELETE FROM agents WHERE id IN ("
    " SELECT a.id FROM agents a WHERE a.deleted_at IS NOT NULL"
    f" AND NOT {_STILL_COUNTED}"
    " ORDER BY a.id LIMIT :limit FOR UPDATE SKIP LOCKED)"
    " RETURNING id"
)


@dataclass(frozen=True)
class LockedAgent:
    id: int
    admin_paused: bool
    admin_pause_note: str | None


async def lock_live_agent(conn: AsyncConnection, agent_id: int) -> LockedAgent | None:
    """Lock the agent unless it is hidden or gone; None then."""
    row = (await conn.execute(LOCK_LIVE_AGENT, {"id": agent_id})).first()
    if row is None:
        return None
    return LockedAgent(
        id=int(row.id), admin_paused=bool(row.admin_paused), admin_pause_note=row.admin_pause_note
    )


async def hide_agent(conn: AsyncConnection, agent_id: int, *, now: datetime | None) -> None:
    await conn.execute(HIDE_AGENT, {"id": agent_id, "now": now})


async def fail_queued_run(
    conn: AsyncConnection, agent_id: int, *, error: str, now: datetime | None
) -> None:
    await conn.execute(FAIL_QUEUED_RUN, {"id": agent_id, "now": now, "error": error})


async def delete_if_uncounted(conn: AsyncConnection, agent_id: int, *, horizon: datetime) -> bool:
    """Delete the agent unless a run of it counts from `horizon` on; True when deleted."""
    deleted = await conn.execute(DELETE_IF_UNCOUNTED, {"id": agent_id, "horizon": horizon})
    return deleted.first() is not None


async def purge_hidden(conn: AsyncConnection, *, horizon: datetime, limit: int) -> list[int]:
    rows = await conn.execute(PURGE_HIDDEN, {"horizon": horizon, "limit": limit})
    return sorted(int(row.id) for row in rows)


# --- calendar slots on a zone change ----------------------------------------------------------

# next_run_at IS NOT NULL: the startable, scheduled, live agents (the gate trigger clears it for
# every other one). Locked so the scheduler's claim (SKIP LOCKED) leaves them to us meanwhile.
CALENDAR_AGENTS_OF_OWNER = text(
    "SELECT a.id, a.schedule FROM agents a"
    " WHERE a.user_id = :owner AND a.next_run_at IS NOT NULL"
    " AND a.schedule->>'type' = 'calendar'"
    " ORDER BY a.id FOR UPDATE"
)
CALENDAR_AGENTS_WITHOUT_OWNER_ZONE = text(
    "SELECT a.id, a.schedule FROM agents a JOIN users u ON u.id = a.user_id"
    " WHERE u.timezone IS NULL AND a.next_run_at IS NOT NULL"
    " AND a.schedule->>'type' = 'calendar'"
    " ORDER BY a.id FOR UPDATE OF a"
)
LAST_SCHEDULED_FIRES = text(
    "SELECT agent_id, max(created_at) AS fired FROM agent_runs"
    " WHERE agent_id = ANY(CAST(:ids AS bigint[])) AND trigger = 'scheduled'"
    " GROUP BY agent_id"
)
SET_NEXT_RUN_AT = text("UPDATE agents SET next_run_at = :next_run_at WHERE id = :id")


@dataclass(frozen=True, slots=True)
class CalendarAgent:
    id: int
    schedule: Any  # as stored; parsed by the caller, which tolerates an unreadable one


async def lock_calendar_agents_of_owner(
    conn: AsyncConnection, owner_id: int
) -> list[CalendarAgent]:
    rows = await conn.execute(CALENDAR_AGENTS_OF_OWNER, {"owner": owner_id})
    return [CalendarAgent(int(row.id), row.schedule) for row in rows]


async def lock_calendar_agents_without_owner_zone(conn: AsyncConnection) -> list[CalendarAgent]:
    rows = await conn.execute(CALENDAR_AGENTS_WITHOUT_OWNER_ZONE)
    return [CalendarAgent(int(row.id), row.schedule) for row in rows]


async def last_scheduled_fires(
    conn: AsyncConnection, agent_ids: Sequence[int]
) -> dict[int, datetime]:
    """When each agent last fired on its schedule (agents that never did are left out)."""
    rows = await conn.execute(LAST_SCHEDULED_FIRES, {"ids": list(agent_ids)})
    return {int(row.agent_id): row.fired for row in rows}


async def set_next_run_at(
    conn: AsyncConnection, slots: Sequence[tuple[int, datetime | None]]
) -> None:
    """One executemany for (agent id, next slot) pairs."""
    if slots:
        await conn.execute(
            SET_NEXT_RUN_AT, [{"id": agent_id, "next_run_at": slot} for agent_id, slot in slots]
        )


def _json(value: Any) -> str | None:
    return None if value is None else json.dumps(value)
