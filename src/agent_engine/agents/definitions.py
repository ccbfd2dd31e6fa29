"""Writes of agent definitions and their optional-tool selection.

`next_run_at` is the application's to compute and the database's to clear: every write that may
open the gate or change the schedule recomputes the first slot in the owner's zone; the BEFORE
trigger on `agents` (`agents_clear_next_run_at`, schema/database.sql) nulls it whenever the gate
is closed, whichever path wrote the row.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

from sqlalchemy.ext.asyncio import AsyncConnection

from agent_engine.agents.errors import Missing, ModelMissing, ToolsNotAllowed, TooManyAgents
from agent_engine.db import agents as agents_db
from agent_engine.db import catalog, users
from agent_engine.domain.gate import ResumeStop
from agent_engine.domain.schedule import first_slot, parse_schedule
from agent_engine.runs import resume_gate


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
    # The owner's caps on the agent's tokens (None: none), validated positive by the caller.
    weekly_token_cap: int | None = None
    max_tokens_per_run: int | None = None


def first_run_at(
    schedule: Mapping[str, Any] | None, *, now: datetime, zone: ZoneInfo
) -> datetime | None:
    parsed = parse_schedule(dict(schedule) if schedule is not None else None)
    if parsed is None:
        return None
    return first_slot(parsed, now=now, zone=zone)


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
        # Serialises the creations of one owner, so two concurrent ones cannot both pass the count.
        await users.lock_owner_for_create(conn, owner_id)
        if await agents_db.count_live_agents(conn, owner_id) >= max_agents:
            raise TooManyAgents(max_agents)
    model_id = draft.model_id
    if model_id is None:
        model_id = await catalog.share_default_model(conn)
    elif not await _model_exists(conn, model_id):
        raise ModelMissing(model_id)
    await _check_tools_allowed(conn, draft.tool_ids)
    next_run_at = first_run_at(draft.schedule, now=now, zone=await users.owner_zone(conn, owner_id))
    agent_id = await agents_db.insert_agent(
        conn,
        user_id=owner_id,
        name=draft.name,
        description=draft.description,
        prompt=draft.prompt,
        schedule=draft.schedule,
        model_id=model_id,
        enabled=draft.enabled,
        next_run_at=next_run_at,
        meta=draft.meta,
        weekly_token_cap=draft.weekly_token_cap,
        max_tokens_per_run=draft.max_tokens_per_run,
    )
    await agents_db.insert_tool_links(conn, agent_id, draft.tool_ids)
    return agent_id


async def update_agent(
    conn: AsyncConnection, agent_id: int, changes: Mapping[str, Any], *, now: datetime
) -> None:
    """Apply column changes; recompute `next_run_at` when the schedule changed or it is unset."""
    agents_db.check_updatable(changes)
    # The model first, then the agent: the same order as a model's removal (model row, then its
    # agents through SET NULL), so the two cannot deadlock.
    new_model = changes.get("model_id")
    if new_model is not None and not await _model_exists(conn, new_model):
        raise ModelMissing(new_model)
    current = await agents_db.lock_live_schedule(conn, agent_id)
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
        zone = await users.owner_zone(conn, current.user_id)
        next_run_at = first_run_at(schedule, now=now, zone=zone)
    await agents_db.update_agent_columns(conn, agent_id, changes, next_run_at=next_run_at)
    if changes.get("enabled") is False:
        # The owner's switch is a full stop: a run parked on their approval does not go on.
        await resume_gate.stop_parked_runs(
            conn, [agent_id], ResumeStop.DISABLED, actor_id=current.user_id
        )


async def set_agent_tools(conn: AsyncConnection, agent_id: int, tool_ids: Sequence[int]) -> None:
    """Replace the selection. Every tool given must be allowed for agents now -- also one the
    agent already has: a selection saved after an admin disallowed a tool does not keep it (the
    link of a disallowed tool only survives untouched, until `detach_tool` or a new selection)."""
    wanted = sorted(set(tool_ids))
    await _check_tools_allowed(conn, wanted)
    await agents_db.delete_tool_links_except(conn, agent_id, wanted)
    await agents_db.insert_tool_links(conn, agent_id, wanted)


async def attach_tool(conn: AsyncConnection, agent_id: int, tool_id: int) -> None:
    """Idempotent: attaching an attached tool changes nothing."""
    await _check_tools_allowed(conn, [tool_id])
    await agents_db.insert_tool_links(conn, agent_id, [tool_id])


async def detach_tool(conn: AsyncConnection, agent_id: int, tool_id: int) -> None:
    """Idempotent; works for tools an admin has since disallowed."""
    await agents_db.delete_tool_link(conn, agent_id, tool_id)


async def _model_exists(conn: AsyncConnection, model_id: int) -> bool:
    # KEY SHARE holds the row until we commit: a concurrent removal waits for us and then stops
    # the agent (SET NULL), instead of our write failing on the foreign key after the check.
    return await catalog.share_model(conn, model_id)


async def _check_tools_allowed(conn: AsyncConnection, tool_ids: Sequence[int]) -> None:
    wanted = sorted(set(tool_ids))
    if not wanted:
        return
    allowed = await catalog.share_allowed_tools(conn, wanted)
    refused = [t for t in wanted if t not in allowed]
    if refused:
        raise ToolsNotAllowed(refused)
