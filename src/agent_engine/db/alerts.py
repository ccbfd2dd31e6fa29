"""`budget_alerts`: an owner's week crossed a threshold of the cap, once per owner, week and
percent (the UNIQUE constraint makes a repeated insert a no-op). The insert's trigger NOTIFYs
`budget_alert_events`.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from agent_engine.db.rows import AnyRow, columns

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


@dataclass(frozen=True, slots=True)
class BudgetAlertRow:
    id: int
    owner_id: int
    window_start: datetime
    percent: int
    used_tokens: int
    cap_tokens: int
    crossed_at: datetime

    @classmethod
    def from_row(cls, row: AnyRow) -> BudgetAlertRow:
        m = columns(row)
        return cls(
            id=int(m["id"]),
            owner_id=int(m["owner_id"]),
            window_start=m["window_start"],
            percent=int(m["percent"]),
            used_tokens=int(m["used_tokens"]),
            cap_tokens=int(m["cap_tokens"]),
            crossed_at=m["crossed_at"],
        )


async def record_alerts(
    conn: AsyncConnection,
    owner_id: int,
    *,
    window_start: datetime,
    percents: Sequence[int],
    used: int,
    cap: int,
    now: datetime,
) -> list[BudgetAlertRow]:
    """Insert the thresholds not recorded yet; returns those this call recorded."""
    rows = await conn.execute(
        _RECORD_SQL,
        {
            "owner_id": owner_id,
            "window_start": window_start,
            "percents": percents,
            "used": used,
            "cap": cap,
            "now": now,
        },
    )
    return [BudgetAlertRow.from_row(row) for row in rows.mappings()]


async def alerts_of_owners(
    conn: AsyncConnection, owner_ids: Collection[int], *, window_start: datetime
) -> dict[int, list[BudgetAlertRow]]:
    """Each owner's alerts of the week starting at `window_start`, lowest threshold first."""
    found: dict[int, list[BudgetAlertRow]] = {owner_id: [] for owner_id in owner_ids}
    if owner_ids:
        rows = await conn.execute(
            _OF_OWNERS_SQL, {"owner_ids": list(owner_ids), "window_start": window_start}
        )
        for row in rows.mappings():
            alert = BudgetAlertRow.from_row(row)
            found[alert.owner_id].append(alert)
    return found


async def newest_alerts(
    conn: AsyncConnection, *, limit: int, after: int | None = None, owner_id: int | None = None
) -> list[BudgetAlertRow]:
    """Alerts newest first, before the alert id `after`, of one owner or all."""
    statement = _NEWEST_FIRST_SQL[after is not None, owner_id is not None]
    rows = await conn.execute(statement, {"limit": limit, "after": after, "owner_id": owner_id})
    return [BudgetAlertRow.from_row(row) for row in rows.mappings()]
