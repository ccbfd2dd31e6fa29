"""Budget alerts (DESIGN §10): a finishing run that takes its owner's week across a threshold of
the cap records one `budget_alerts` row per threshold, once per owner, week and percent.

Called once per finished run, right after the finish's compare-and-set (its cost was fixed by that
same write, see migration `e0006_cost_alerts`). Concurrent finishes of one owner are settled by
the database: each check reads the week's sum *after* its own finish committed, so the check of
the finish that committed last sees every one of them and records what they crossed together;
the UNIQUE (owner, window start, percent) constraint makes the inserts of the others a no-op
(ON CONFLICT DO NOTHING), so nothing is recorded twice. A run that jumps past two thresholds
records both. A cap lowered mid-week records the thresholds now crossed on the next finish; the
ones already recorded at the old cap are not recorded again.

The insert's trigger NOTIFYs `budget_alert_events` (the `budgetAlerts` subscription).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import structlog
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from agent_engine.db.platform import PlatformSettings
from agent_engine.domain.budget import BudgetWindow, thresholds_reached, week_window
from agent_engine.runs.budget import spent_tokens

log = structlog.get_logger(__name__)

_OWNER_AND_SETTINGS_SQL = text(
    "SELECT a.user_id AS owner_id,"
    " (SELECT coalesce(jsonb_object_agg(p.key, p.value), '{}'::jsonb) FROM platform_settings p)"
    " AS platform"
    " FROM agent_runs r JOIN agents a ON a.id = r.agent_id WHERE r.id = :run_id"
)

_RECORD_SQL = text(
    "INSERT INTO budget_alerts (owner_id, window_start, percent, used_tokens, cap_tokens,"
    " crossed_at)"
    " SELECT :owner_id, :window_start, p, :used, :cap, :now"
    " FROM unnest(CAST(:percents AS int[])) AS p"
    " ON CONFLICT (owner_id, window_start, percent) DO NOTHING"
    " RETURNING *"
)


_OF_OWNERS_SQL = text(
    "SELECT * FROM budget_alerts WHERE owner_id = ANY(CAST(:owner_ids AS bigint[]))"
    " AND window_start = :window_start ORDER BY percent"
)

# Newest first by id; with an owner, the UNIQUE (owner, window start, percent) index finds them.
_NEWEST_FIRST_SQL = {
    (with_after, with_owner): text(
        "SELECT * FROM budget_alerts WHERE TRUE"
        + (" AND id < :after" if with_after else "")
        + (" AND owner_id = :owner_id" if with_owner else "")
        + " ORDER BY id DESC LIMIT :limit"
    )
    for with_after in (False, True)
    for with_owner in (False, True)
}


@dataclass(frozen=True)
class BudgetAlert:
    id: int
    owner_id: int
    window_start: datetime
    percent: int
    used_tokens: int
    cap_tokens: int
    crossed_at: datetime

    @classmethod
    def from_row(cls, row: Any) -> BudgetAlert:
        return cls(
            id=int(row["id"]),
            owner_id=int(row["owner_id"]),
            window_start=row["window_start"],
            percent=int(row["percent"]),
            used_tokens=int(row["used_tokens"]),
            cap_tokens=int(row["cap_tokens"]),
            crossed_at=row["crossed_at"],
        )


async def record_alerts_after_finish(
    engine: AsyncEngine, run_id: int, *, now: datetime
) -> list[BudgetAlert]:
    """The thresholds the run's owner has crossed this week and that were not recorded yet.

    Never raises: the run is finished already, and a failed check is made good by the owner's next
    finishing run (it records every threshold reached and not yet recorded).
    """
    try:
        async with engine.connect() as conn:
            conn = await conn.execution_options(isolation_level="AUTOCOMMIT")
            found = (await conn.execute(_OWNER_AND_SETTINGS_SQL, {"run_id": run_id})).first()
            if found is None:  # the agent was deleted meanwhile
                return []
            platform = PlatformSettings.from_rows(found.platform or {})
            return await record_crossed_thresholds(
                conn, int(found.owner_id), now=now, platform=platform
            )
    except Exception:
        log.warning("checking the budget alerts failed", run_id=run_id, exc_info=True)
        return []


async def record_crossed_thresholds(
    conn: AsyncConnection, owner_id: int, *, now: datetime, platform: PlatformSettings
) -> list[BudgetAlert]:
    """Record (once) each threshold the owner's week has reached; returns the new alerts."""
    cap = platform.weekly_token_cap
    if cap is None or not platform.budget_alert_percents:
        return []
    window: BudgetWindow = week_window(now, platform.zone)
    used = (await spent_tokens(conn, [owner_id], window=window)).get(owner_id, 0)
    reached = thresholds_reached(used, cap, platform.budget_alert_percents)
    if not reached:
        return []
    rows = await conn.execute(
        _RECORD_SQL,
        {
            "owner_id": owner_id,
            "window_start": window.start,
            "percents": reached,
            "used": used,
            "cap": cap,
            "now": now,
        },
    )
    alerts = [BudgetAlert.from_row(row) for row in rows.mappings()]
    for alert in sorted(alerts, key=lambda a: a.percent):
        log.info(
            f"budget alert: owner {alert.owner_id} reached {alert.percent}% of the weekly cap",
            owner_id=alert.owner_id,
            percent=alert.percent,
            used_tokens=alert.used_tokens,
            cap_tokens=alert.cap_tokens,
            window_start=alert.window_start.isoformat(),
        )
    return alerts


async def alerts_of_owners(
    conn: AsyncConnection, owner_ids: Collection[int], *, window_start: datetime
) -> dict[int, list[BudgetAlert]]:
    """Each owner's alerts of the week starting at `window_start`, lowest threshold first."""
    found: dict[int, list[BudgetAlert]] = {owner_id: [] for owner_id in owner_ids}
    if owner_ids:
        rows = await conn.execute(
            _OF_OWNERS_SQL, {"owner_ids": list(owner_ids), "window_start": window_start}
        )
        for row in rows.mappings():
            alert = BudgetAlert.from_row(row)
            found[alert.owner_id].append(alert)
    return found


async def newest_alerts(
    conn: AsyncConnection, *, limit: int, after: int | None = None, owner_id: int | None = None
) -> list[BudgetAlert]:
    """Alerts newest first, before the alert id `after`, of one owner or all."""
    statement = _NEWEST_FIRST_SQL[after is not None, owner_id is not None]
    rows = await conn.execute(statement, {"limit": limit, "after": after, "owner_id": owner_id})
    return [BudgetAlert.from_row(row) for row in rows.mappings()]
