"""The owner's budget week as the claim, the one-statement request and the alert sum it: the same
tokens as the many-owners sum, read agent by agent — never every finished run of the week, even
when the statistics predate the week's runs (a burst's first minutes, before autovacuum's
ANALYZE: the full stampede's claims took 100 ms each that way)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from decimal import Decimal

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from agent_engine.db.spend import spent_costs, spent_tokens
from agent_engine.domain.budget import BudgetWindow
from tests.integration.db.support import rows_read_from_runs, week_sum_plan
from tests.support.factories import Factories

NOW = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)
WEEK = BudgetWindow(
    start=datetime(2026, 11, 23, tzinfo=UTC), end=datetime(2026, 11, 30, tzinfo=UTC), timezone="UTC"
)


async def _finished_runs(engine: AsyncEngine, agent_ids: list[int], per_agent: int) -> None:
    """`per_agent` succeeded runs of 10 tokens per agent, all finished inside `WEEK`."""
    async with engine.begin() as conn:
        await conn.execute(
            text(
                "INSERT INTO agent_runs (agent_id, trigger, state, tokens_used, created_at,"
                " started_at, finished_at)"
                " SELECT a, 'scheduled', 'succeeded', 10, t, t, t + make_interval(secs => g)"
                " FROM CAST(:t AS timestamptz) t, unnest(CAST(:agents AS bigint[])) a,"
                " generate_series(1, CAST(:n AS int)) g"
            ),
            {"agents": agent_ids, "n": per_agent, "t": NOW},
        )


async def test_one_owners_week_equals_the_many_owners_sum(
    engine: AsyncEngine, factories: Factories
) -> None:
    owner, other, idle = (await factories.user(), await factories.user(), await factories.user())
    mine = [await factories.agent(owner["id"], name=f"mine {i}") for i in range(3)]
    theirs = await factories.agent(other["id"])
    await _finished_runs(engine, [a["id"] for a in mine], per_agent=4)  # 120 tokens
    await _finished_runs(engine, [theirs["id"]], per_agent=5)
    # Not in the week: before it, at its end, unfinished.
    await factories.run(
        mine[0]["id"],
        state="succeeded",
        tokens_used=1_000,
        finished_at=WEEK.start - timedelta(seconds=1),
    )
    await factories.run(
        mine[1]["id"], state="failed", reason="error", tokens_used=1_000, finished_at=WEEK.end
    )
    await factories.run(mine[2]["id"], state="running", tokens_used=1_000)
    # A deleted agent's runs still count in its owner's week.
    gone = await factories.agent(owner["id"], name="gone", enabled=False, deleted_at=NOW)
    await _finished_runs(engine, [gone["id"]], per_agent=1)
    # Priced runs: two of the owner's agents in the week, one before it.
    for agent, cost, finished in (
        (mine[0], "0.25", NOW),
        (gone, "0.50", NOW),
        (mine[1], "7", WEEK.start - timedelta(days=1)),
    ):
        await factories.run(
            agent["id"], state="succeeded", tokens_used=0, cost=Decimal(cost), finished_at=finished
        )

    async with engine.connect() as conn:
        alone = {
            o["id"]: await spent_tokens(conn, [o["id"]], window=WEEK) for o in (owner, other, idle)
        }
        together = await spent_tokens(conn, [owner["id"], other["id"], idle["id"]], window=WEEK)
        costs_alone = {
            o["id"]: await spent_costs(conn, [o["id"]], window=WEEK) for o in (owner, other, idle)
        }
        costs_together = await spent_costs(
            conn, [owner["id"], other["id"], idle["id"]], window=WEEK
        )

    assert alone == {
        owner["id"]: {owner["id"]: 130},
        other["id"]: {other["id"]: 50},
        idle["id"]: {idle["id"]: 0},
    }
    assert together.get(owner["id"], 0) == 130
    assert together.get(other["id"], 0) == 50
    assert together.get(idle["id"], 0) == 0
    # No priced run in the week: None, not 0.
    assert costs_together == {owner["id"]: Decimal("0.75"), other["id"]: None, idle["id"]: None}
    assert costs_alone == {o: {o: cost} for o, cost in costs_together.items()}


async def test_one_owners_week_reads_only_that_owners_runs_with_stale_statistics(
    engine: AsyncEngine, factories: Factories
) -> None:
    owner, busy = await factories.user(), await factories.user()
    mine = [await factories.agent(owner["id"], name=f"mine {i}") for i in range(50)]
    others = [await factories.agent(busy["id"], name=f"busy {i}") for i in range(20)]
    async with engine.connect() as conn:
        # The statistics know the agents and see the journal empty, as at a first burst.
        await conn.execution_options(isolation_level="AUTOCOMMIT")
        await conn.execute(text("ANALYZE agents, agent_runs"))
    await _finished_runs(engine, [a["id"] for a in mine], per_agent=1)
    await _finished_runs(engine, [a["id"] for a in others], per_agent=200)  # 4,000 runs

    async with engine.connect() as conn:
        plan = await week_sum_plan(conn, owner["id"], WEEK)
        used = (await spent_tokens(conn, [owner["id"]], window=WEEK))[owner["id"]]

    assert used == 500
    # The owner's 50 runs, not the busy owner's 4,000 with them.
    assert rows_read_from_runs(plan) <= 50, json.dumps(plan, indent=1)
