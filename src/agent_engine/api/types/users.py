"""The user as the API shows it, and the lookups through the request's user loader."""

from __future__ import annotations

from zoneinfo import ZoneInfo

import strawberry

from agent_engine.api.loaders import Row
from agent_engine.api.resolvers import Info
from agent_engine.db.platform import zone_or_utc


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
    def from_row(cls, row: Row, *, platform_zone: str) -> User:
        return cls(
            id=strawberry.ID(str(row["id"])),
            email=row["email"],
            display_name=row["display_name"],
            timezone=row["timezone"] or platform_zone,
            active=bool(row["is_active"]),
        )


async def user_or_none(info: Info, user_id: int) -> User | None:
    """The user through the request's loader, in the platform zone when they have none."""
    row = await info.context.loaders.user.load(user_id)
    if row is None:
        return None
    platform = await info.context.loaders.platform()
    return User.from_row(row, platform_zone=platform.timezone)


async def existing_user(info: Info, user_id: int) -> User:
    """A user the database guarantees (their FKs cascade: nothing outlives its owner)."""
    user = await user_or_none(info, user_id)
    if user is None:
        raise LookupError(f"user {user_id} vanished")
    return user


async def owner_zone(info: Info, owner_id: int) -> ZoneInfo:
    """The zone an owner's calendar schedules and budget weeks are in."""
    row = await info.context.loaders.user.load(owner_id)
    if row is not None and row["timezone"]:
        return zone_or_utc(row["timezone"])
    return (await info.context.loaders.platform()).zone
