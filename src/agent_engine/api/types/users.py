"""The user as the API shows it, and the lookups through the request's user loader."""

from __future__ import annotations

from zoneinfo import ZoneInfo

import strawberry

from agent_engine.api.resolvers import Info
from agent_engine.db.users import UserRow
from agent_engine.domain.zones import user_zone_name, zone_or_utc


@strawberry.type
class User:
    id: strawberry.ID
    email: str | None
    display_name: str | None
    timezone: str = strawberry.field(description="IANA zone; calendar schedules run in it.")
    active: bool = strawberry.field(
        description="False after deactivateOwner, until reactivateOwner."
    )

    @classmethod
    def from_row(cls, row: UserRow, *, timezone: str) -> User:
        """`timezone`: the user's zone as `zone_name` resolves it."""
        return cls(
            id=strawberry.ID(str(row.id)),
            email=row.email,
            display_name=row.display_name,
            timezone=timezone,
            active=row.is_active,
        )


async def zone_name(info: Info, row: UserRow | None) -> str:
    """The user's zone, else the platform's: their calendar schedules and budget weeks are in it."""
    own = row.timezone if row is not None else None
    if own:  # the platform's settings are not needed (nor read)
        return own
    return user_zone_name(own, (await info.context.loaders.platform()).timezone)


async def shown_user(info: Info, row: UserRow) -> User:
    return User.from_row(row, timezone=await zone_name(info, row))


async def user_or_none(info: Info, user_id: int) -> User | None:
    """The user through the request's loader."""
    row = await info.context.loaders.user.load(user_id)
    if row is None:
        return None
    return await shown_user(info, row)


async def existing_user(info: Info, user_id: int) -> User:
    """A user the database guarantees (their FKs cascade: nothing outlives its owner)."""
    user = await user_or_none(info, user_id)
    if user is None:
        raise LookupError(f"user {user_id} vanished")
    return user


async def owner_zone(info: Info, owner_id: int) -> ZoneInfo:
    """The zone an owner's calendar schedules and budget weeks are in."""
    return zone_or_utc(await zone_name(info, await info.context.loaders.user.load(owner_id)))
