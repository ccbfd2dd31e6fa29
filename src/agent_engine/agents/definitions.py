"""Writes of agent definitions and their optional-tool selection.

`next_run_at` is the application's to compute and the database's to clear: every write that may
open the gate or change the schedule recomputes the first slot in the owner's zone; the BEFORE
trigger on `agents` nulls it whenever the gate is closed, whichever path wrote the row.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from agent_engine.agents.errors import Missing, ModelMissing, ToolsNotAllowed, TooManyAgents
from agent_engine.db.platform import load_platform_settings, zone_or_utc
from agent_engine.domain.schedule import first_slot, parse_schedule

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
    }
)
JSON_COLUMNS = frozenset({"schedule", "meta"})


@dataclass(frozen=True)
class AgentDraft:
    name: str
    prompt: str
    description: str | None = None
    schedule: dict[str, Any] | None = None  # canonical JSON of a parsed Schedule
    model_id: int | None = None  # None: the allowed list's default
    tool_ids: Sequence[int] = field(default_factory=tuple)
    enabled: bool = True
    meta: dict[str, Any] | None = None


async def owner_zone(conn: AsyncConnection, owner_id: int) -> ZoneInfo:
    """The owner's zone, else the organisation's: calendar slots are wall-clock there."""
    timezone = (
        await conn.execute(text("SELECT timezone FROM users WHERE id = :id"), {"id": owner_id})
    ).scalar_one_or_none()
    if timezone:
        return zone_or_utc(timezone)
    return (await load_platform_settings(conn)).zone


def first_run_at(
    schedule: Mapping[str, Any] | None, *, now: datetime, zone: ZoneInfo
) -> datetime | None:
    parsed = parse_schedule(dict(schedule) if schedule is not None else None)
    if parsed is None:
        return None
    return first_slot(parsed, now=now, zone=zone)


# Serialises the creations of one owner (a row lock on the owner, compatible with the FK checks
# of agent inserts), so two concurrent creations cannot both pass the count.
_LOCK_OWNER_FOR_CREATE = text("SELECT 1 FROM users WHERE id = :id FOR NO KEY UPDATE")
_LIVE_AGENTS_OF_OWNER = text(
    "SELECT count(*) FROM agents WHERE user_id = :id AND deleted_at IS NULL"
)


async def create_agent(
    conn: AsyncConnection,
    owner_id: int,
    draft: AgentDraft,
    *,
    now: datetime,
    max_agents: int | None = None,
) -> int:
    """Insert the agent; refused (TooManyAgents) when the owner already has `max_agents`."""
    if max_agents is not None:
        await conn.execute(_LOCK_OWNER_FOR_CREATE, {"id": owner_id})
        live = (await conn.execute(_LIVE_AGENTS_OF_OWNER, {"id": owner_id})).scalar_one()
        if live >= max_agents:
            raise TooManyAgents(max_agents)
    model_id = draft.model_id
    if model_id is None:
        model_id = (
            await conn.execute(text("SELECT id FROM agent_models WHERE is_default FOR KEY SHARE"))
        ).scalar_one_or_none()
    elif not await _model_exists(conn, model_id):
        raise ModelMissing(model_id)
    await _check_tools_allowed(conn, draft.tool_ids)
    next_run_at = first_run_at(draft.schedule, now=now, zone=await owner_zone(conn, owner_id))
    agent_id = (
        await conn.execute(
            text(
                "INSERT INTO agents (user_id, name, description, prompt, schedule, model_id,"
                " enabled, next_run_at, meta)"
                " VALUES (:user_id, :name, :description, :prompt, CAST(:schedule AS jsonb),"
                " :model_id, :enabled, :next_run_at, CAST(:meta AS jsonb))"
                " RETURNING id"
            ),
            {
                "user_id": owner_id,
                "name": draft.name,
                "description": draft.description,
                "prompt": draft.prompt,
                "schedule": _json(draft.schedule),
                "model_id": model_id,
                "enabled": draft.enabled,
                "next_run_at": next_run_at,
                "meta": _json(draft.meta),
            },
        )
    ).scalar_one()
    await _insert_tool_links(conn, agent_id, draft.tool_ids)
    return int(agent_id)


async def update_agent(
    conn: AsyncConnection, agent_id: int, changes: Mapping[str, Any], *, now: datetime
) -> None:
    """Apply column changes; recompute `next_run_at` when the schedule changed or it is unset."""
    unknown = set(changes) - UPDATABLE_COLUMNS
    if unknown:
        raise ValueError(f"not updatable: {sorted(unknown)}")
    # The model first, then the agent: the same order as a model's removal (model row, then its
    # agents through SET NULL), so the two cannot deadlock.
    new_model = changes.get("model_id")
    if new_model is not None and not await _model_exists(conn, new_model):
        raise ModelMissing(new_model)
    current = (
        await conn.execute(
            text(
                "SELECT a.user_id, a.schedule, a.next_run_at FROM agents a"
                " WHERE a.id = :id AND a.deleted_at IS NULL FOR UPDATE"
            ),
            {"id": agent_id},
        )
    ).one_or_none()
    if current is None:
        raise Missing("agent", agent_id)
    schedule = changes.get("schedule", current.schedule)
    schedule_changed = "schedule" in changes and changes["schedule"] != current.schedule
    next_run_at = current.next_run_at
    # Null here means the gate was closed (or no schedule); the trigger clears it again if the
    # gate is still closed after this write, so computing it unconditionally is safe.
    if schedule is None:
        next_run_at = None
    elif schedule_changed or next_run_at is None:
        next_run_at = first_run_at(schedule, now=now, zone=await owner_zone(conn, current.user_id))
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


async def set_agent_tools(conn: AsyncConnection, agent_id: int, tool_ids: Sequence[int]) -> None:
    """Replace the selection. Every tool given must be allowed for agents now -- also one the
    agent already has: a selection saved after an admin disallowed a tool does not keep it (the
    link of a disallowed tool only survives untouched, until `detach_tool` or a new selection)."""
    wanted = sorted(set(tool_ids))
    await _check_tools_allowed(conn, wanted)
    await conn.execute(
        text(
            "DELETE FROM agent_tools WHERE agent_id = :id"
            " AND NOT (tool_id = ANY(CAST(:keep AS bigint[])))"
        ),
        {"id": agent_id, "keep": wanted},
    )
    await _insert_tool_links(conn, agent_id, wanted)


async def attach_tool(conn: AsyncConnection, agent_id: int, tool_id: int) -> None:
    """Idempotent: attaching an attached tool changes nothing."""
    await _check_tools_allowed(conn, [tool_id])
    await _insert_tool_links(conn, agent_id, [tool_id])


async def detach_tool(conn: AsyncConnection, agent_id: int, tool_id: int) -> None:
    """Idempotent; works for tools an admin has since disallowed."""
    await conn.execute(
        text("DELETE FROM agent_tools WHERE agent_id = :agent_id AND tool_id = :tool_id"),
        {"agent_id": agent_id, "tool_id": tool_id},
    )


async def _model_exists(conn: AsyncConnection, model_id: int) -> bool:
    # KEY SHARE holds the row until we commit: a concurrent removal waits for us and then stops
    # the agent (SET NULL), instead of our write failing on the foreign key after the check.
    found = await conn.execute(
        text("SELECT 1 FROM agent_models WHERE id = :id FOR KEY SHARE"), {"id": model_id}
    )
    return found.first() is not None


async def _check_tools_allowed(conn: AsyncConnection, tool_ids: Sequence[int]) -> None:
    wanted = sorted(set(tool_ids))
    if not wanted:
        return
    allowed = set(
        (
            await conn.execute(
                text(
                    "SELECT id FROM tools WHERE id = ANY(CAST(:ids AS bigint[])) AND agents_allowed"
                    " FOR KEY SHARE"  # a concurrent delete waits; the link then cascades away
                ),
                {"ids": wanted},
            )
        ).scalars()
    )
    refused = [t for t in wanted if t not in allowed]
    if refused:
        raise ToolsNotAllowed(refused)


async def _insert_tool_links(conn: AsyncConnection, agent_id: int, tool_ids: Sequence[int]) -> None:
    if not tool_ids:
        return
    await conn.execute(
        text(
            "INSERT INTO agent_tools (agent_id, tool_id)"
            " SELECT :agent_id, t FROM unnest(CAST(:ids AS bigint[])) AS t"
            " ON CONFLICT (agent_id, tool_id) DO NOTHING"
        ),
        {"agent_id": agent_id, "ids": sorted(set(tool_ids))},
    )


def _json(value: Any) -> str | None:
    return None if value is None else json.dumps(value)
