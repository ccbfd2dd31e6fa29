"""Reads of the neighbours' platform settings (the cap, the organisation zone, the prompt layer)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

WEEKLY_TOKEN_CAP = "agent_weekly_token_cap"
TIMEZONE = "timezone"
PLATFORM_PROMPT = "agent_platform_prompt"
ITERATION_CAP = "agent_iteration_cap"
RUN_RETENTION_DAYS = "agent_run_retention_days"

DEFAULT_TIMEZONE = "UTC"
DEFAULT_ITERATION_CAP = 8


@dataclass(frozen=True)
class PlatformSettings:
    weekly_token_cap: int | None = None
    timezone: str = DEFAULT_TIMEZONE
    platform_prompt: str = ""
    iteration_cap: int = DEFAULT_ITERATION_CAP
    run_retention_days: int | None = None  # None: keep the journal forever

    @property
    def zone(self) -> ZoneInfo:
        return zone_or_utc(self.timezone)

    @classmethod
    def from_rows(cls, values: dict[str, Any]) -> PlatformSettings:
        cap = values.get(WEEKLY_TOKEN_CAP)
        iteration_cap = values.get(ITERATION_CAP)
        retention = values.get(RUN_RETENTION_DAYS)
        return cls(
            weekly_token_cap=int(cap) if cap is not None else None,
            timezone=str(values.get(TIMEZONE) or DEFAULT_TIMEZONE),
            platform_prompt=str(values.get(PLATFORM_PROMPT) or ""),
            iteration_cap=DEFAULT_ITERATION_CAP if iteration_cap is None else int(iteration_cap),
            run_retention_days=int(retention) if retention is not None else None,
        )


def zone_or_utc(name: str | None) -> ZoneInfo:
    """A zone from a stored name; an unknown name falls back to UTC rather than failing a run."""
    try:
        return ZoneInfo(name or DEFAULT_TIMEZONE)
    except (ZoneInfoNotFoundError, ValueError):
        return ZoneInfo(DEFAULT_TIMEZONE)


async def load_platform_settings(conn: AsyncConnection) -> PlatformSettings:
    rows = await conn.execute(text("SELECT key, value FROM platform_settings"))
    return PlatformSettings.from_rows({key: value for key, value in rows})


async def write_platform_setting(conn: AsyncConnection, key: str, value: Any) -> None:
    await conn.execute(
        text(
            "INSERT INTO platform_settings (key, value, updated_at)"
            " VALUES (:key, CAST(:value AS jsonb), now())"
            " ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value, updated_at = now()"
        ),
        {"key": key, "value": _json(value)},
    )


def _json(value: Any) -> str:
    import json

    return json.dumps(value)
