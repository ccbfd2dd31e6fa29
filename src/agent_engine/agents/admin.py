"""The admin's levers: owners, the allowed model list, the tool catalog, platform settings."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection

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
    "currency": platform.CURRENCY,
    "budget_alert_percents": platform.BUDGET_ALERT_PERCENTS,
}


@dataclass(frozen=True)
class ModelDraft:
    name: str
    provider: str
    model: str
    base_url: str | None
    api_key_env: str | None
    is_default: bool


async def deactivate_owner(conn: AsyncConnection, user_id: int) -> int:
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
    return len(switched.all())


async def upsert_model(conn: AsyncConnection, model_id: int | None, draft: ModelDraft) -> int:
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


# Price columns of agent_models by their GraphQL-side names (issue 17).
PRICE_COLUMNS = {
    "input_price_per_million": "input_price_per_million",
    "output_price_per_million": "output_price_per_million",
}


async def set_model_prices(
    conn: AsyncConnection, model_id: int, prices: Mapping[str, Decimal | None]
) -> None:
    """Set (or, with None, clear) the given prices of a model. Runs already finished keep the
    cost they were given: it was fixed at their finish."""
    if not prices:
        return
    assignments = ", ".join(f"{PRICE_COLUMNS[name]} = :{name}" for name in prices)
    updated = (
        await conn.execute(
            text(f"UPDATE agent_models SET {assignments} WHERE id = :id RETURNING id"),
            {**prices, "id": model_id},
        )
    ).scalar_one_or_none()
    if updated is None:
        raise Missing("model", model_id)


async def remove_model(conn: AsyncConnection, model_id: int) -> None:
    """Delete from the allowed list; the FK's SET NULL stops the agents that used it."""
    deleted = (
        await conn.execute(
            text("DELETE FROM agent_models WHERE id = :id RETURNING id"), {"id": model_id}
        )
    ).scalar_one_or_none()
    if deleted is None:
        raise Missing("model", model_id)


async def set_tool_allowed(conn: AsyncConnection, tool_id: int, allowed: bool) -> None:
    updated = (
        await conn.execute(
            text("UPDATE tools SET agents_allowed = :allowed WHERE id = :id RETURNING id"),
            {"id": tool_id, "allowed": allowed},
        )
    ).scalar_one_or_none()
    if updated is None:
        raise Missing("tool", tool_id)


async def update_platform_settings(
    conn: AsyncConnection, changes: Mapping[str, Any], *, now: datetime
) -> None:
    """Write the given settings (None clears the cap). A new organisation zone moves the calendar
    slots of owners who have no zone of their own."""
    before = await platform.load_platform_settings(conn)
    for name, value in changes.items():
        await write_platform_setting(conn, SETTING_KEYS[name], value)
    new_zone = changes.get("timezone")
    if new_zone is not None and new_zone != before.timezone:
        await _reslot_calendar_agents_without_owner_zone(conn, new_zone, now=now)


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
