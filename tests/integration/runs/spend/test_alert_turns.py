"""The budget-alert checks of one owner's week take turns in a process, and a check covers every
finish that committed before it started: a burst of one owner's finishes costs a few sums, and
what they crossed together is recorded once, with the whole burst counted."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine

from agent_engine.db.platform import BUDGET_ALERT_PERCENTS, WEEKLY_TOKEN_CAP
from agent_engine.runs.alerts import record_alerts_after_finish
from tests.integration.runs.support import fetch
from tests.support.factories import Factories

BURST = 20
TOKENS = 10


async def test_a_burst_of_one_owners_finishes_costs_a_few_sums_and_records_once(
    engine: AsyncEngine, factories: Factories
) -> None:
    owner = await factories.user()
    await factories.setting(WEEKLY_TOKEN_CAP, BURST * TOKENS)
    await factories.setting(BUDGET_ALERT_PERCENTS, [50, 100])
    platform = {WEEKLY_TOKEN_CAP: BURST * TOKENS, BUDGET_ALERT_PERCENTS: [50, 100]}
    now = datetime.now(UTC)
    runs = []
    for _ in range(BURST):
        agent = await factories.agent(user_id=owner["id"])
        runs.append(
            await factories.run(
                agent["id"], state="succeeded", tokens_used=TOKENS, started_at=now, finished_at=now
            )
        )
    sums: list[str] = []

    def count(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        if "SUM(r.tokens_used)" in statement:
            sums.append(statement)

    event.listen(engine.sync_engine, "before_cursor_execute", count)
    try:
        # Each finish committed (the rows above), then asks for its check, all at once.
        recorded = await asyncio.gather(
            *(
                record_alerts_after_finish(
                    engine, run["id"], now=now, owner_id=owner["id"], platform=platform
                )
                for run in runs
            )
        )
    finally:
        event.remove(engine.sync_engine, "before_cursor_execute", count)

    assert 1 <= len(sums) <= 2, len(sums)  # the first check, and one for all that waited
    alerts = await fetch(
        engine,
        "SELECT percent, used_tokens FROM budget_alerts WHERE owner_id = :o ORDER BY percent",
        o=owner["id"],
    )
    assert [(a["percent"], a["used_tokens"]) for a in alerts] == [
        (50, BURST * TOKENS),
        (100, BURST * TOKENS),
    ]
    assert sorted(a.percent for found in recorded for a in found) == [50, 100]


async def test_a_finish_after_a_check_gets_a_check_of_its_own(
    engine: AsyncEngine, factories: Factories
) -> None:
    owner = await factories.user()
    agent = await factories.agent(user_id=owner["id"])
    platform = {WEEKLY_TOKEN_CAP: 100, BUDGET_ALERT_PERCENTS: [50, 100]}
    now = datetime.now(UTC)

    async def finished(tokens: int) -> list[int]:
        run = await factories.run(
            agent["id"], state="succeeded", tokens_used=tokens, started_at=now, finished_at=now
        )
        found = await record_alerts_after_finish(
            engine, run["id"], now=now, owner_id=owner["id"], platform=platform
        )
        return [a.percent for a in found]

    assert await finished(60) == [50]
    assert await finished(30) == []
    assert await finished(10) == [100]
