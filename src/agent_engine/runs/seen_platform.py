"""The platform settings as this process last read them, for the one-statement request and claim.

Both compute the budget week and the cap before their statement, from the settings seen last, and
the statement itself checks that they are still the stored ones (`db.runs.REQUEST_AT_ONCE`,
`CLAIM_AT_ONCE`); when they are not, it writes nothing, hands the stored ones back to be
remembered, and the caller's transaction decides.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from agent_engine.db.platform import PlatformSettings
from agent_engine.domain.budget import week_window


@dataclass(frozen=True)
class SeenPlatform:
    """The stored settings (as JSON, the statements compare it) and what they say."""

    stored: str
    settings: PlatformSettings


_seen: SeenPlatform | None = None


def seen() -> SeenPlatform | None:
    """The settings read last in this process; None before the first read."""
    return _seen


def budget_params(seen: SeenPlatform | None, now: datetime) -> dict[str, Any]:
    """What a one-statement request or claim compares and computes with: the seen settings (as
    stored), their cap and the budget week containing `now`; all None before the first read (the
    statement then writes nothing: the settings cannot match)."""
    if seen is None:
        return {"platform": None, "cap": None, "start": None, "end": None}
    week = week_window(now, seen.settings.zone)
    return {
        "platform": seen.stored,
        "cap": seen.settings.weekly_token_cap,
        "start": week.start,
        "end": week.end,
    }


def remember(stored: dict[str, Any] | None) -> PlatformSettings:
    """Keep the stored settings (the `platform` JSON object a statement returned); returns them
    parsed."""
    global _seen
    values = stored or {}
    settings = PlatformSettings.from_rows(values)
    _seen = SeenPlatform(json.dumps(values), settings)
    return settings
