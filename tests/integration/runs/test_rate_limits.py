"""A provider's rate limits and refusals, as the run journal shows them.

`429`/`503` are waited out (Retry-After, else backoff) within the run's wall clock while the run
keeps beating; only answered calls count tokens. `400`/`401`/`404` fail the run at once.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from agent_engine.domain.runs import RunState, RunTrigger
from agent_engine.runs.request import request_run
from agent_engine.runtime.loop import Runtime
from agent_engine.testing.fake_openai import FakeOpenAIServer, error_reply, text_reply
from tests.integration.runs.support import FakeAgent, eventually, execute_run, run_row

BEAT = timedelta(seconds=0.2)


async def queued_run(engine: AsyncEngine, agent_id: int) -> int:
    row = await request_run(
        engine, agent_id, trigger=RunTrigger.MANUAL, now=datetime.now(UTC), enqueue=lambda _: None
    )
    return row.id


async def test_429_five_times_with_retry_after_then_an_answer_succeeds_with_its_tokens_only(
    engine: AsyncEngine, runtime: Runtime, fake_openai: FakeOpenAIServer, fake_agent: FakeAgent
) -> None:
    agent = await fake_agent()
    run_id = await queued_run(engine, agent["id"])
    limited = error_reply(429, "Rate limit reached", retry_after="1", retry_after_ms=None)
    fake_openai.enqueue(*[limited] * 5)
    fake_openai.enqueue(text_reply("Made it.", prompt_tokens=30, completion_tokens=12))
    execution = asyncio.create_task(execute_run(engine, runtime, run_id, heartbeat_interval=BEAT))

    async def beating_while_limited() -> dict[str, object] | None:
        row = await run_row(engine, run_id)
        waiting = 2 <= fake_openai.request_count <= 5
        beaten = row["heartbeat_at"] and row["heartbeat_at"] > row["started_at"] + BEAT
        return row if waiting and beaten else None

    during = await eventually(beating_while_limited, what="heartbeats while rate-limited")
    state = await asyncio.wait_for(execution, timeout=30)

    assert during["state"] == "running"
    assert during["tokens_used"] == 0  # refused calls count nothing
    assert state is RunState.SUCCEEDED
    row = await run_row(engine, run_id)
    assert (row["state"], row["output"], row["tokens_used"]) == ("succeeded", "Made it.", 42)
    assert fake_openai.request_count == 6


async def test_503_without_retry_after_is_retried_with_backoff(
    engine: AsyncEngine, runtime: Runtime, fake_openai: FakeOpenAIServer, fake_agent: FakeAgent
) -> None:
    agent = await fake_agent()
    run_id = await queued_run(engine, agent["id"])
    overloaded = error_reply(503, "The engine is currently overloaded", retry_after_ms=None)
    fake_openai.enqueue(overloaded, overloaded, overloaded, text_reply("Eventually."))

    state = await execute_run(engine, runtime, run_id, heartbeat_interval=BEAT)

    assert state is RunState.SUCCEEDED
    assert (await run_row(engine, run_id))["output"] == "Eventually."
    assert fake_openai.request_count == 4


async def test_a_rate_limit_longer_than_the_wall_clock_fails_at_once_saying_so(
    engine: AsyncEngine, runtime: Runtime, fake_openai: FakeOpenAIServer, fake_agent: FakeAgent
) -> None:
    agent = await fake_agent()
    run_id = await queued_run(engine, agent["id"])
    fake_openai.script(
        lambda _: error_reply(429, "Try again in an hour", retry_after="3600", retry_after_ms=None)
    )

    state = await execute_run(
        engine, runtime, run_id, heartbeat_interval=BEAT, run_timeout=timedelta(seconds=30)
    )

    row = await run_row(engine, run_id)
    assert state is RunState.FAILED
    assert (row["state"], row["reason"]) == ("failed", "error")
    assert row["error"].startswith(
        "model 'Fake' failed: rate limited by the provider (HTTP 429); gave up after 1 attempts"
    )
    assert "wall-clock limit" in row["error"]
    assert fake_openai.request_count == 1


@pytest.mark.parametrize(
    ("status", "message"),
    [
        (400, "Invalid value for 'messages'"),
        (401, "Incorrect API key provided"),
        (404, "The model 'gpt-9' does not exist"),
    ],
)
async def test_a_refusal_fails_the_run_at_once_with_the_providers_message_in_the_log(
    engine: AsyncEngine,
    runtime: Runtime,
    fake_openai: FakeOpenAIServer,
    fake_agent: FakeAgent,
    status: int,
    message: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    agent = await fake_agent()
    run_id = await queued_run(engine, agent["id"])
    fake_openai.script(lambda _: error_reply(status, message))

    with caplog.at_level(logging.WARNING, logger="agent_engine.runtime.providers"):
        state = await execute_run(engine, runtime, run_id, heartbeat_interval=BEAT)

    row = await run_row(engine, run_id)
    assert state is RunState.FAILED
    assert (row["reason"], row["tokens_used"]) == ("error", 0)
    # The owner reads the model and the kind; the provider's words are the admin's (the log).
    assert row["error"].startswith("model 'Fake' failed: ") and f"HTTP {status}" in row["error"]
    assert message not in row["error"]
    logged = [r.getMessage() for r in caplog.records]
    assert any(message in line and fake_openai.base_url in line for line in logged), logged
    assert fake_openai.request_count == 1


async def test_a_model_that_never_answers_is_bounded_by_the_wall_clock(
    engine: AsyncEngine, runtime: Runtime, fake_openai: FakeOpenAIServer, fake_agent: FakeAgent
) -> None:
    agent = await fake_agent()
    run_id = await queued_run(engine, agent["id"])
    fake_openai.hold()

    state = await execute_run(
        engine, runtime, run_id, heartbeat_interval=BEAT, run_timeout=timedelta(seconds=1)
    )

    row = await run_row(engine, run_id)
    assert state is RunState.FAILED
    assert "wall-clock limit of 1 s" in row["error"]
    fake_openai.release()
