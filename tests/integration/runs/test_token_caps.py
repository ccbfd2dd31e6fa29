"""An owner's caps on one agent's tokens: per budget week (the start gate journals SKIPPED /
AGENT_BUDGET_EXCEEDED once the agent's own week reaches it, after the owner's cap) and per run
(the run stops FAILED / TOKEN_CAP after the model call that passed it)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from agent_engine.db.platform import TIMEZONE, WEEKLY_TOKEN_CAP
from agent_engine.domain.runs import RunState, RunTrigger
from agent_engine.runs.claim import claim_run
from agent_engine.runs.request import request_run
from agent_engine.runs.scheduler import schedule_due_agents
from agent_engine.runtime.loop import Runtime
from agent_engine.testing.fake_openai import FakeOpenAIServer, FakeToolCall, text_reply, tool_reply
from tests.integration.runs.support import FakeAgent, execute_run, fetch, run_row
from tests.support.factories import Factories

# A Wednesday: the budget week (Sunday 00:00 in the organisation zone) started three days ago.
NOW = datetime(2025, 3, 12, 10, 0, tzinfo=UTC)


async def _start(engine: AsyncEngine, agent_id: int, *, now: datetime = NOW) -> tuple[str, str]:
    row = await request_run(
        engine, agent_id, trigger=RunTrigger.MANUAL, now=now, enqueue=lambda _: None
    )
    return row.state, row.reason or ""


@pytest.mark.parametrize(
    ("spent", "expected"),
    [
        (99, ("queued", "")),
        (100, ("skipped", "agent_budget_exceeded")),
        (150, ("skipped", "agent_budget_exceeded")),
    ],
    ids=["under", "at", "over"],
)
async def test_the_gate_with_an_agent_cap_under_at_and_over(
    engine: AsyncEngine, factories: Factories, spent: int, expected: tuple[str, str]
) -> None:
    owner = await factories.user()
    capped = await factories.agent(user_id=owner["id"], weekly_token_cap=100)
    sibling = await factories.agent(user_id=owner["id"])
    await factories.run(
        capped["id"], state="succeeded", tokens_used=spent, finished_at=NOW - timedelta(days=1)
    )
    # The owner's other agents do not count against this agent's cap.
    await factories.run(
        sibling["id"], state="succeeded", tokens_used=10_000, finished_at=NOW - timedelta(days=1)
    )

    assert await _start(engine, capped["id"]) == expected
    assert await _start(engine, sibling["id"]) == ("queued", "")


async def test_the_owners_cap_is_named_first_and_last_week_does_not_count(
    engine: AsyncEngine, factories: Factories
) -> None:
    owner = await factories.user()
    agent = await factories.agent(user_id=owner["id"], weekly_token_cap=100)
    await factories.run(
        agent["id"], state="succeeded", tokens_used=500, finished_at=NOW - timedelta(days=1)
    )
    await factories.setting(WEEKLY_TOKEN_CAP, 400)

    assert await _start(engine, agent["id"]) == ("skipped", "budget_exceeded")
    await factories.setting(WEEKLY_TOKEN_CAP, None)
    assert await _start(engine, agent["id"]) == ("skipped", "agent_budget_exceeded")
    assert await _start(engine, agent["id"], now=NOW + timedelta(days=7)) == ("queued", "")


async def test_the_week_boundary_is_the_organisations(
    engine: AsyncEngine, factories: Factories
) -> None:
    owner = await factories.user(timezone="Asia/Tokyo")  # the owner's zone does not matter
    agent = await factories.agent(user_id=owner["id"], weekly_token_cap=100)
    await factories.setting(TIMEZONE, "America/New_York")
    # Sunday 2025-03-09 03:30 UTC is still Saturday evening in New York: last week there.
    await factories.run(
        agent["id"],
        state="succeeded",
        tokens_used=100,
        finished_at=datetime(2025, 3, 9, 3, 30, tzinfo=UTC),
    )
    assert await _start(engine, agent["id"]) == ("queued", "")
    await factories.run(
        agent["id"],
        state="succeeded",
        tokens_used=100,
        finished_at=datetime(2025, 3, 9, 6, 0, tzinfo=UTC),  # Sunday 01:00 in New York
    )
    assert await _start(engine, agent["id"]) == ("skipped", "agent_budget_exceeded")


async def test_a_claim_and_a_scheduled_start_check_the_agent_cap_too(
    engine: AsyncEngine, factories: Factories
) -> None:
    agent = await factories.agent(weekly_token_cap=50)
    queued = await request_run(
        engine, agent["id"], trigger=RunTrigger.MANUAL, now=NOW, enqueue=lambda _: None
    )
    assert queued.state == "queued"
    # Spent meanwhile (say by the run just before it finishing).
    await factories.run(
        agent["id"], state="succeeded", tokens_used=60, finished_at=NOW - timedelta(minutes=1)
    )

    claim = await claim_run(engine, queued.id, now=NOW)

    assert claim.state is RunState.SKIPPED
    row = await run_row(engine, queued.id)
    assert (row["state"], row["reason"]) == ("skipped", "agent_budget_exceeded")

    scheduled = await factories.agent(
        weekly_token_cap=50,
        schedule={"type": "interval", "every_hours": 1},
        next_run_at=NOW - timedelta(minutes=1),
    )
    await factories.run(
        scheduled["id"], state="succeeded", tokens_used=50, finished_at=NOW - timedelta(hours=2)
    )
    await schedule_due_agents(engine, now=NOW, enqueue=lambda _: None)
    [fired] = await fetch(
        engine,
        "SELECT state, reason, trigger FROM agent_runs WHERE agent_id = :a AND trigger ="
        " 'scheduled'",
        a=scheduled["id"],
    )
    assert fired == {"state": "skipped", "reason": "agent_budget_exceeded", "trigger": "scheduled"}


async def test_a_run_passing_max_tokens_per_run_stops_after_that_call_keeping_its_transcript(
    engine: AsyncEngine, runtime: Runtime, fake_openai: FakeOpenAIServer, fake_agent: FakeAgent
) -> None:
    agent = await fake_agent(max_tokens_per_run=250)
    fake_openai.enqueue(
        tool_reply(
            FakeToolCall("search_knowledge", {"query": "vpn"}),
            prompt_tokens=100,
            completion_tokens=20,
        ),
        tool_reply(
            FakeToolCall("search_knowledge", {"query": "vpn"}),
            content="Looking further.",
            prompt_tokens=120,
            completion_tokens=20,
        ),
        text_reply("never asked"),
    )
    queued = await request_run(
        engine,
        agent["id"],
        trigger=RunTrigger.MANUAL,
        now=datetime.now(UTC),
        enqueue=lambda _: None,
    )

    state = await execute_run(engine, runtime, queued.id)

    row = await run_row(engine, queued.id)
    assert state is RunState.FAILED
    assert (row["state"], row["reason"]) == ("failed", "token_cap")
    assert row["tokens_used"] == 260
    assert "250" in row["error"] and "maxTokensPerRun" in row["error"]
    assert row["output"] == "Looking further."
    assert fake_openai.request_count == 2  # stopped after the call that passed the cap
    steps = await fetch(
        engine,
        "SELECT kind, prompt_tokens FROM agent_run_steps WHERE run_id = :r ORDER BY index",
        r=queued.id,
    )
    assert steps == [
        {"kind": "model_call", "prompt_tokens": 100},
        {"kind": "tool_call", "prompt_tokens": None},
        {"kind": "model_call", "prompt_tokens": 120},
    ]
