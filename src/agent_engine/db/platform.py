"""Reads of the neighbours' platform settings (the cap, the organisation zone, the prompt layer)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any
from zoneinfo import ZoneInfo

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from agent_engine.db import direct
from agent_engine.domain.budget import (
    DEFAULT_ALERT_PERCENTS,
    AlertPercentsError,
    parse_alert_percents,
)
from agent_engine.domain.money import DEFAULT_CURRENCY, MoneyError, parse_currency
from agent_engine.domain.zones import DEFAULT_TIMEZONE, user_zone_name, zone_or_utc

WEEKLY_TOKEN_CAP = "agent_weekly_token_cap"
TIMEZONE = "timezone"
PLATFORM_PROMPT = "agent_platform_prompt"
ITERATION_CAP = "agent_iteration_cap"
CURRENCY = "currency"
BUDGET_ALERT_PERCENTS = "agent_budget_alert_percents"
RUN_RETENTION_DAYS = "agent_run_retention_days"

DEFAULT_ITERATION_CAP = 8

# What the platform settings are stored as, in one JSON object (`PlatformSettings.from_rows` reads
# it): the one-statement request and claim compare it with the settings the caller computed its
# budget week and cap from; a request reads it with its viewer (`db.users`).
STORED_PLATFORM = (
    "(SELECT coalesce(jsonb_object_agg(p.key, p.value), '{}'::jsonb) FROM platform_settings p)"
)


@dataclass(frozen=True)
class PlatformSettings:
    weekly_token_cap: int | None = None
    timezone: str = DEFAULT_TIMEZONE
    platform_prompt: str = ""
    iteration_cap: int = DEFAULT_ITERATION_CAP
    currency: str = DEFAULT_CURRENCY
    budget_alert_percents: tuple[int, ...] = DEFAULT_ALERT_PERCENTS
    run_retention_days: int | None = None  # None: keep the journal forever

    @property
    def zone(self) -> ZoneInfo:
        return zone_or_utc(self.timezone)

    def zone_of(self, user_zone: str | None) -> ZoneInfo:
        """The zone of a user with this stored zone (None: none of their own)."""
        return zone_or_utc(user_zone_name(user_zone, self.timezone))

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
            currency=_stored_currency(values.get(CURRENCY)),
            budget_alert_percents=_stored_alert_percents(values.get(BUDGET_ALERT_PERCENTS)),
            run_retention_days=int(retention) if retention is not None else None,
        )


def _stored_currency(value: Any) -> str:
    """A stored currency, or the default when unset or not a code (a hand-edited row)."""
    try:
        return parse_currency(value) if isinstance(value, str) else DEFAULT_CURRENCY
    except MoneyError:
        return DEFAULT_CURRENCY


def _stored_alert_percents(value: Any) -> tuple[int, ...]:
    """Stored thresholds, or the default when unset or invalid (a hand-edited row)."""
    if not isinstance(value, list):
        return DEFAULT_ALERT_PERCENTS
    try:
        return parse_alert_percents(value)
    except AlertPercentsError:
        return DEFAULT_ALERT_PERCENTS


SELECT_SETTINGS = text("SELECT key, value FROM platform_settings")
UPSERT_SETTING = text(
    "INSERT INTO platform_settings (key, value, updated_at)"
    " VALUES (:key, CAST(:value AS jsonb), now())"
    " ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value, updated_at = now()"
)


async def load_platform_settings(conn: AsyncConnection) -> PlatformSettings:
    rows = await direct.fetch(conn, SELECT_SETTINGS, {})
    return PlatformSettings.from_rows({key: value for key, value in rows})


async def write_platform_setting(conn: AsyncConnection, key: str, value: Any) -> None:
    await conn.execute(UPSERT_SETTING, {"key": key, "value": json.dumps(value)})
