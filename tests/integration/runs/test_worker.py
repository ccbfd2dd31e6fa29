"""The actors on a real Dramatiq worker (threads in this process) over real Valkey."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta

import dramatiq
from sqlalchemy.ext.asyncio import AsyncEngine

from agent_engine.domain.runs import RunTrigger
from agent_engine.runs.request import SEND_BATCH, request_run
from agent_engine.settings import Settings
from agent_engine.testing.fake_openai import FakeOpenAIServer, text_reply
from agent_engine.workers.broker import enqueue_execute, send_reap_tick, send_schedule_tick
from agent_engine.workers.main import EngineWorker, start_worker, stop_worker
from tests.integration.runs.support import (
    FakeAgent,
    eventually,
    fetch,
    messages_settled,
    run_row,
    runs_in_flight,
)


def now() -> datetime:
    return datetime.now(UTC)


async def test_scheduled_agent_runs_to_success_and_its_slot_advances(
    engine: AsyncEngine,
    fake_openai: FakeOpenAIServer,
    fake_agent: FakeAgent,
    worker: EngineWorker,
) -> None:
    fired = now() - timedelta(seconds=1)
    agent = await fake_agent(schedule={"type": "interval", "every_hours": 1}, next_run_at=fired)
    fake_openai.enqueue(text_reply("Three new documents about the VPN."))

    send_schedule_tick()

    async def succeeded() -> list[dict[str, object]]:
        runs = await fetch(engine, "SELECT * FROM agent_runs WHERE agent_id = :a", a=agent["id"])
        return runs if runs and runs[0]["state"] == "succeeded" else []

    (run,) = await eventually(succeeded, what="the scheduled run to succeed")
    assert run["trigger"] == "scheduled"
    assert run["output"] == "Three new documents about the VPN."
    assert run["tokens_used"] == 15
    (stored,) = await fetch(engine, "SELECT next_run_at FROM agents WHERE id = :a", a=agent["id"])
    assert stored["next_run_at"] == fired + timedelta(hours=1)


async def test_a_tick_of_many_due_agents_sends_their_messages_in_batches_each_run_once(
    engine: AsyncEngine,
    broker: dramatiq.Broker,
    fake_openai: FakeOpenAIServer,
    fake_agent: FakeAgent,
    worker: EngineWorker,
) -> None:
    fired = now() - timedelta(seconds=1)
    agents = [
        await fake_agent(schedule={"type": "interval", "every_hours": 1}, next_run_at=fired)
        for _ in range(2 * SEND_BATCH + 7)  # three pipelines, the last one short
    ]
    ids = [agent["id"] for agent in agents]

    send_schedule_tick()

    async def all_succeeded() -> list[dict[str, object]]:
        runs = await fetch(
            engine,
            "SELECT agent_id, state FROM agent_runs WHERE agent_id = ANY(:ids)",
            ids=ids,
        )
        done = [r for r in runs if r["state"] == "succeeded"]
        return runs if len(done) == len(ids) else []

    runs = await eventually(all_succeeded, within=120, what="every scheduled run to succeed")
    await messages_settled(broker, worker)
    assert sorted(r["agent_id"] for r in runs) == sorted(ids)  # one run each
    assert fake_openai.request_count == len(ids)  # each executed once


async def test_the_same_message_delivered_twice_executes_once(
    engine: AsyncEngine,
    broker: dramatiq.Broker,
    fake_openai: FakeOpenAIServer,
    fake_agent: FakeAgent,
    worker: EngineWorker,
) -> None:
    agent = await fake_agent()
    fake_openai.enqueue(text_reply("Once.", delay_seconds=0.3))
    row = await request_run(
        engine, agent["id"], trigger=RunTrigger.MANUAL, now=now(), enqueue=enqueue_execute
    )
    enqueue_execute(row.id)
    enqueue_execute(row.id)

    await eventually(lambda: _state_is(engine, row.id, "succeeded"), what="the run to succeed")
    # Both messages acknowledged: the second one's claim was tried and, had it wrongly won, its
    # run would be in flight or have called the model by now.
    await messages_settled(broker, worker)
    assert runs_in_flight() == 0
    assert fake_openai.request_count == 1
    assert (await run_row(engine, row.id))["output"] == "Once."


async def test_a_lost_message_is_resent_by_the_reaper(
    engine: AsyncEngine,
    settings: Settings,
    fake_openai: FakeOpenAIServer,
    fake_agent: FakeAgent,
    broker: dramatiq.Broker,
) -> None:
    agent = await fake_agent()
    row = await request_run(
        engine, agent["id"], trigger=RunTrigger.MANUAL, now=now(), enqueue=enqueue_execute
    )
    broker.flush_all()  # Redis lost the message before any worker took it
    started = start_worker(settings, threads=2)
    try:
        await messages_settled(broker, started)  # nothing to take: the message is gone
        assert (await run_row(engine, row.id))["state"] == "queued"
        ticks = itertools.count()

        async def resent_and_done() -> bool:
            if next(ticks) % 10 == 0:
                send_reap_tick()  # what the clock does every reap_tick_seconds
            return await _state_is(engine, row.id, "succeeded")

        await eventually(resent_and_done, within=15, what="the re-sent run to succeed")
    finally:
        stop_worker(started, grace_seconds=5)
    assert fake_openai.request_count == 1


async def _state_is(engine: AsyncEngine, run_id: int, state: str) -> bool:
    return bool((await run_row(engine, run_id))["state"] == state)
