"""Deleting an agent: gone at once from every view, its week's spend kept until it no longer
counts, then purged. Real PostgreSQL; the database holds what it can."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest
from sqlalchemy import text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine

from agent_engine.agents.deletion import COUNTED_SPEND_HORIZON, delete_agent
from agent_engine.api.live.bus import RUNS_CHANNEL as CHANNEL
from agent_engine.runs.budget import owners_budgets
from agent_engine.runs.reaper import reap_stale_runs
from agent_engine.settings import to_libpq_url
from tests.support.factories import Factories

NOW = datetime(2025, 3, 12, 10, 0, tzinfo=UTC)  # a Wednesday


async def _rows(engine: AsyncEngine, sql: str, **params: Any) -> list[dict[str, Any]]:
    async with engine.connect() as conn:
        return [dict(r._mapping) for r in await conn.execute(text(sql), params)]


async def _delete(engine: AsyncEngine, agent_id: int, now: datetime = NOW) -> bool:
    async with engine.begin() as conn:
        return await delete_agent(conn, agent_id, now=now)


async def _reap(engine: AsyncEngine, now: datetime) -> list[int]:
    result = await reap_stale_runs(engine, now=now, enqueue=lambda _: None)
    return result.purged_agents


async def test_an_agent_whose_runs_no_longer_count_is_deleted_at_once(
    engine: AsyncEngine, factories: Factories
) -> None:
    agent = await factories.agent(schedule={"type": "interval", "every_hours": 6})
    await factories.run(
        agent["id"],
        state="succeeded",
        tokens_used=50,
        finished_at=NOW - COUNTED_SPEND_HORIZON - timedelta(minutes=1),
    )
    await factories.run(agent["id"], state="skipped", reason="budget_exceeded", finished_at=NOW)

    assert await _delete(engine, agent["id"]) is True

    assert await _rows(engine, "SELECT id FROM agents WHERE id = :a", a=agent["id"]) == []
    assert await _rows(engine, "SELECT id FROM agent_runs WHERE agent_id = :a", a=agent["id"]) == []


async def test_an_agent_with_spend_this_week_is_hidden_keeps_it_and_is_purged_later(
    engine: AsyncEngine, factories: Factories
) -> None:
    agent = await factories.agent(
        schedule={"type": "interval", "every_hours": 6}, next_run_at=NOW + timedelta(hours=1)
    )
    owner = agent["user_id"]
    spent = await factories.run(
        agent["id"], state="succeeded", tokens_used=50, finished_at=NOW - timedelta(hours=1)
    )
    queued = await factories.run(agent["id"], state="queued", created_at=NOW)
    async with engine.connect() as conn:
        before = (await owners_budgets(conn, [owner], now=NOW))[owner]

    assert await _delete(engine, agent["id"]) is False

    hidden = (await _rows(engine, "SELECT * FROM agents WHERE id = :a", a=agent["id"]))[0]
    assert (hidden["deleted_at"], hidden["enabled"], hidden["next_run_at"]) == (NOW, False, None)
    # Its queued run will never start; the spend stays in the owner's week.
    failed = (await _rows(engine, "SELECT * FROM agent_runs WHERE id = :r", r=queued["id"]))[0]
    assert (failed["state"], failed["reason"], failed["tokens_used"]) == ("failed", "error", 0)
    async with engine.connect() as conn:
        after = (await owners_budgets(conn, [owner], now=NOW))[owner]
    assert after.used_tokens == before.used_tokens == 50
    # A second delete finds nothing to delete.
    with pytest.raises(Exception, match="not found"):
        await _delete(engine, agent["id"])

    # Purged only once the spend cannot count in any zone's current week.
    assert await _reap(engine, NOW + timedelta(days=6)) == []
    purge_at = spent["finished_at"] + COUNTED_SPEND_HORIZON + timedelta(seconds=1)
    assert await _reap(engine, purge_at) == [agent["id"]]
    assert await _rows(engine, "SELECT id FROM agent_runs WHERE agent_id = :a", a=agent["id"]) == []


async def test_the_database_keeps_a_hidden_agent_switched_off(
    engine: AsyncEngine, factories: Factories
) -> None:
    agent = await factories.agent()
    await factories.run(agent["id"], state="running", started_at=NOW)
    assert await _delete(engine, agent["id"]) is False
    with pytest.raises(IntegrityError, match="hidden_is_switched_off"):
        async with engine.begin() as conn:
            await conn.execute(
                text("UPDATE agents SET enabled = true WHERE id = :a"), {"a": agent["id"]}
            )


async def test_a_hidden_agents_runs_notify_nobody(
    engine: AsyncEngine, factories: Factories, database_url: str
) -> None:
    live = await factories.agent()
    gone = await factories.agent()
    live_run = await factories.run(live["id"], state="running", started_at=NOW)
    gone_run = await factories.run(gone["id"], state="running", started_at=NOW)
    assert await _delete(engine, gone["id"]) is False
    notes: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    listener = await asyncpg.connect(to_libpq_url(database_url))
    try:
        await listener.add_listener(CHANNEL, lambda *args: notes.put_nowait(json.loads(args[3])))
        async with engine.begin() as conn:
            # The hidden agent's run finishes first, then the live one's.
            for run in (gone_run, live_run):
                await conn.execute(
                    text(
                        "UPDATE agent_runs SET state = 'succeeded', finished_at = :now"
                        " WHERE id = :r"
                    ),
                    {"r": run["id"], "now": NOW},
                )
        note = await asyncio.wait_for(notes.get(), 10)
    finally:
        await listener.close()
    assert (note["run_id"], note["state"]) == (live_run["id"], "succeeded")
    assert notes.empty()
