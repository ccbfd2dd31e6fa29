"""Budget alerts: a finishing run that takes its owner's week across a threshold of
the cap records one `budget_alerts` row per threshold, once per owner, week and percent.

Called once per finished run, right after the finish's compare-and-set (its cost was fixed by that
same write, see migration `e0006_cost_alerts`). Concurrent finishes of one owner are settled by
the database: each check reads the week's sum *after* its own finish committed, so the check of
the finish that committed last sees every one of them and records what they crossed together;
the UNIQUE (owner, window start, percent) constraint makes the inserts of the others a no-op
(ON CONFLICT DO NOTHING), so nothing is recorded twice. A run that jumps past two thresholds
records both. A cap lowered mid-week records the thresholds now crossed on the next finish; the
ones already recorded at the old cap are not recorded again.

Most finishes need no check at all: the finish statement returns the owner's week with the run
as the `budget_weeks` trigger wrote it, under the week row's lock, so in commit order (migration
`e0008_budget_weeks`); while that total has reached no threshold, no finish before it can have, and
nothing is read (`under_every_threshold`). From the first total that reaches one, every finish
checks after its commit as above.

Within a worker process, the checks of one owner's week take turns, and a check covers every
finish that had committed when it started: a finish whose commit an already completed check
covered returns without a statement of its own. So a burst of one owner's runs finishing
together (the Monday slot: dozens of agents of one person) costs a few sums, not one per run,
and "every finish is followed by a sum read after its commit" still holds.

The insert's trigger NOTIFYs `budget_alert_events` (the `budgetAlerts` subscription).
"""

from __future__ import annotations

import asyncio
import weakref
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import structlog
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from agent_engine.db import alerts as alerts_sql
from agent_engine.db.alerts import BudgetAlertRow
from agent_engine.db.lane import autocommit
from agent_engine.db.platform import PlatformSettings
from agent_engine.db.spend import spent_tokens
from agent_engine.domain.budget import BudgetWindow, thresholds_reached, week_window

log = structlog.get_logger(__name__)


async def record_alerts_after_finish(
    engine: AsyncEngine,
    run_id: int,
    *,
    now: datetime,
    owner_id: int | None,
    platform: dict[str, Any] | None,
    week_start: datetime | None = None,
    week_tokens: int | None = None,
) -> list[BudgetAlertRow]:
    """The thresholds the run's owner has crossed this week and that were not recorded yet.

    `owner_id` (None: the agent was deleted meanwhile), the stored `platform` settings and the
    owner's week with this run (`week_start`, `week_tokens`) are what the finish statement
    returned (`db.runs.FINISH`). Without a cap or alert percents no statement runs at all; nor
    when the week with this run had reached no threshold (see `under_every_threshold`).

    Never raises: the run is finished already, and a failed check is made good by the owner's next
    finishing run (it records every threshold reached and not yet recorded).
    """
    if owner_id is None:
        return []
    try:
        settings = PlatformSettings.from_rows(platform or {})
        if settings.weekly_token_cap is None or not settings.budget_alert_percents:
            return []
        window = week_window(now, settings.zone)
        if under_every_threshold(week_start, week_tokens, window, settings):
            return []
        turns = _turns.setdefault(asyncio.get_running_loop(), {})
        key = (owner_id, window.start)
        turn = turns.setdefault(key, _Turn())
        turn.registered += 1
        mine = turn.registered
        turn.users += 1
        try:
            async with turn.lock:
                if turn.covered >= mine:
                    return []  # a check that started after this finish committed has run
                upto = turn.registered
                async with autocommit(engine) as conn:
                    alerts = await record_crossed_thresholds(
                        conn, owner_id, now=now, window=window, platform=settings
                    )
                turn.covered = upto
                return alerts
        finally:
            turn.users -= 1
            if turn.users == 0:
                del turns[key]
    except Exception:
        log.warning("checking the budget alerts failed", run_id=run_id, exc_info=True)
        return []


def under_every_threshold(
    week_start: datetime | None,
    week_tokens: int | None,
    window: BudgetWindow,
    platform: PlatformSettings,
) -> bool:
    """Whether the owner's week, as the finish's own write left it, had reached no threshold.

    `week_tokens` is the owner's total for the week starting `week_start`, with this run, which
    the `budget_weeks` trigger read under the week row's lock: the finishes of one owner's week
    take that lock in turn, so each total holds every finish committed before it, and the finish
    that takes the week across a threshold is the one that sees it reached and checks after its
    commit (as does every later one). A total of another week than `window` (the week turned
    between the write and now, or the two disagree on the zone), or none (the run counted no
    tokens), is no answer: the check runs.
    """
    if week_start is None or week_tokens is None or week_start != window.start:
        return False
    return not thresholds_reached(
        week_tokens, platform.weekly_token_cap, platform.budget_alert_percents
    )


@dataclass
class _Turn:
    """The checks of one owner's week in this process: one at a time, each covering the finishes
    registered (committed) before it started."""

    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    registered: int = 0  # finishes that asked for a check, numbered in order
    covered: int = 0  # the last of them a completed check started after
    users: int = 0  # finishes holding or waiting for the turn (the entry goes with the last)


# By event loop (a lock belongs to one), then owner and week start.
_turns: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[tuple[int, datetime], _Turn]] = (
    weakref.WeakKeyDictionary()
)


async def record_crossed_thresholds(
    conn: AsyncConnection,
    owner_id: int,
    *,
    now: datetime,
    window: BudgetWindow,
    platform: PlatformSettings,
) -> list[BudgetAlertRow]:
    """Record (once) each threshold the owner's week (`window`, the one containing `now`) has
    reached; returns the new alerts."""
    cap = platform.weekly_token_cap
    if cap is None or not platform.budget_alert_percents:
        return []
    used = (await spent_tokens(conn, [owner_id], window=window)).get(owner_id, 0)
    reached = thresholds_reached(used, cap, platform.budget_alert_percents)
    if not reached:
        return []
    alerts = await alerts_sql.record_alerts(
        conn, owner_id, window_start=window.start, percents=reached, used=used, cap=cap, now=now
    )
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
