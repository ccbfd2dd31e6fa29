"""Which zone a user's calendar schedules and budget weeks are in: their own, else the
organisation's (docs/architecture.md §4.1)."""

from __future__ import annotations

from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

DEFAULT_TIMEZONE = "UTC"


def zone_or_utc(name: str | None) -> ZoneInfo:
    """A zone from a stored name; an unknown name falls back to UTC rather than failing a run."""
    try:
        return ZoneInfo(name or DEFAULT_TIMEZONE)
    except (ZoneInfoNotFoundError, ValueError):
        return ZoneInfo(DEFAULT_TIMEZONE)


def user_zone_name(user_zone: str | None, platform_zone: str) -> str:
    """The user's own zone when they have one, else the platform's."""
    return user_zone or platform_zone
