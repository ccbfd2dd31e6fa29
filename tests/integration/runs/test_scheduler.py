"""The schedule tick: due agents get one journal row per slot and their next slot."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from agent_engine.db.platform import TIMEZONE, WEEKLY_TOKEN_CAP
from agent_engine.domain.runs import RunTrigger
from agent_engine.runs.request import request_run
from agent_engine.runs.scheduler import schedule_due_agents
from tests.support.factories import Factories

NOW = datetime(2025, 3, 12, 10, 0, tzinfo=UTC)
EVERY_6H = {"type": "interval", "every_hours": 6}


async def rows(engine: AsyncEngine, sql: str, **params: Any) -> list[dict[str, Any]]:
    async with engine.connect() as conn:
        return [dict(r._mapping) for r in await conn.execute(text(sql), params)]


async def next_run_at(engine: AsyncEngine, agent_id: int) -> datetime | None:
    found = await rows(engine, "SELECT next_run_at FROM agents WHERE id = :a", a=agent_id)
    value: datetime | None = found[0]["next_run_at"]
    return value


async def test_due_agent_gets_a_scheduled_run_and_its_next_slot(
    engine: AsyncEngine, factories: Factories
) -> None:
    fired = NOW - timedelta(minutes=1)
    due = await factories.agent(schedule=EVERY_6H, next_run_at=fired)
    later = await factories.agent(schedule=EVERY_6H, next_run_at=NOW + timedelta(minutes=1))
    sent: list[int] = []

    claimed = await schedule_due_agents(engine, now=NOW, batch_size=10, enqueue=sent.append)

    assert claimed == 1
    journal = await rows(engine, "SELECT * FROM agent_runs ORDER BY id")
    assert [(r["agent_id"], r["trigger"], r["state"]) for r in journal] == [
        (due["id"], "scheduled", "queued")
    ]
    assert sent == [journal[0]["id"]]
    assert await next_run_at(engine, due["id"]) == fired + timedelta(hours=6)
    assert await next_run_at(engine, later["id"]) == NOW + timedelta(minutes=1)


async def test_missed_slots_coalesce_into_one_run(
    engine: AsyncEngine, factories: Factories
) -> None:
    fired = NOW - timedelta(hours=25)  # four slots missed while the scheduler was down
    agent = await factories.agent(schedule=EVERY_6H, next_run_at=fired)

    await schedule_due_agents(engine, now=NOW, batch_size=10, enqueue=lambda _: None)
    await schedule_due_agents(engine, now=NOW, batch_size=10, enqueue=lambda _: None)

    assert len(await rows(engine, "SELECT id FROM agent_runs")) == 1
    assert await next_run_at(engine, agent["id"]) == fired + timedelta(hours=30)


async def test_calendar_slots_advance_in_the_owners_zone(
    engine: AsyncEngine, factories: Factories
) -> None:
    await factories.setting(TIMEZONE, "Asia/Tokyo")
    berlin = await factories.user(timezone="Europe/Berlin")
    zoneless = await factories.user(timezone=None)
    daily_9 = {"type": "calendar", "cadence": "daily", "time": "09:00"}
    in_berlin = await factories.agent(
        user_id=berlin["id"], schedule=daily_9, next_run_at=datetime(2025, 3, 12, 8, tzinfo=UTC)
    )
    in_tokyo = await factories.agent(
        user_id=zoneless["id"], schedule=daily_9, next_run_at=datetime(2025, 3, 12, 0, tzinfo=UTC)
    )

    await schedule_due_agents(engine, now=NOW, batch_size=10, enqueue=lambda _: None)

    # 09:00 CET is 08:00 UTC; the owner without a zone falls back to the organisation's.
    assert await next_run_at(engine, in_berlin["id"]) == datetime(2025, 3, 13, 8, tzinfo=UTC)
    assert await next_run_at(engine, in_tokyo["id"]) == datetime(2025, 3, 13, 0, tzinfo=UTC)


async def test_slot_while_the_previous_run_is_going_is_journalled_as_skipped(
    engine: AsyncEngine, factories: Factories
) -> None:
    fired = NOW - timedelta(seconds=5)
    agent = await factories.agent(schedule=EVERY_6H, next_run_at=fired)
    running = await factories.run(agent["id"], state="running", started_at=NOW)
    sent: list[int] = []

    await schedule_due_agents(engine, now=NOW, batch_size=10, enqueue=sent.append)

    journal = await rows(engine, "SELECT * FROM agent_runs ORDER BY id")
    first = journal[0]
    assert (first["id"], first["state"], first["reason"]) == (running["id"], "running", None)
    assert [(r["trigger"], r["state"], r["reason"], r["tokens_used"]) for r in journal[1:]] == [
        ("scheduled", "skipped", "already_running", 0)
    ]
    assert sent == []
    assert await next_run_at(engine, agent["id"]) == fired + timedelta(hours=6)


async def test_budget_is_checked_per_owner_in_a_batch(
    engine: AsyncEngine, factories: Factories
) -> None:
    await factories.setting(WEEKLY_TOKEN_CAP, 100)
    spender = await factories.user()
    saver = await factories.user()
    fired = NOW - timedelta(seconds=1)
    spent_agents = [
        await factories.agent(user_id=spender["id"], schedule=EVERY_6H, next_run_at=fired)
        for _ in range(3)
    ]
    fine_agent = await factories.agent(user_id=saver["id"], schedule=EVERY_6H, next_run_at=fired)
    await factories.run(spent_agents[0]["id"], state="succeeded", tokens_used=100, finished_at=NOW)

    await schedule_due_agents(engine, now=NOW, batch_size=10, enqueue=lambda _: None)

    journal = await rows(
        engine, "SELECT * FROM agent_runs WHERE trigger = 'scheduled' ORDER BY agent_id"
    )
    by_agent = {r["agent_id"]: (r["state"], r["reason"], r["tokens_used"]) for r in journal}
    assert by_agent == {
        **{a["id"]: ("skipped", "budget_exceeded", 0) for a in spent_agents},
        fine_agent["id"]: ("queued", None, 0),
    }


async def test_manual_start_racing_a_scheduled_slot_leaves_one_unfinished_run(
    engine: AsyncEngine, factories: Factories
) -> None:
    for _ in range(10):
        agent = await factories.agent(schedule=EVERY_6H, next_run_at=NOW - timedelta(seconds=1))
        sent: list[int] = []

        manual, _ = await asyncio.gather(
            request_run(
                engine, agent["id"], trigger=RunTrigger.MANUAL, now=NOW, enqueue=sent.append
            ),
            schedule_due_agents(engine, now=NOW, batch_size=10, enqueue=sent.append),
        )

        journal = await rows(
            engine, "SELECT * FROM agent_runs WHERE agent_id = :a ORDER BY id", a=agent["id"]
        )
        assert sorted(r["trigger"] for r in journal) == ["manual", "scheduled"]
        outcome = sorted((r["state"], r["reason"]) for r in journal)
        assert outcome == [("queued", None), ("skipped", "already_running")]
        assert len(sent) == 1
        assert manual.id in {r["id"] for r in journal}


async def test_concurrent_ticks_give_each_due_agent_exactly_one_row(
    engine: AsyncEngine, factories: Factories
) -> None:
    model = await factories.model()
    owner = await factories.user()
    fired = NOW - timedelta(minutes=3)
    async with engine.begin() as conn:
        await conn.execute(
            text(
                "INSERT INTO agents (user_id, name, prompt, model_id, schedule, next_run_at)"
                " SELECT :u, 'a' || g, 'p', :m, CAST(:s AS jsonb), :t"
                " FROM generate_series(1, 300) AS g"
            ),
            {
                "u": owner["id"],
                "m": model["id"],
                "s": '{"type":"interval","every_hours":1}',
                "t": fired,
            },
        )
    sent: list[int] = []

    claimed = await asyncio.gather(
        *(
            schedule_due_agents(engine, now=NOW, batch_size=40, enqueue=sent.append)
            for _ in range(4)
        )
    )

    assert sum(claimed) == 300
    per_agent = await rows(
        engine, "SELECT agent_id, count(*) AS n FROM agent_runs GROUP BY agent_id"
    )
    assert len(per_agent) == 300
    assert {r["n"] for r in per_agent} == {1}
    assert len(sent) == 300
    pending = await rows(engine, "SELECT count(*) AS n FROM agents WHERE next_run_at <= :t", t=NOW)
    assert pending[0]["n"] == 0
