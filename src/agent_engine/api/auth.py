"""Bearer-token authentication and just-in-time user provisioning.

Tokens are JWTs: HS256 with `AGENT_ENGINE_JWT_SECRET`, or RS256/ES256 with a public key (which then
replaces the secret). `exp` is required, `alg: none` is never accepted. Claims: `sub` (numeric user
id), `email`, `name`, `zoneinfo` (IANA zone), `roles` (`agent_admin` grants admin).

A user is upserted from the claims on first sight and refreshed when the claims change. A
deactivated user stays deactivated: the token is verified, the user is refused with FORBIDDEN
(the caller is known, the account is not allowed in), and nothing in the row is changed.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import jwt
from jwt.warnings import InsecureKeyLengthWarning
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from agent_engine.agents.zones import reslot_owner_calendar_agents
from agent_engine.api.errors import Forbidden, Unauthenticated
from agent_engine.db.platform import load_platform_settings
from agent_engine.db.users import UserRow, upsert_user
from agent_engine.domain.zones import zone_or_utc
from agent_engine.settings import Settings

ADMIN_ROLE = "agent_admin"
ASYMMETRIC_ALGORITHMS = ["RS256", "RS384", "RS512", "ES256", "ES384", "ES512"]
SYMMETRIC_ALGORITHMS = ["HS256"]
# Claims are copied into the users row; absurd sizes are refused rather than stored.
MAX_CLAIM_CHARS = 320
MAX_USER_ID = 2**63 - 1
BEARER = "bearer"
MIN_HS256_SECRET_BYTES = 32

_TTL_RE = re.compile(r"^\s*(\d+)\s*([smhd]?)\s*$")
_TTL_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


@dataclass(frozen=True)
class Claims:
    user_id: int
    email: str | None
    name: str | None
    timezone: str | None
    admin: bool
    expires_at: datetime | None = None  # `exp`


@dataclass(frozen=True)
class Viewer:
    """The authenticated caller."""

    user_id: int
    is_admin: bool
    email: str | None
    display_name: str | None
    timezone: str | None
    # When the token the caller presented expires (a WebSocket session closes then).
    expires_at: datetime | None = None


def parse_ttl(value: str) -> timedelta:
    """`3600`, `30m`, `12h`, `7d` → a positive timedelta."""
    match = _TTL_RE.match(value)
    if not match:
        raise ValueError(f"expected seconds or a number with s/m/h/d, got {value!r}")
    seconds = int(match.group(1)) * _TTL_UNITS[match.group(2)]
    if seconds <= 0:
        raise ValueError("the lifetime must be positive")
    return timedelta(seconds=seconds)


def mint_token(
    secret: str,
    *,
    user_id: int,
    email: str | None = None,
    name: str | None = None,
    timezone: str | None = None,
    admin: bool = False,
    ttl: timedelta = timedelta(hours=12),
    now: datetime | None = None,
) -> str:
    """An HS256 development token with the claims the API reads."""
    issued = now or datetime.now(UTC)
    claims: dict[str, Any] = {
        "sub": str(user_id),
        "iat": int(issued.timestamp()),
        "exp": int((issued + ttl).timestamp()),
        "roles": [ADMIN_ROLE] if admin else [],
    }
    if email is not None:
        claims["email"] = email
    if name is not None:
        claims["name"] = name
    if timezone is not None:
        claims["zoneinfo"] = timezone
    with _short_secret_allowed():
        return jwt.encode(claims, secret, algorithm="HS256")


def short_secret_warning(settings: Settings) -> str | None:
    """A warning for the operator when the HS256 secret is shorter than RFC 7518 recommends."""
    if settings.jwt_verification_key() or not settings.jwt_secret:
        return None
    if len(settings.jwt_secret.encode()) < MIN_HS256_SECRET_BYTES:
        return (
            f"AGENT_ENGINE_JWT_SECRET is shorter than {MIN_HS256_SECRET_BYTES} bytes; "
            "use a longer random secret in production"
        )
    return None


@contextmanager
def _short_secret_allowed() -> Iterator[None]:
    # PyJWT warns on every call with a short HS256 secret; the operator is warned once at startup.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", InsecureKeyLengthWarning)
        yield


def bearer_token(authorization: str | None) -> str | None:
    """The token of an `Authorization: Bearer …` value; None when there is no header."""
    if authorization is None or not authorization.strip():
        return None
    scheme, _, token = authorization.strip().partition(" ")
    if scheme.lower() != BEARER or not token.strip():
        raise Unauthenticated("the Authorization header must be 'Bearer <JWT>'")
    return token.strip()


def verify_token(settings: Settings, token: str) -> Claims:
    """Check the signature, `exp` (required) and the optional `aud`/`iss`; read the claims."""
    public_key = settings.jwt_verification_key()
    if public_key:
        key: str = public_key
        algorithms = ASYMMETRIC_ALGORITHMS
    elif settings.jwt_secret:
        key = settings.jwt_secret
        algorithms = SYMMETRIC_ALGORITHMS
    else:
        raise Unauthenticated("this server has no token verification key configured")
    options: jwt.types.Options = {"require": ["exp", "sub"]}
    try:
        with _short_secret_allowed():
            payload = jwt.decode(
                token,
                key,
                algorithms=algorithms,
                audience=settings.jwt_audience,
                issuer=settings.jwt_issuer,
                options=options,
            )
    except jwt.ExpiredSignatureError as exc:
        raise Unauthenticated("the token has expired") from exc
    except jwt.PyJWTError as exc:
        raise Unauthenticated(f"invalid token: {exc}") from exc
    return _claims(payload)


def _claims(payload: dict[str, Any]) -> Claims:
    sub = payload.get("sub")
    if not isinstance(sub, str | int) or isinstance(sub, bool) or not str(sub).isdigit():
        raise Unauthenticated("invalid token: `sub` must be a numeric user id")
    user_id = int(sub)
    if not 0 < user_id <= MAX_USER_ID:
        raise Unauthenticated("invalid token: `sub` is out of range")
    roles = payload.get("roles") or []
    if isinstance(roles, str):
        roles = roles.split()
    admin = isinstance(roles, list) and ADMIN_ROLE in roles
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


def _text_claim(payload: dict[str, Any], name: str) -> str | None:
    value = payload.get(name)
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > MAX_CLAIM_CHARS:
        raise Unauthenticated(
            f"invalid token: `{name}` must be a string of at most {MAX_CLAIM_CHARS} characters"
        )
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


def viewer_of(row: UserRow, claims: Claims) -> Viewer:
    """The viewer of a provisioned row; a deactivated account is refused."""
    if not row.is_active:
        raise Forbidden("this account is deactivated")
    return Viewer(
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
