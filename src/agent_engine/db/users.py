"""Statements on `users` (the neighbours' table): zones, the owner's lock, (de)activation, and
the sign-in read and upsert from a token's claims."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from zoneinfo import ZoneInfo

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from agent_engine.db import direct
from agent_engine.db.platform import STORED_PLATFORM, load_platform_settings
from agent_engine.db.rows import AnyRow, columns

OWNER_TIMEZONE = text("SELECT timezone FROM users WHERE id = :id")
# A row lock on the owner, compatible with the FK checks of agent inserts.
LOCK_OWNER_FOR_CREATE = text("SELECT 1 FROM users WHERE id = :id FOR NO KEY UPDATE")
USERS_BY_ID = text("SELECT * FROM users WHERE id = ANY(CAST(:ids AS bigint[]))")
USER_ACTIVE = text("SELECT is_active FROM users WHERE id = :id")
DEACTIVATE = text("UPDATE users SET is_active = false WHERE id = :id RETURNING id")
REACTIVATE = text("UPDATE users SET is_active = true WHERE id = :id RETURNING *")
ENSURE_USER = text(
    "INSERT INTO users (id, email, display_name, timezone)"
    " VALUES (:id, :email, :name, :timezone) ON CONFLICT (id) DO NOTHING"
)


async def owner_zone(conn: AsyncConnection, owner_id: int) -> ZoneInfo:
    """The owner's zone, else the organisation's: calendar slots are wall-clock there."""
    timezone = (await conn.execute(OWNER_TIMEZONE, {"id": owner_id})).scalar_one_or_none()
    return (await load_platform_settings(conn)).zone_of(timezone)


async def lock_owner_for_create(conn: AsyncConnection, owner_id: int) -> None:
    """Serialise the agent creations of one owner until commit."""
    await conn.execute(LOCK_OWNER_FOR_CREATE, {"id": owner_id})


async def is_active(conn: AsyncConnection, user_id: int) -> bool | None:
    """Whether the user's account is active; None when there is no such user."""
    active = (await conn.execute(USER_ACTIVE, {"id": user_id})).scalar_one_or_none()
    return None if active is None else bool(active)


async def deactivate(conn: AsyncConnection, user_id: int) -> bool:
    """Mark the user inactive; False when there is no such user."""
    return (await conn.execute(DEACTIVATE, {"id": user_id})).scalar_one_or_none() is not None


async def reactivate(conn: AsyncConnection, user_id: int) -> UserRow | None:
    """Mark the user active; the users row, or None when there is no such user."""
    row = (await conn.execute(REACTIVATE, {"id": user_id})).one_or_none()
    return None if row is None else UserRow.from_row(row)


async def ensure_user(
    conn: AsyncConnection, user_id: int, *, email: str, name: str, timezone: str
) -> None:
    """Insert the user unless one has the id (the demo seed, run on every start)."""
    await conn.execute(
        ENSURE_USER, {"id": user_id, "email": email, "name": name, "timezone": timezone}
    )


READ_USER = text("SELECT id, email, display_name, timezone, is_active FROM users WHERE id = :id")
# An HTTP request's first read: its viewer (NULLs on first sight) and the platform settings, which
# a page's budget needs: one round trip for both.
READ_USER_WITH_PLATFORM = text(
    "SELECT u.id, u.email, u.display_name, u.timezone, u.is_active, s.platform"
    " FROM (SELECT " + STORED_PLATFORM + " AS platform) s"
    " LEFT JOIN users u ON u.id = :id"
)
# One statement: insert on first sight, refresh changed claims, and read the row either way. A
# data-modifying CTE's rows are invisible to the outer SELECT's snapshot, hence the UNION; for the
# same reason `before` (and the subquery in RETURNING) still reads the zone the user had.
UPSERT_USER = text(
    """
    WITH before AS (
        SELECT timezone FROM users WHERE id = :id
    ), upsert AS (
        INSERT INTO users (id, email, display_name, timezone)
        VALUES (:id, :email, :name, :timezone)
        ON CONFLICT (id) DO UPDATE SET
            email = COALESCE(EXCLUDED.email, users.email),
            display_name = COALESCE(EXCLUDED.display_name, users.display_name),
            timezone = COALESCE(EXCLUDED.timezone, users.timezone)
        WHERE users.is_active AND (
            (EXCLUDED.email IS NOT NULL AND EXCLUDED.email IS DISTINCT FROM users.email)
            OR (EXCLUDED.display_name IS NOT NULL
                AND EXCLUDED.display_name IS DISTINCT FROM users.display_name)
            OR (EXCLUDED.timezone IS NOT NULL AND EXCLUDED.timezone IS DISTINCT FROM users.timezone)
        )
        RETURNING id, email, display_name, timezone, is_active
    )
    SELECT id, email, display_name, timezone, is_active,
           (SELECT timezone FROM before) AS previous_timezone,
           EXISTS (SELECT 1 FROM before) AS existed
    FROM upsert
    UNION ALL
    SELECT id, email, display_name, timezone, is_active, timezone, true FROM users
    WHERE id = :id AND NOT EXISTS (SELECT 1 FROM upsert)
    """
)
INACTIVE_USERS = text(
    "SELECT id FROM users WHERE id = ANY(CAST(:ids AS bigint[])) AND NOT is_active"
)


@dataclass(frozen=True, slots=True)
class UserRow:
    """A user as the engine reads it (sign-in, the API's user loader)."""

    id: int
    email: str | None
    display_name: str | None
    timezone: str | None
    is_active: bool

    @classmethod
    def from_row(cls, row: AnyRow) -> UserRow:
        values = columns(row)
        return cls(
            id=int(values["id"]),
            email=values["email"],
            display_name=values["display_name"],
            timezone=values["timezone"],
            is_active=bool(values["is_active"]),
        )


@dataclass(frozen=True, slots=True)
class UpsertedUser:
    """The user after the upsert, with the zone it had before (None for a new user)."""

    user: UserRow
    previous_timezone: str | None
    existed: bool


async def read_user_with_platform(
    conn: AsyncConnection, user_id: int
) -> tuple[UserRow | None, dict[str, Any]]:
    """The stored user (None on first sight) and the stored platform settings, as one JSON
    object (`PlatformSettings.from_rows`)."""
    (row,) = await direct.fetch(conn, READ_USER_WITH_PLATFORM, {"id": user_id})
    values = columns(row)
    user = None if values["id"] is None else UserRow.from_row(row)
    return user, dict(values["platform"])


async def upsert_user(
    conn: AsyncConnection,
    user_id: int,
    *,
    email: str | None,
    name: str | None,
    timezone: str | None,
) -> UpsertedUser:
    """Insert the user, or refresh an active user's claims that are given and differ (an absent
    claim keeps the stored value; a deactivated user is left as it is)."""
    row = (
        await conn.execute(
            UPSERT_USER, {"id": user_id, "email": email, "name": name, "timezone": timezone}
        )
    ).one_or_none()
    if row is None:
        # A concurrent first sight inserted the row after this statement's snapshot was taken
        # (ON CONFLICT waited for it): a new statement sees it.
        user = UserRow.from_row((await conn.execute(READ_USER, {"id": user_id})).one())
        return UpsertedUser(user=user, previous_timezone=user.timezone, existed=True)
    return UpsertedUser(
        user=UserRow.from_row(row), previous_timezone=row.previous_timezone, existed=row.existed
    )


async def inactive_users(conn: AsyncConnection, user_ids: Sequence[int]) -> list[int]:
    """Those of `user_ids` that are deactivated."""
    return [
        int(user_id)
        for user_id in (await conn.execute(INACTIVE_USERS, {"ids": list(user_ids)})).scalars()
    ]


async def users_by_id(conn: AsyncConnection, ids: Sequence[int]) -> list[UserRow]:
    return [UserRow.from_row(row) for row in await conn.execute(USERS_BY_ID, {"ids": list(ids)})]
