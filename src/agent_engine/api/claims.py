"""Who a verified token says the caller is, and the users row it provisions.

Claims: the user id (`sub` unless `AGENT_ENGINE_JWT_USER_ID_CLAIM`, numeric), `email`,
`name`, `zoneinfo` (IANA zone), and the roles (`AGENT_ENGINE_JWT_ROLES_CLAIM`, a dotted path,
default `roles`); `AGENT_ENGINE_JWT_ADMIN_ROLE` (default `agent_admin`) grants admin.

A user is upserted from the claims on first sight and refreshed when the claims change. A
deactivated user stays deactivated: the token is verified, the user is refused with FORBIDDEN
(the caller is known, the account is not allowed in), and nothing in the row is changed.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from agent_engine.agents.zones import reslot_owner_calendar_agents
from agent_engine.api.errors import Forbidden, Unauthenticated
from agent_engine.api.ids import database_id
from agent_engine.db.platform import load_platform_settings
from agent_engine.db.users import UserRow, upsert_user
from agent_engine.domain.zones import zone_or_utc
from agent_engine.settings import Settings

# Claims are copied into the users row; absurd sizes are refused rather than stored.
MAX_CLAIM_CHARS = 320


@dataclass(frozen=True)
class Claims:
    user_id: int
    email: str | None
    name: str | None
    timezone: str | None
    admin: bool
    expires_at: datetime | None = None  # `exp`


@dataclass(frozen=True)
class Caller:
    """The authenticated caller."""

    user_id: int
    is_admin: bool
    email: str | None
    display_name: str | None
    timezone: str | None
    # When the token the caller presented expires (a WebSocket session closes then).
    expires_at: datetime | None = None


def claims_of(payload: dict[str, Any], settings: Settings) -> Claims:
    """The claims the api reads, from a verified payload."""
    raw_id = _claim_at(payload, settings.jwt_user_id_claim)
    name = settings.jwt_user_id_claim
    if (
        not isinstance(raw_id, str | int)
        or isinstance(raw_id, bool)
        or not (str(raw_id).isascii() and str(raw_id).isdigit())
    ):
        raise Unauthenticated(f"invalid token: `{name}` must be a numeric user id")
    user_id = database_id(str(raw_id))
    if user_id is None:
        raise Unauthenticated(f"invalid token: `{name}` is out of range")
    roles = _claim_at(payload, settings.jwt_roles_claim) or []
    if isinstance(roles, str):
        roles = roles.split()
    admin = isinstance(roles, list) and settings.jwt_admin_role in roles
    exp = payload.get("exp")
    return Claims(
        user_id=user_id,
        email=_text_claim(payload, "email"),
        name=_text_claim(payload, "name"),
        timezone=_zone_claim(payload.get("zoneinfo")),
        admin=admin,
        expires_at=(
            datetime.fromtimestamp(exp, UTC)
            if isinstance(exp, int | float) and not isinstance(exp, bool)
            else None
        ),
    )


def _claim_at(payload: dict[str, Any], path: str) -> object:
    """The value at a dotted path (`realm_access.roles`); a claim whose name holds the dots
    itself (`https://example.com/roles`-style names) is found too."""
    if path in payload:
        return payload[path]
    value: object = payload
    for part in path.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


def _text_claim(payload: dict[str, Any], name: str) -> str | None:
    value = payload.get(name)
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > MAX_CLAIM_CHARS:
        raise Unauthenticated(
            f"invalid token: `{name}` must be a string of at most {MAX_CLAIM_CHARS} characters"
        )
    if "\x00" in value:
        # It lands in the users row, and PostgreSQL stores no NUL in text.
        raise Unauthenticated(f"invalid token: `{name}` must not contain a NUL character")
    return value


def _zone_claim(value: object) -> str | None:
    # An unknown zone is ignored (the organisation zone applies) rather than locking the user out.
    if not isinstance(value, str) or not value or len(value) > MAX_CLAIM_CHARS:
        return None
    try:
        ZoneInfo(value)
    except (ZoneInfoNotFoundError, ValueError):
        return None
    return value


def _claims_changed(row: UserRow, claims: Claims) -> bool:
    """Whether the upsert would change the row (an absent claim keeps the stored value)."""
    return any(
        claim is not None and claim != stored
        for claim, stored in (
            (claims.email, row.email),
            (claims.name, row.display_name),
            (claims.timezone, row.timezone),
        )
    )


def needs_provisioning(row: UserRow, claims: Claims) -> bool:
    """Whether a known user's claims must be written: an active user's claims changed (a first
    sight is written too)."""
    return row.is_active and _claims_changed(row, claims)


async def provision_user(engine: AsyncEngine, claims: Claims, *, now: datetime) -> UserRow:
    """Upsert the user from verified claims, in one transaction in which a changed zone also
    moves the user's calendar slots (`agents.zones`). The caller holds no other connection of
    `engine`'s pool meanwhile: a burst of first sights larger than the pool would otherwise
    wait on itself."""
    async with engine.begin() as writer:
        return await _write_user(writer, claims, now=now)


def viewer_of(row: UserRow, claims: Claims) -> Caller:
    """The viewer of a provisioned row; a deactivated account is refused."""
    if not row.is_active:
        raise Forbidden("this account is deactivated")
    return Caller(
        user_id=row.id,
        is_admin=claims.admin,
        email=row.email,
        display_name=row.display_name,
        timezone=row.timezone,
        expires_at=claims.expires_at,
    )


async def _write_user(conn: AsyncConnection, claims: Claims, *, now: datetime) -> UserRow:
    """The upsert, and the calendar slots of a user whose zone it changed (same transaction)."""
    upserted = await upsert_user(
        conn, claims.user_id, email=claims.email, name=claims.name, timezone=claims.timezone
    )
    user = upserted.user
    if (
        user.is_active
        and upserted.existed
        and user.timezone is not None
        and user.timezone != upserted.previous_timezone
    ):
        before = (await load_platform_settings(conn)).zone_of(upserted.previous_timezone)
        if before != zone_or_utc(user.timezone):
            await reslot_owner_calendar_agents(
                conn, user.id, zone=zone_or_utc(user.timezone), now=now
            )
    return user
