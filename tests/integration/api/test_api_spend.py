"""The forecast, each agent's pace and the admin's spend report, through the API (fixed clock)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from agent_engine.db.platform import TIMEZONE, WEEKLY_TOKEN_CAP
from tests.integration.api.support import Api, codes
from tests.integration.api.test_api_statements import counting_statements
from tests.support.factories import Factories

OWNER, OTHER = 31, 32
HOURLY = {"type": "interval", "every_hours": 1}
DAILY_0130 = {"type": "calendar", "cadence": "daily", "time": "01:30"}

FORECAST = """{ viewer {
  agents { name expectedTokensPerRun }
  budget { usedTokens capTokens windowStart windowEnd
           forecast { projectedTokens exhaustsAt agentsWithoutHistory } } } }"""


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)  # type: ignore[misc]


async def history(
    factories: Factories, agent_id: int, tokens: list[int], *, finished: datetime
) -> None:
    """Finished runs, oldest first, a minute apart, ending at `finished`."""
    for index, used in enumerate(tokens):
        at = finished - timedelta(minutes=len(tokens) - index)
        await factories.run(
            agent_id, state="succeeded", tokens_used=used, started_at=at, finished_at=at
        )


async def test_the_forecast_walks_each_remaining_slot_across_spring_forward(
    api: Api, factories: Factories
) -> None:
    # Sunday 2025-03-09 00:30 in New York; the clocks jump 02:00 -> 03:00 that night.
    api.clock.now = utc(2025, 3, 9, 5, 30)
    last_week = utc(2025, 3, 8, 12)
    await factories.setting(TIMEZONE, "America/New_York")
    await factories.user(id=OWNER, timezone=None)  # the organisation zone applies
    model = await factories.model()

    async def agent(name: str, **values: Any) -> dict[str, Any]:
        return await factories.agent(user_id=OWNER, model_id=model["id"], name=name, **values)

    hourly = await agent("hourly", schedule=HOURLY, next_run_at=utc(2025, 3, 9, 6))
    await history(factories, hourly["id"], [100] * 10, finished=last_week)
    daily = await agent("daily", schedule=DAILY_0130, next_run_at=utc(2025, 3, 9, 6, 30))
    await history(factories, daily["id"], [900, 1000, 1100], finished=last_week)
    manual = await agent("manual")
    await history(factories, manual["id"], [400], finished=api.clock.now)  # this week's spend
    await agent("new", schedule=HOURLY, next_run_at=utc(2025, 3, 9, 6))  # no history yet
    switched_off = await agent("off", schedule=HOURLY, enabled=False)
    await history(factories, switched_off["id"], [10_000], finished=last_week)

    data = await api.data(FORECAST, None, as_user=OWNER)

    paces = {a["name"]: a["expectedTokensPerRun"] for a in data["viewer"]["agents"]}
    assert paces == {"hourly": 100, "daily": 1000, "manual": 400, "new": None, "off": 10_000}
    budget = data["viewer"]["budget"]
    assert (budget["windowStart"], budget["windowEnd"]) == (
        "2025-03-09T05:00:00+00:00",
        "2025-03-16T04:00:00+00:00",  # 167 hours
    )
    # 400 so far; 166 hourly slots (06:00 UTC on the 9th to 03:00 UTC on the 16th) x 100; seven
    # daily slots at 01:30 local (06:30 UTC before the change, 05:30 UTC after) x 1000.
    assert budget["forecast"] == {
        "projectedTokens": 400 + 166 * 100 + 7 * 1000,
        "exhaustsAt": None,
        "agentsWithoutHistory": 1,
    }

    await factories.setting(WEEKLY_TOKEN_CAP, 5000)
    forecast = (await api.data(FORECAST, None, as_user=OWNER))["viewer"]["budget"]["forecast"]
    # 400 +100 (06:00) +1000 (06:30) = 1500; +23 hourly to 05:00 on the 10th = 3800; the daily
    # slot at 05:30 UTC (01:30 EDT, an hour earlier in UTC than the day before) = 4800;
    # 06:00 = 4900; 07:00 = 5000, the cap.
    assert forecast["exhaustsAt"] == "2025-03-10T07:00:00+00:00"


async def test_pace_counts_only_the_newest_ten_succeeded_or_failed_runs(
    api: Api, factories: Factories
) -> None:
    await factories.user(id=OWNER)
    agent = await factories.agent(user_id=OWNER)
    finished = api.clock.now - timedelta(days=10)
    await history(factories, agent["id"], [1_000_000] + [50] * 9, finished=finished)
    await factories.run(agent["id"], state="failed", reason="error", tokens_used=70)
    await factories.run(agent["id"], state="skipped", reason="budget_exceeded", tokens_used=0)
    await factories.run(agent["id"], state="running", tokens_used=5)

    query = "query A($id: ID!) { agent(id: $id) { expectedTokensPerRun } }"
    data = await api.data(query, {"id": str(agent["id"])}, as_user=OWNER)

    # The newest ten finished-and-ran: 70 and nine 50s (the outlier is the eleventh).
    assert data["agent"]["expectedTokensPerRun"] == 50


async def test_forecast_and_pace_cost_the_same_statements_for_10_and_100_agents(
    api: Api, factories: Factories, engine: AsyncEngine
) -> None:
    model = await factories.model()
    for owner, size in ((OWNER, 10), (OTHER, 100)):
        await factories.user(id=owner)
        for i in range(size):
            agent = await factories.agent(
                user_id=owner,
                model_id=model["id"],
                schedule=HOURLY,
                next_run_at=api.clock.now + timedelta(minutes=30),
                name=f"a{i}",
            )
            await factories.run(
                agent["id"], state="succeeded", tokens_used=3, finished_at=api.clock.now
            )
        await api.data("{ viewer { isAdmin } }", None, as_user=owner)
    query = """{ viewer { agents { expectedTokensPerRun } budgetAlerts { id }
      budget { usedCost forecast { projectedTokens agentsWithoutHistory } } } }"""
    database = engine.url.database
    assert database is not None
    counts = {}
    for owner, size in ((OWNER, 10), (OTHER, 100)):
        with counting_statements(database) as statements:
            data = await api.data(query, None, as_user=owner)
        assert data["viewer"]["budget"]["forecast"]["agentsWithoutHistory"] == 0
        assert [a["expectedTokensPerRun"] for a in data["viewer"]["agents"]] == [3] * size
        counts[size] = len(statements)
    assert counts[10] == counts[100], counts


async def test_the_admin_spend_report_is_per_owner_and_week(
    api: Api, factories: Factories, engine: AsyncEngine
) -> None:
    # FIXED_NOW is Wednesday 2025-03-12: this week starts Sunday the 9th (UTC).
    now = api.clock.now
    model = await factories.model()
    agents = {}
    for owner in (41, 42, 43):
        await factories.user(id=owner)
        agents[owner] = await factories.agent(user_id=owner, model_id=model["id"])

    async def run(owner: int, tokens: int, cost: str | None, at: datetime, **extra: Any) -> None:
        await factories.run(
            agents[owner]["id"],
            state=extra.pop("state", "succeeded"),
            tokens_used=tokens,
            cost=Decimal(cost) if cost is not None else None,
            finished_at=at,
            **extra,
        )

    await run(41, 1000, "0.5", now - timedelta(hours=1))
    await run(41, 500, None, now - timedelta(days=2))  # an unpriced model that day
    await run(42, 300, "0.25", now - timedelta(hours=2))
    await run(42, 0, None, now, state="skipped", reason="budget_exceeded")
    await run(43, 9999, "9", now - timedelta(days=7))  # last week
    await run(43, 0, None, now, state="skipped", reason="already_running")

    query = """query Spend($start: DateTime) { adminSpend(windowStart: $start) {
      owner { id } tokens cost runs } }"""
    this_week = (await api.data(query, None, as_user=1, admin=True))["adminSpend"]
    assert this_week == [
        {"owner": {"id": "41"}, "tokens": 1500, "cost": "0.5", "runs": 2},
        {"owner": {"id": "42"}, "tokens": 300, "cost": "0.25", "runs": 1},
    ]
    last_week = (await api.data(query, {"start": "2025-03-05T12:00:00Z"}, as_user=1, admin=True))[
        "adminSpend"
    ]
    assert last_week == [{"owner": {"id": "43"}, "tokens": 9999, "cost": "9", "runs": 1}]
    assert codes(await api.body(query, None, as_user=41)) == ["FORBIDDEN"]

    # One aggregate, and the database can serve it from an index whatever the journal's size.
    async with engine.connect() as conn:
        await conn.execute(text("SET enable_seqscan = off"))
        plan = "\n".join(
            row[0]
            for row in await conn.execute(
                text(
                    "EXPLAIN SELECT a.user_id, SUM(r.tokens_used), SUM(r.cost), count(*)"
                    " FROM agent_runs r JOIN agents a ON a.id = r.agent_id"
                    " WHERE r.finished_at >= :s AND r.finished_at < :e AND r.state <> 'skipped'"
                    " GROUP BY a.user_id"
                ),
                {"s": now - timedelta(days=3), "e": now + timedelta(days=4)},
            )
        )
    assert "Seq Scan on agent_runs" not in plan and "agent_runs_finished_at" in plan, plan
