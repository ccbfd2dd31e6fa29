"""Run retention (docs/architecture.md §10.8): which finished runs are old enough to prune.

A run may go when it finished before `now - retention_days` *and* before the current budget
week began (the week's spend is a sum over the journal, so a run of this week is never pruned,
whatever the setting). Which runs each agent keeps regardless (its newest finished run, its newest
successful one) is decided in SQL by `runs/retention.py`, where the rows are.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

from agent_engine.domain.budget import week_window

MIN_RETENTION_DAYS = 1
MAX_RETENTION_DAYS = 3_650


def retention_cutoff(now: datetime, *, retention_days: int, zone: ZoneInfo) -> datetime:
    """Runs that finished strictly before this instant may be pruned."""
    if not MIN_RETENTION_DAYS <= retention_days <= MAX_RETENTION_DAYS:
        raise ValueError(f"retention_days must be 1..3650, got {retention_days}")
    return min(now - timedelta(days=retention_days), week_window(now, zone).start)
