"""The reaper: silent running runs fail stale, unclaimed queued runs are re-sent, then failed."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from agent_engine.domain.runs import RunTrigger
from agent_engine.runs.reaper import reap_stale_runs
from agent_engine.runs.request import request_run
from tests.support.factories import Factories

STALE = timedelta(seconds=90)
RESEND = timedelta(seconds=60)
FAIL = timedelta(hours=1)


async def state_of(engine: AsyncEngine, run_id: int) -> tuple[str, str | None]:
    async with engine.connect() as conn:
        row = (
            await conn.execute(
                text("SELECT state, reason FROM agent_runs WHERE id = :r"), {"r": run_id}
            )
        ).one()
    return row.state, row.reason


async def test_reaper_sorts_unfinished_runs_by_silence_and_age(
    engine: AsyncEngine, factories: Factories
) -> None:
    # Silence is measured on the database's clock: this machine's (tests share it).
    NOW = datetime.now(UTC)

    async def run(**values: object) -> int:
        agent = await factories.agent()
        return int((await factories.run(agent["id"], **values))["id"])

    silent = await run(
        state="running",
        started_at=NOW - timedelta(minutes=5),
        heartbeat_at=NOW - timedelta(seconds=91),
    )
    beating = await run(
        state="running",
        started_at=NOW - timedelta(minutes=5),
        heartbeat_at=NOW - timedelta(seconds=30),
    )
    fresh_queued = await run(state="queued", created_at=NOW - timedelta(seconds=10))
    lost_queued = await run(state="queued", created_at=NOW - timedelta(minutes=2))
    ancient_queued = await run(state="queued", created_at=NOW - timedelta(hours=2))
    sent: list[int] = []

    result = await reap_stale_runs(
        engine,
        now=NOW,
        stale_after=STALE,
        resend_after=RESEND,
        fail_after=FAIL,
        enqueue=sent.append,
    )

    assert result.failed_running == [silent]
    assert result.failed_queued == [ancient_queued]
    assert result.resent == [lost_queued]
    assert sent == [lost_queued]
    assert await state_of(engine, silent) == ("failed", "stale")
    assert await state_of(engine, ancient_queued) == ("failed", "stale")
    for untouched, state in (
        (beating, "running"),
        (fresh_queued, "queued"),
        (lost_queued, "queued"),
    ):
        assert await state_of(engine, untouched) == (state, None)


async def test_reaped_run_releases_the_agent(engine: AsyncEngine, factories: Factories) -> None:
    NOW = datetime.now(UTC)
    agent = await factories.agent()
    stuck = await factories.run(
        agent["id"],
        state="running",
        started_at=NOW - timedelta(minutes=10),
        tokens_used=42,
        heartbeat_at=NOW - timedelta(minutes=9),
    )
    blocked = await request_run(
        engine, agent["id"], trigger=RunTrigger.MANUAL, now=NOW, enqueue=lambda _: None
    )

    await reap_stale_runs(engine, now=NOW, stale_after=STALE, enqueue=lambda _: None)
    after = await request_run(
        engine, agent["id"], trigger=RunTrigger.MANUAL, now=NOW, enqueue=lambda _: None
    )

    assert (blocked["state"], blocked["reason"]) == ("skipped", "already_running")
    assert after["state"] == "queued"
    async with engine.connect() as conn:
        reaped = (
            await conn.execute(text("SELECT * FROM agent_runs WHERE id = :r"), {"r": stuck["id"]})
        ).one()
    assert reaped.finished_at >= NOW - timedelta(seconds=1)  # the database's now()
    assert reaped.tokens_used == 42  # spent before the worker died: still counts
    assert "heartbeat" in reaped.error
