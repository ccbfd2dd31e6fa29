"""Run retention on a real PostgreSQL: which runs a pass prunes, which it keeps, and how."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from agent_engine.runs.retention import RETENTION_LOCK_KEY, prune_finished_runs
from tests.integration.runs.support import fetch
from tests.support.factories import Factories

NOW = datetime(2025, 3, 12, 10, 0, tzinfo=UTC)  # a Wednesday; the UTC week began on the 9th
DAY = timedelta(days=1)

REASONS = {"failed": "error", "skipped": "budget_exceeded"}


async def finished(factories: Factories, agent: dict[str, Any], state: str, at: datetime) -> int:
    run = await factories.run(
        agent_id=agent["id"],
        state=state,
        reason=REASONS.get(state),
        created_at=at - timedelta(minutes=1),
        started_at=None if state == "skipped" else at - timedelta(minutes=1),
        finished_at=at,
        tokens_used=10,
    )
    return int(run["id"])


async def remaining(engine: AsyncEngine) -> set[int]:
    return {row["id"] for row in await fetch(engine, "SELECT id FROM agent_runs")}


async def pruned_counter(engine: AsyncEngine) -> int:
    rows = await fetch(engine, "SELECT count FROM engine_activity WHERE name = 'runs_pruned'")
    return int(rows[0]["count"]) if rows else 0


async def test_old_runs_go_and_every_agent_keeps_its_last_finished_and_last_successful_run(
    engine: AsyncEngine, factories: Factories
) -> None:
    await factories.setting("agent_run_retention_days", 30)
    busy = await factories.agent()
    runs = {
        name: await finished(factories, busy, state, NOW - days * DAY)
        for name, state, days in [
            ("s1", "succeeded", 100),
            ("f1", "failed", 90),
            ("s2", "succeeded", 80),
            ("k1", "skipped", 70),
            ("s3", "succeeded", 60),  # its newest success: previous_output reads it
            ("f2", "failed", 50),  # its newest finished run: lastRun
        ]
    }
    lonely = await factories.agent()
    lonely_run = await finished(factories, lonely, "succeeded", NOW - 400 * DAY)
    running_agent = await factories.agent()
    before_running = await finished(factories, running_agent, "succeeded", NOW - 100 * DAY)
    still_running = (
        await factories.run(
            agent_id=running_agent["id"],
            state="running",
            started_at=NOW - timedelta(minutes=5),
            heartbeat_at=NOW,
        )
    )["id"]
    active = await factories.agent()
    active_old = [
        await finished(factories, active, "succeeded", NOW - 100 * DAY),
        await finished(factories, active, "skipped", NOW - 90 * DAY),
    ]
    active_new = await finished(factories, active, "succeeded", NOW - timedelta(hours=1))

    result = await prune_finished_runs(engine, now=NOW)

    assert result.deleted == 6
    assert result.cutoff == NOW - 30 * DAY
    assert await remaining(engine) == {
        runs["s3"],
        runs["f2"],
        lonely_run,
        before_running,
        still_running,
        active_new,
    }
    assert not {runs["s1"], runs["f1"], runs["s2"], runs["k1"], *active_old} & await remaining(
        engine
    )
    assert await pruned_counter(engine) == 6

    # A second pass finds nothing more to do.
    again = await prune_finished_runs(engine, now=NOW)
    assert again.deleted == 0
    assert await pruned_counter(engine) == 6


async def test_without_a_retention_setting_nothing_is_pruned(
    engine: AsyncEngine, factories: Factories
) -> None:
    agent = await factories.agent()
    ids = [await finished(factories, agent, "succeeded", NOW - d * DAY) for d in (900, 800, 1)]
    result = await prune_finished_runs(engine, now=NOW)
    assert result.deleted == 0
    assert await remaining(engine) == set(ids)


async def test_runs_of_the_current_budget_week_stay_whatever_the_setting(
    engine: AsyncEngine, factories: Factories
) -> None:
    await factories.setting("agent_run_retention_days", 1)
    agent = await factories.agent()
    last_week = await finished(factories, agent, "succeeded", datetime(2025, 3, 8, 12, tzinfo=UTC))
    this_monday = await finished(
        factories, agent, "succeeded", datetime(2025, 3, 10, 12, tzinfo=UTC)
    )
    this_sunday = await finished(factories, agent, "failed", datetime(2025, 3, 9, 0, tzinfo=UTC))
    today = await finished(factories, agent, "succeeded", NOW - timedelta(hours=1))

    result = await prune_finished_runs(engine, now=NOW)

    assert result.cutoff == datetime(2025, 3, 9, tzinfo=UTC)
    # Monday and the very first instant of the week count in this week's budget: kept.
    assert await remaining(engine) == {this_monday, this_sunday, today}
    assert last_week not in await remaining(engine)


async def test_a_large_backlog_goes_in_many_small_transactions(
    engine: AsyncEngine, factories: Factories
) -> None:
    await factories.setting("agent_run_retention_days", 7)
    agents = [await factories.agent() for _ in range(3)]
    newest = {}
    for day in range(40, 10, -1):
        for agent in agents:
            newest[agent["id"]] = await finished(factories, agent, "succeeded", NOW - day * DAY)

    result = await prune_finished_runs(engine, now=NOW, batch_size=7, pause_seconds=0)

    assert result.deleted == 3 * 30 - 3
    assert result.batches >= (3 * 30) // 7
    assert result.complete
    assert await remaining(engine) == set(newest.values())


async def test_a_pass_while_another_one_holds_the_lock_leaves_the_work_to_it(
    engine: AsyncEngine, factories: Factories
) -> None:
    await factories.setting("agent_run_retention_days", 30)
    agent = await factories.agent()
    ids = [await finished(factories, agent, "succeeded", NOW - d * DAY) for d in (90, 80)]
    async with engine.connect() as other:
        await other.execute(text("SELECT pg_advisory_lock(:k)"), {"k": RETENTION_LOCK_KEY})
        result = await prune_finished_runs(engine, now=NOW)
        assert result.skipped_locked and result.deleted == 0
        assert await remaining(engine) == set(ids)
        await other.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": RETENTION_LOCK_KEY})
        await other.commit()
    result = await prune_finished_runs(engine, now=NOW)
    assert result.deleted == 1
    assert await remaining(engine) == {ids[1]}
