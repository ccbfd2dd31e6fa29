"""Per-model concurrency: the limit is held by PostgreSQL, waiting runs stay queued and start
oldest first as slots free, without polling; the reaper neither re-sends nor fails them early.
Parked runs whose approval was decided wait for a slot too, ahead of the queued runs (the whole
round trip with a real worker: tests/integration/tool_sources/test_approval_slots.py)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from agent_engine.db.platform import WEEKLY_TOKEN_CAP
from agent_engine.domain.runs import RunState, RunTrigger
from agent_engine.runs import approvals, model_slots
from agent_engine.runs.claim import claim_run
from agent_engine.runs.reaper import reap_stale_runs
from agent_engine.runs.request import request_run
from agent_engine.runtime.loop import Runtime
from agent_engine.testing.fake_openai import FakeOpenAIServer, text_reply
from agent_engine.workers.broker import enqueue_execute
from agent_engine.workers.main import EngineWorker
from tests.integration.runs.support import (
    FakeAgent,
    eventually,
    execute_run,
    fetch,
    limited_model,
    run_row,
)
from tests.support.factories import Factories

BEAT = timedelta(seconds=0.2)


def now() -> datetime:
    return datetime.now(UTC)


async def request(engine: AsyncEngine, agent_id: int, enqueue: Any = enqueue_execute) -> int:
    row = await request_run(engine, agent_id, trigger=RunTrigger.MANUAL, now=now(), enqueue=enqueue)
    assert row.state == "queued"
    return row.id


async def test_a_model_limited_to_two_runs_two_at_a_time_oldest_first(
    engine: AsyncEngine,
    factories: Factories,
    fake_openai: FakeOpenAIServer,
    worker: EngineWorker,
) -> None:
    model_id = await limited_model(factories, fake_openai, 2)
    fake_openai.script(lambda _: text_reply("ok", delay_seconds=0.5))
    agents = [await factories.agent(model_id=model_id) for _ in range(7)]
    run_ids = [await request(engine, a["id"]) for a in agents[:6]]
    await eventually(lambda: _running(engine, model_id, 2), what="two runs side by side")
    # A later request must not overtake the four that are waiting.
    late = await request(engine, agents[6]["id"])
    run_ids.append(late)

    most_running = 0
    while True:  # sample the journal while the queue drains
        counts = await fetch(
            engine,
            "SELECT count(*) FILTER (WHERE state = 'running') AS running,"
            " count(*) FILTER (WHERE state IN ('queued', 'running')) AS unfinished"
            " FROM agent_runs WHERE model_id = :m",
            m=model_id,
        )
        most_running = max(most_running, counts[0]["running"])
        if counts[0]["unfinished"] == 0:
            break
        await asyncio.sleep(0.02)

    assert most_running == 2
    assert fake_openai.max_active_requests == 2
    rows = await fetch(
        engine,
        "SELECT id, state FROM agent_runs WHERE id = ANY(:ids) ORDER BY started_at, id",
        ids=run_ids,
    )
    assert {r["state"] for r in rows} == {"succeeded"}
    started = [r["id"] for r in rows]
    # Oldest first, two by two (the two of a wave claim in either order).
    waves = [set(started[i : i + 2]) for i in range(0, 7, 2)]
    assert waves == [set(run_ids[i : i + 2]) for i in range(0, 7, 2)]


async def test_a_run_over_the_limit_stays_queued_and_its_model_slot_is_handed_on(
    engine: AsyncEngine,
    runtime: Runtime,
    factories: Factories,
    fake_openai: FakeOpenAIServer,
) -> None:
    model_id = await limited_model(factories, fake_openai, 1)
    first = await factories.agent(model_id=model_id)
    second = await factories.agent(model_id=model_id)
    sent: list[int] = []
    a = await request(engine, first["id"], sent.append)
    b = await request(engine, second["id"], sent.append)
    fake_openai.hold()
    running_a = asyncio.create_task(
        execute_run(engine, runtime, a, heartbeat_interval=BEAT, enqueue=sent.append)
    )
    await eventually(lambda: _running(engine, model_id, 1), what="the first run to start")
    sent.clear()

    assert await execute_run(engine, runtime, b, enqueue=sent.append) is RunState.QUEUED
    assert (await run_row(engine, b))["state"] == "queued"
    assert sent == []  # nothing polls while the slot is taken

    fake_openai.release()
    assert await running_a is RunState.SUCCEEDED
    assert sent == [b]  # the finish handed its slot to the waiting run
    assert await execute_run(engine, runtime, b, heartbeat_interval=BEAT) is RunState.SUCCEEDED


async def test_a_run_skipped_at_its_claim_hands_on_the_slot_it_was_first_in_line_for(
    engine: AsyncEngine,
    runtime: Runtime,
    factories: Factories,
    fake_openai: FakeOpenAIServer,
) -> None:
    model_id = await limited_model(factories, fake_openai, 1)
    spender = await factories.user()
    spent = await factories.agent(user_id=spender["id"], model_id=model_id)
    other = await factories.agent(model_id=model_id)
    sent: list[int] = []
    older = await request(engine, spent["id"], sent.append)
    newer = await request(engine, other["id"], sent.append)
    # The older run's owner spends the week's budget before a worker claims it.
    await factories.setting(WEEKLY_TOKEN_CAP, 10)
    spent_elsewhere = await factories.agent(user_id=spender["id"])
    await factories.run(spent_elsewhere["id"], state="succeeded", tokens_used=10, finished_at=now())
    sent.clear()

    # The newer run's message comes first: the older one is ahead of it in line.
    assert await execute_run(engine, runtime, newer, enqueue=sent.append) is RunState.QUEUED
    assert await execute_run(engine, runtime, older, enqueue=sent.append) is RunState.SKIPPED

    assert sent == [newer]
    assert await execute_run(engine, runtime, newer, heartbeat_interval=BEAT) is RunState.SUCCEEDED


async def test_the_reaper_hands_free_slots_to_the_oldest_waiting_runs_and_lets_them_wait(
    engine: AsyncEngine, factories: Factories, fake_openai: FakeOpenAIServer
) -> None:
    model_id = await limited_model(factories, fake_openai, 2)
    busy_model = await limited_model(factories, fake_openai, 1)
    created = now() - timedelta(hours=2)

    async def run(model: int, **values: Any) -> int:
        agent = await factories.agent(model_id=model)
        return int((await factories.run(agent["id"], model_id=model, **values))["id"])

    # Two slots free, three runs waiting (a worker died before handing the slots on).
    waiting = [await run(model_id, state="queued", created_at=created) for _ in range(3)]
    # A full model: its waiting run is neither re-sent nor failed at QUEUED_FAIL_AFTER.
    await run(busy_model, state="running", started_at=now(), heartbeat_at=now())
    behind_busy = await run(busy_model, state="queued", created_at=created)
    sent: list[int] = []

    result = await reap_stale_runs(
        engine,
        now=now(),
        resend_after=timedelta(seconds=60),
        fail_after=timedelta(hours=1),
        slot_wait=timedelta(hours=24),
        enqueue=sent.append,
    )

    assert sorted(sent) == waiting[:2]
    assert result.failed_queued == []
    assert (await run_row(engine, behind_busy))["state"] == "queued"

    # Past the slot wait, a waiting run is failed as stale, saying why.
    result = await reap_stale_runs(
        engine, now=now(), slot_wait=timedelta(hours=1), enqueue=lambda _: None
    )
    assert behind_busy in result.failed_queued
    row = await run_row(engine, behind_busy)
    assert (row["state"], row["reason"]) == ("failed", "stale")
    assert "slot of its model" in row["error"]


async def test_a_decided_parked_run_gets_the_next_slot_before_the_queued_runs(
    engine: AsyncEngine, factories: Factories, fake_openai: FakeOpenAIServer
) -> None:
    model_id = await limited_model(factories, fake_openai, 1)
    long_ago = now() - timedelta(hours=2)
    # A parked run (it holds no slot) whose owner approved its call two minutes ago; its message
    # is lost or was dropped while the slot was taken. A run queued before the decision.
    parked_agent = await factories.agent(model_id=model_id)
    parked = await factories.run(
        parked_agent["id"],
        model_id=model_id,
        state="running",
        started_at=long_ago,
        heartbeat_at=long_ago,
        parked_at=long_ago,
    )
    await factories.approval(
        parked, status="approved", decided_at=now() - timedelta(minutes=2), checkpoint={}
    )
    queued_agent = await factories.agent(model_id=model_id)
    queued = int(
        (await factories.run(queued_agent["id"], model_id=model_id, created_at=long_ago))["id"]
    )
    sent: list[int] = []

    # The slot is free, but the resume is ahead: the queued run's own message starts nothing.
    claim = await claim_run(engine, queued, now=now(), enqueue=sent.append)
    assert claim.state is RunState.QUEUED
    assert (await run_row(engine, queued))["state"] == "queued"

    # Whoever hands the slot on sends the resume, not the queued run.
    assert await model_slots.hand_on_slots(engine, model_id, enqueue=sent.append) == [parked["id"]]
    # So does the reaper's pass; the approvals sweep leaves a limited model's runs to that pass
    # (it would re-send them every tick, slot or none).
    reaped: list[int] = []
    await reap_stale_runs(engine, now=now(), enqueue=reaped.append)
    assert reaped == [parked["id"]]
    swept: list[int] = []
    assert await approvals.sweep(engine, enqueue=swept.append, resend_after_seconds=60) == 0
    # A lifted limit sends both, the resume first.
    woken = await model_slots.wake_after_limit_change(
        engine, model_id, limit=None, enqueue=lambda _: None
    )
    assert woken == [parked["id"], queued]


async def test_a_run_whose_owner_switched_models_while_queued_counts_for_the_new_model(
    engine: AsyncEngine,
    runtime: Runtime,
    factories: Factories,
    fake_openai: FakeOpenAIServer,
    fake_agent: FakeAgent,
) -> None:
    limited = await limited_model(factories, fake_openai, 1)
    agent = await fake_agent()
    run_id = await request(engine, agent["id"], lambda _: None)
    async with engine.begin() as conn:
        await conn.execute(
            text("UPDATE agents SET model_id = :m WHERE id = :a"), {"m": limited, "a": agent["id"]}
        )

    assert await execute_run(engine, runtime, run_id, heartbeat_interval=BEAT) is (
        RunState.SUCCEEDED
    )
    assert (await run_row(engine, run_id))["model_id"] == limited


async def _running(engine: AsyncEngine, model_id: int, count: int) -> bool:
    rows = await fetch(
        engine,
        "SELECT count(*) AS n FROM agent_runs WHERE model_id = :m AND state = 'running'",
        m=model_id,
    )
    return bool(rows[0]["n"] == count)
