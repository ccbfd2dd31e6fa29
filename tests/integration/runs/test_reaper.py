"""The reaper: silent running runs fail stale, unclaimed queued runs are re-sent, then failed."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta

import dramatiq
import pytest
import redis
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from agent_engine.domain.runs import RunTrigger
from agent_engine.runs.reaper import reap_stale_runs
from agent_engine.runs.request import request_run
from agent_engine.settings import Settings
from agent_engine.workers.actors import RUNS_QUEUE
from agent_engine.workers.broker import enqueue_execute
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

    assert (blocked.state, blocked.reason) == ("skipped", "already_running")
    assert after.state == "queued"
    async with engine.connect() as conn:
        reaped = (
            await conn.execute(text("SELECT * FROM agent_runs WHERE id = :r"), {"r": stuck["id"]})
        ).one()
    assert reaped.finished_at >= NOW - timedelta(seconds=1)  # the database's now()
    assert reaped.tokens_used == 42  # spent before the worker died: still counts
    assert "heartbeat" in reaped.error


def _messages_for(redis_url: str, run_id: int) -> int:
    """Execute messages for `run_id` waiting in the broker (Valkey: the queue's message hash)."""
    client = redis.Redis.from_url(redis_url)
    try:
        bodies = client.hvals(f"dramatiq:{RUNS_QUEUE}.msgs")
    finally:
        client.close()
    return sum(1 for body in bodies if json.loads(body)["args"] == [run_id])


async def test_a_busy_queue_gets_a_re_send_per_back_off_window_not_one_per_tick(
    engine: AsyncEngine, factories: Factories, broker: dramatiq.Broker, settings: Settings
) -> None:
    """No worker consumes: every message stays queued, as on a queue too busy to keep up."""
    if (settings.broker_url or "").startswith("amqp"):
        pytest.skip("counts the messages in Valkey's queue; the RabbitMQ pass has none there")
    NOW = datetime.now(UTC)
    agent = await factories.agent()
    run = await request_run(
        engine, agent["id"], trigger=RunTrigger.MANUAL, now=NOW, enqueue=enqueue_execute
    )
    run_id = run.id

    async def tick(after: timedelta, reapers: int = 1) -> list[int]:
        results = await asyncio.gather(
            *(
                reap_stale_runs(
                    engine,
                    now=NOW + after,
                    resend_after=RESEND,
                    fail_after=timedelta(days=1),
                    enqueue=enqueue_execute,
                )
                for _ in range(reapers)
            )
        )
        return [r for result in results for r in result.resent]

    assert _messages_for(settings.redis_url or "", run_id) == 1
    # Within the first minute nothing is re-sent; then once, whatever the number of ticks and
    # reapers, until the run has waited as long again as it had at that send (61 → 122 → 244).
    seconds = (30, 61, 62, 75, 90, 121, 122, 150, 200, 243, 244, 300)
    resent = {s: await tick(timedelta(seconds=s), reapers=3) for s in seconds}
    assert {s: len(ids) for s, ids in resent.items() if ids} == {61: 1, 122: 1, 244: 1}
    assert _messages_for(settings.redis_url or "", run_id) == 4
    assert await state_of(engine, run_id) == ("queued", None)
