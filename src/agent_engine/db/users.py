"""Statements on `users` (the neighbours' table): zones, the owner's lock, (de)activation."""

from __future__ import annotations

from typing import Any
from zoneinfo import ZoneInfo

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from agent_engine.db.platform import load_platform_settings, zone_or_utc

OWNER_TIMEZONE = text("SELECT timezone FROM users WHERE id = :id")
# A row lock on the owner, compatible with the FK checks of agent inserts.
LOCK_OWNER_FOR_CREATE = text("SELECT 1 FROM users WHERE id = :id FOR NO KEY UPDATE")
DEACTIVATE = text("UPDATE users SET is_active = false WHERE id = :id RETURNING id")
REACTIVATE = text("UPDATE users SET is_active = true WHERE id = :id RETURNING *")
ENSURE_USER = text(
    "INSERT INTO users (id, email, display_name, timezone)"
    " VALUES (:id, :email, :name, :timezone) ON CONFLICT (id) DO NOTHING"
)


async def owner_zone(conn: AsyncConnection, owner_id: int) -> ZoneInfo:
    """The owner's zone, else the organisation's: calendar slots are wall-clock there."""
    timezone = (await conn.execute(OWNER_TIMEZONE, {"id": owner_id})).scalar_one_or_none()
    if timezone:
        return zone_or_utc(timezone)
    return (await load_platform_settings(conn)).zone


async def lock_owner_for_create(conn: AsyncConnection, owner_id: int) -> None:
    """Serialise the agent creations of one owner until commit."""
    await conn.execute(LOCK_OWNER_FOR_CREATE, {"id": owner_id})


async def deactivate(conn: AsyncConnection, user_id: int) -> bool:
    """Mark the user inactive; False when there is no such user."""
    return (await conn.execute(DEACTIVATE, {"id": user_id})).scalar_one_or_none() is not None


async def reactivate(conn: AsyncConnection, user_id: int) -> dict[str, Any] | None:
    """Mark the user active; the users row, or None when there is no such user."""
    row = (await conn.execute(REACTIVATE, {"id": user_id})).mappings().one_or_none()
    return None if row is None else dict(row)


async def ensure_user(
    conn: AsyncConnection, user_id: int, *, email: str, name: str, timezone: str
) -> None:
    """Insert the user unless one has the id (the demo seed, run on every start)."""
    await conn.execute(
        ENSURE_USER, {"id": user_id, "email": email, "name": name, "timezone": timezone}
    )
