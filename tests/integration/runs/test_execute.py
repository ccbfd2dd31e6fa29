"""Executing a run: claim, heartbeat, runtime, finish — and what duplicates and late writes do."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from agent_engine.db.platform import WEEKLY_TOKEN_CAP
from agent_engine.domain.runs import RunState, RunTrigger
from agent_engine.runs.execute import INTERRUPTED_ERROR
from agent_engine.runs.reaper import reap_stale_runs
from agent_engine.runs.request import request_run
from agent_engine.runtime.loop import Runtime
from agent_engine.testing.fake_openai import (
    FakeOpenAIServer,
    FakeToolCall,
    error_reply,
    text_reply,
    tool_reply,
)
from tests.integration.runs.support import FakeAgent, eventually, execute_run, run_row
from tests.support.factories import Factories

BEAT = timedelta(seconds=0.1)


def now() -> datetime:
    return datetime.now(UTC)


async def queued_run(engine: AsyncEngine, agent_id: int) -> int:
    row = await request_run(
        engine, agent_id, trigger=RunTrigger.MANUAL, now=now(), enqueue=lambda _: None
    )
    assert row.state == "queued"
    return row.id


async def test_queued_run_succeeds_with_output_and_tokens(
    engine: AsyncEngine, runtime: Runtime, fake_openai: FakeOpenAIServer, fake_agent: FakeAgent
) -> None:
    agent = await fake_agent()
    run_id = await queued_run(engine, agent["id"])
    fake_openai.enqueue(text_reply("All quiet.", prompt_tokens=30, completion_tokens=12))

    state = await execute_run(engine, runtime, run_id, heartbeat_interval=BEAT)

    row = await run_row(engine, run_id)
    assert state is RunState.SUCCEEDED
    assert (row["state"], row["reason"], row["output"]) == ("succeeded", None, "All quiet.")
    assert row["tokens_used"] == 42
    assert row["started_at"] is not None
    assert row["finished_at"] >= row["started_at"]
    assert fake_openai.request_count == 1


async def test_duplicate_messages_execute_once(
    engine: AsyncEngine, runtime: Runtime, fake_openai: FakeOpenAIServer, fake_agent: FakeAgent
) -> None:
    agent = await fake_agent()
    run_id = await queued_run(engine, agent["id"])

    results = await asyncio.gather(
        *(execute_run(engine, runtime, run_id, heartbeat_interval=BEAT) for _ in range(3))
    )
    again = await execute_run(engine, runtime, run_id, heartbeat_interval=BEAT)

    assert sorted(results, key=str) == sorted([RunState.SUCCEEDED, None, None], key=str)
    assert again is None
    assert fake_openai.request_count == 1
    assert (await run_row(engine, run_id))["state"] == "succeeded"


async def test_budget_spent_by_claim_time_skips(
    engine: AsyncEngine,
    runtime: Runtime,
    factories: Factories,
    fake_openai: FakeOpenAIServer,
    fake_agent: FakeAgent,
) -> None:
    agent = await fake_agent()
    sibling = await fake_agent(user_id=agent["user_id"])
    await factories.setting(WEEKLY_TOKEN_CAP, 50)
    run_id = await queued_run(engine, agent["id"])
    await factories.run(sibling["id"], state="succeeded", tokens_used=50, finished_at=now())

    state = await execute_run(engine, runtime, run_id, heartbeat_interval=BEAT)

    row = await run_row(engine, run_id)
    assert state is RunState.SKIPPED
    assert (row["state"], row["reason"], row["tokens_used"]) == ("skipped", "budget_exceeded", 0)
    assert row["started_at"] is None
    assert row["finished_at"] is not None
    assert fake_openai.request_count == 0


async def test_gate_closed_since_the_request_fails_naming_the_lock(
    engine: AsyncEngine, runtime: Runtime, fake_openai: FakeOpenAIServer, fake_agent: FakeAgent
) -> None:
    agent = await fake_agent()
    run_id = await queued_run(engine, agent["id"])
    async with engine.begin() as conn:
        await conn.execute(
            text("UPDATE agents SET admin_paused = true WHERE id = :a"), {"a": agent["id"]}
        )

    state = await execute_run(engine, runtime, run_id, heartbeat_interval=BEAT)

    row = await run_row(engine, run_id)
    assert state is RunState.FAILED
    assert (row["state"], row["reason"]) == ("failed", "error")
    assert "ADMIN_PAUSED" in row["error"]
    assert fake_openai.request_count == 0


async def test_heartbeat_records_liveness_and_tokens_so_far(
    engine: AsyncEngine, runtime: Runtime, fake_openai: FakeOpenAIServer, fake_agent: FakeAgent
) -> None:
    agent = await fake_agent()
    run_id = await queued_run(engine, agent["id"])
    fake_openai.enqueue(
        tool_reply(FakeToolCall("search_knowledge", {"query": "vpn"}), prompt_tokens=20),
        # Long enough that the beat is seen while the run is still running, even under load.
        text_reply("Done.", delay_seconds=3.0),
    )
    execution = asyncio.create_task(execute_run(engine, runtime, run_id, heartbeat_interval=BEAT))

    async def beat_with_tokens() -> dict[str, object] | None:
        row = await run_row(engine, run_id)
        beating = row["heartbeat_at"] and row["heartbeat_at"] > row["started_at"]
        return row if beating and row["tokens_used"] == 25 else None

    during = await eventually(beat_with_tokens, within=10, what="a heartbeat with tokens")
    await execution

    assert during["state"] == "running"
    row = await run_row(engine, run_id)
    assert (row["state"], row["output"], row["tokens_used"]) == ("succeeded", "Done.", 40)


async def test_late_finish_after_the_reaper_changes_nothing(
    engine: AsyncEngine, runtime: Runtime, fake_openai: FakeOpenAIServer, fake_agent: FakeAgent
) -> None:
    agent = await fake_agent()
    run_id = await queued_run(engine, agent["id"])
    fake_openai.enqueue(text_reply("Too late.", delay_seconds=1.5))
    execution = asyncio.create_task(
        execute_run(engine, runtime, run_id, heartbeat_interval=timedelta(minutes=1))
    )
    await eventually(lambda: _state_is(engine, run_id, "running"), what="the run to start")

    # The worker looks silent for five minutes (its last beat is that old on the database clock).
    async with engine.begin() as conn:
        await conn.execute(
            text("UPDATE agent_runs SET heartbeat_at = now() - interval '5 minutes' WHERE id = :r"),
            {"r": run_id},
        )
    reaped = await reap_stale_runs(engine, now=now(), enqueue=lambda _: None)
    result = await asyncio.wait_for(execution, timeout=5)

    assert reaped.failed_running == [run_id]
    assert result is None
    row = await run_row(engine, run_id)
    assert (row["state"], row["reason"], row["output"]) == ("failed", "stale", None)


async def test_a_worker_whose_clock_is_behind_does_not_get_its_live_run_reaped(
    engine: AsyncEngine, runtime: Runtime, fake_openai: FakeOpenAIServer, fake_agent: FakeAgent
) -> None:
    agent = await fake_agent()
    run_id = await queued_run(engine, agent["id"])
    fake_openai.enqueue(text_reply("Still here.", delay_seconds=1.5))
    ten_minutes_behind = lambda: now() - timedelta(minutes=10)  # noqa: E731
    execution = asyncio.create_task(
        execute_run(engine, runtime, run_id, now_fn=ten_minutes_behind, heartbeat_interval=BEAT)
    )
    await eventually(lambda: _state_is(engine, run_id, "running"), what="the run to start")

    reaped: list[int] = []
    while not execution.done():  # a reaper with a short STALE_AFTER, again and again
        result = await reap_stale_runs(
            engine, now=now(), stale_after=timedelta(seconds=1), enqueue=lambda _: None
        )
        reaped += result.failed_running
        await asyncio.sleep(0.1)

    assert reaped == []
    assert await execution is RunState.SUCCEEDED
    row = await run_row(engine, run_id)
    assert (row["state"], row["output"]) == ("succeeded", "Still here.")


async def test_provider_error_fails_the_run(
    engine: AsyncEngine, runtime: Runtime, fake_openai: FakeOpenAIServer, fake_agent: FakeAgent
) -> None:
    agent = await fake_agent()
    run_id = await queued_run(engine, agent["id"])
    fake_openai.script(lambda _: error_reply(400, "model not found"))

    state = await execute_run(engine, runtime, run_id, heartbeat_interval=BEAT)

    row = await run_row(engine, run_id)
    assert state is RunState.FAILED
    assert (row["state"], row["reason"]) == ("failed", "error")
    # The provider's words are the admin's (the worker log); the owner reads model and kind.
    assert row["error"] == "model 'Fake' failed: the provider refused the request (HTTP 400)"


async def test_wall_clock_limit_fails_the_run(
    engine: AsyncEngine, runtime: Runtime, fake_openai: FakeOpenAIServer, fake_agent: FakeAgent
) -> None:
    agent = await fake_agent()
    run_id = await queued_run(engine, agent["id"])
    fake_openai.enqueue(text_reply("Slow.", delay_seconds=5))

    state = await execute_run(
        engine, runtime, run_id, heartbeat_interval=BEAT, run_timeout=timedelta(seconds=0.5)
    )

    row = await run_row(engine, run_id)
    assert state is RunState.FAILED
    assert (row["state"], row["reason"]) == ("failed", "error")
    assert "wall-clock" in row["error"]


async def test_interrupted_execution_journals_it_and_releases_the_agent(
    engine: AsyncEngine, runtime: Runtime, fake_openai: FakeOpenAIServer, fake_agent: FakeAgent
) -> None:
    agent = await fake_agent()
    run_id = await queued_run(engine, agent["id"])
    fake_openai.enqueue(text_reply("Never.", delay_seconds=5))
    execution = asyncio.create_task(execute_run(engine, runtime, run_id, heartbeat_interval=BEAT))
    await eventually(lambda: _state_is(engine, run_id, "running"), what="the run to start")

    execution.cancel()
    await asyncio.gather(execution, return_exceptions=True)

    row = await run_row(engine, run_id)
    assert (row["state"], row["reason"], row["error"]) == ("failed", "error", INTERRUPTED_ERROR)
    assert (await queued_run(engine, agent["id"])) > run_id


async def _state_is(engine: AsyncEngine, run_id: int, state: str) -> bool:
    return bool((await run_row(engine, run_id))["state"] == state)
