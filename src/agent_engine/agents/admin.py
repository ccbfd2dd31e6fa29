"""The admin's levers: the pause lock, owners, the allowed model list, the tool catalog, platform
settings. Each lever records its audit entry (`agents.audit.record`) in the caller's transaction.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection

from agent_engine.agents import definitions
from agent_engine.agents.audit import AuditAction, record, redacted_url
from agent_engine.agents.definitions import first_run_at
from agent_engine.agents.errors import Contended, Missing
from agent_engine.db import platform
from agent_engine.db.platform import write_platform_setting, zone_or_utc

# GraphQL-side names of the platform settings → their keys in platform_settings.
SETTING_KEYS = {
    "weekly_token_cap": platform.WEEKLY_TOKEN_CAP,
    "timezone": platform.TIMEZONE,
    "platform_prompt": platform.PLATFORM_PROMPT,
    "iteration_cap": platform.ITERATION_CAP,
    "run_retention_days": platform.RUN_RETENTION_DAYS,
}


@dataclass(frozen=True)
class ModelDraft:
    name: str
    provider: str
    model: str
    base_url: str | None
    api_key_env: str | None
    is_default: bool


async def set_admin_paused(
    conn: AsyncConnection,
    agent_id: int,
    *,
    paused: bool,
    note: str | None,
    actor_id: int,
    now: datetime,
) -> None:
    """The admin's sticky lock. The note is the owner's to read while paused (cleared on unpause,
    a CHECK holds it) and is kept in the audit log either way."""
    before = await _agent_for_update(conn, agent_id)
    await definitions.update_agent(
        conn,
        agent_id,
        {"admin_paused": paused, "admin_pause_note": note if paused else None},
        now=now,
    )
    details: dict[str, Any] = {"agentName": before["name"], "note": note}
    if not paused:
        details["previousNote"] = before["admin_pause_note"]
    await record(
        conn,
        actor_id,
        AuditAction.AGENT_ADMIN_PAUSED if paused else AuditAction.AGENT_ADMIN_UNPAUSED,
        agent_id=agent_id,
        user_id=int(before["user_id"]),
        details={**details, "wasPaused": bool(before["admin_paused"])},
    )


async def delete_agent(conn: AsyncConnection, agent_id: int, *, actor_id: int) -> None:
    """An admin deletes someone else's agent (an owner deleting their own is not audited)."""
    before = await _agent_for_update(conn, agent_id)
    await definitions.delete_agent(conn, agent_id)
    await record(
        conn,
        actor_id,
        AuditAction.AGENT_DELETED,
        agent_id=agent_id,
        user_id=int(before["user_id"]),
        details={"agentName": before["name"]},
    )


async def _agent_for_update(conn: AsyncConnection, agent_id: int) -> dict[str, Any]:
    row = (
        (
            await conn.execute(
                text("SELECT * FROM agents WHERE id = :id FOR UPDATE"), {"id": agent_id}
            )
        )
        .mappings()
        .one_or_none()
    )
    if row is None:
        raise Missing("agent", agent_id)
    return dict(row)


async def deactivate_owner(conn: AsyncConnection, user_id: int, *, actor_id: int) -> int:
    """Switch every agent of the user off and mark the user inactive; returns how many were on.

    Writes the owner's own switch (`enabled`), so only the owner can turn the agents back on.
    """
    found = (
        await conn.execute(
            text("UPDATE users SET is_active = false WHERE id = :id RETURNING id"), {"id": user_id}
        )
    ).scalar_one_or_none()
    if found is None:
        raise Missing("user", user_id)
    switched = await conn.execute(
        text("UPDATE agents SET enabled = false WHERE user_id = :id AND enabled RETURNING id"),
        {"id": user_id},
    )
    switched_off = sorted(int(row.id) for row in switched)
    await record(
        conn,
        actor_id,
        AuditAction.USER_DEACTIVATED,
        user_id=user_id,
        details={"agentsSwitchedOff": switched_off},
    )
    return len(switched_off)


def _model_details(row: Mapping[str, Any]) -> dict[str, Any]:
    """What the audit log keeps of a model: no credentials (the key is never stored; the URL
    loses user info and query)."""
    return {
        "name": row["name"],
        "provider": row["provider"],
        "model": row["model"],
        "baseUrl": redacted_url(row["base_url"]),
        "apiKeyEnv": row["api_key_env"],
        "isDefault": bool(row["is_default"]),
    }


async def upsert_model(
    conn: AsyncConnection, model_id: int | None, draft: ModelDraft, *, actor_id: int
) -> int:
    before = None
    if model_id is not None:
        found = (
            (
                await conn.execute(
                    text("SELECT * FROM agent_models WHERE id = :id FOR UPDATE"), {"id": model_id}
                )
            )
            .mappings()
            .one_or_none()
        )
        if found is None:
            raise Missing("model", model_id)
        before = _model_details(dict(found))
    saved = await _write_model(conn, model_id, draft)
    after = _model_details(
        {
            "name": draft.name,
            "provider": draft.provider,
            "model": draft.model,
            "base_url": draft.base_url,
            "api_key_env": draft.api_key_env,
            "is_default": draft.is_default,
        }
    )
    details: dict[str, Any] = {"modelId": saved, "created": before is None, "model": after}
    if before is not None:
        details["changes"] = {
            key: {"old": before[key], "new": value}
            for key, value in after.items()
            if before[key] != value
        }
    await record(conn, actor_id, AuditAction.MODEL_UPSERTED, details=details)
    return saved


async def _write_model(conn: AsyncConnection, model_id: int | None, draft: ModelDraft) -> int:
    params = {
        "name": draft.name,
        "provider": draft.provider,
        "model": draft.model,
        "base_url": draft.base_url,
        "api_key_env": draft.api_key_env,
        "is_default": draft.is_default,
        "id": model_id,
    }
    try:
        if draft.is_default:
            # One default at a time (a partial unique index); the new one takes the flag.
            await conn.execute(
                text(
                    "UPDATE agent_models SET is_default = false"
                    " WHERE is_default AND id IS DISTINCT FROM :id"
                ),
                {"id": model_id},
            )
        if model_id is None:
            return int(
                (
                    await conn.execute(
                        text(
                            "INSERT INTO agent_models"
                            " (name, provider, model, base_url, api_key_env, is_default)"
                            " VALUES (:name, :provider, :model, :base_url, :api_key_env,"
                            " :is_default) RETURNING id"
                        ),
                        params,
                    )
                ).scalar_one()
            )
        updated = (
            await conn.execute(
                text(
                    "UPDATE agent_models SET name = :name, provider = :provider, model = :model,"
                    " base_url = :base_url, api_key_env = :api_key_env, is_default = :is_default"
                    " WHERE id = :id RETURNING id"
                ),
                params,
            )
        ).scalar_one_or_none()
    except IntegrityError as exc:
        raise Contended("another default model was set at the same time; retry") from exc
    if updated is None:
        raise Missing("model", model_id or 0)
    return int(updated)


async def remove_model(conn: AsyncConnection, model_id: int, *, actor_id: int) -> None:
    """Delete from the allowed list; the FK's SET NULL stops the agents that used it."""
    deleted = (
        (
            await conn.execute(
                text("DELETE FROM agent_models WHERE id = :id RETURNING *"), {"id": model_id}
            )
        )
        .mappings()
        .one_or_none()
    )
    if deleted is None:
        raise Missing("model", model_id)
    await record(
        conn,
        actor_id,
        AuditAction.MODEL_REMOVED,
        details={"modelId": model_id, "model": _model_details(dict(deleted))},
    )


async def set_tool_allowed(
    conn: AsyncConnection, tool_id: int, allowed: bool, *, actor_id: int
) -> None:
    before = (
        await conn.execute(
            text("SELECT name, agents_allowed FROM tools WHERE id = :id FOR UPDATE"),
            {"id": tool_id},
        )
    ).one_or_none()
    if before is None:
        raise Missing("tool", tool_id)
    await conn.execute(
        text("UPDATE tools SET agents_allowed = :allowed WHERE id = :id"),
        {"id": tool_id, "allowed": allowed},
    )
    await record(
        conn,
        actor_id,
        AuditAction.TOOL_ALLOWED if allowed else AuditAction.TOOL_DISALLOWED,
        details={"toolId": tool_id, "name": before.name, "wasAllowed": before.agents_allowed},
    )


async def update_platform_settings(
    conn: AsyncConnection, changes: Mapping[str, Any], *, actor_id: int, now: datetime
) -> None:
    """Write the given settings (None clears the cap). A new organisation zone moves the calendar
    slots of owners who have no zone of their own. The audit entry keeps old → new per setting
    given (GraphQL names)."""
    before = await platform.load_platform_settings(conn)
    for name, value in changes.items():
        await write_platform_setting(conn, SETTING_KEYS[name], value)
    if changes:
        await record(
            conn,
            actor_id,
            AuditAction.SETTINGS_UPDATED,
            details={
                _camel(name): {"old": getattr(before, name), "new": value}
                for name, value in changes.items()
            },
        )
    new_zone = changes.get("timezone")
    if new_zone is not None and new_zone != before.timezone:
        await _reslot_calendar_agents_without_owner_zone(conn, new_zone, now=now)


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


async def _reslot_calendar_agents_without_owner_zone(
    conn: AsyncConnection, zone_name: str, *, now: datetime
) -> None:
    rows = (
        await conn.execute(
            text(
                "SELECT a.id, a.schedule FROM agents a JOIN users u ON u.id = a.user_id"
                " WHERE u.timezone IS NULL AND a.next_run_at IS NOT NULL"
                " AND a.schedule->>'type' = 'calendar'"
                " ORDER BY a.id FOR UPDATE OF a"
            )
        )
    ).all()
    zone = zone_or_utc(zone_name)
    updates = [
        {"id": row.id, "next_run_at": first_run_at(row.schedule, now=now, zone=zone)}
        for row in rows
    ]
    if updates:
        await conn.execute(
            text("UPDATE agents SET next_run_at = :next_run_at WHERE id = :id"), updates
        )
