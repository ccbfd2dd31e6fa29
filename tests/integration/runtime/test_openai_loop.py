"""The loop against a real local HTTP server speaking Chat Completions, through the openai SDK."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from agent_engine.db.platform import ITERATION_CAP, PLATFORM_PROMPT, TIMEZONE
from agent_engine.knowledge.postgres import put_document
from agent_engine.runtime.context import RunContext, load_run_context
from agent_engine.runtime.loop import Runtime
from agent_engine.runtime.tools.registry import CORE_TOOL_NAMES
from agent_engine.testing import (
    FakeOpenAIServer,
    FakeReply,
    FakeToolCall,
    error_reply,
    text_reply,
    tool_reply,
)
from tests.support.factories import Factories

NOW = datetime(2025, 3, 3, 9, 30, tzinfo=UTC)
KEY_ENV = "AE_TEST_FAKE_OPENAI_KEY"


async def _context(
    engine: AsyncEngine,
    factories: Factories,
    server: FakeOpenAIServer,
    *,
    prompt: str = "Summarise the VPN guidance.",
    timezone: str | None = "UTC",
    tools: dict[str, bool] | None = None,
) -> RunContext:
    owner = await factories.user(timezone=timezone)
    model = await factories.model(
        name="Fake GPT",
        provider="openai",
        model="gpt-fake",
        base_url=server.base_url,
        api_key_env=KEY_ENV,
    )
    agent = await factories.agent(user_id=owner["id"], model_id=model["id"], prompt=prompt)
    for name, allowed in (tools or {}).items():
        tool = await factories.tool(name, agents_allowed=allowed)
        async with engine.begin() as conn:
            await conn.execute(
                text("INSERT INTO agent_tools (agent_id, tool_id) VALUES (:a, :t)"),
                {"a": agent["id"], "t": tool["id"]},
            )
    run = await factories.run(agent_id=agent["id"], state="running", started_at=NOW)
    async with engine.connect() as conn:
        ctx = await load_run_context(conn, run["id"])
    assert ctx is not None
    return ctx


def _offered(request: dict[str, Any]) -> list[str]:
    return [tool["function"]["name"] for tool in request.get("tools", [])]


def _tool_messages(request: dict[str, Any]) -> list[str]:
    return [m["content"] for m in request["messages"] if m["role"] == "tool"]


async def test_multi_step_tool_conversation(
    engine: AsyncEngine,
    factories: Factories,
    fake_openai: FakeOpenAIServer,
    runtime: Runtime,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(KEY_ENV, "sk-test-123")
    await factories.setting(PLATFORM_PROMPT, "You work for ACME. Cite document ids.")
    async with engine.begin() as conn:
        doc = await put_document(
            conn,
            title="VPN guide",
            body="Connect with WireGuard. Rotate keys monthly.",
            public=True,
        )
    ctx = await _context(engine, factories, fake_openai)
    fake_openai.enqueue(
        tool_reply(
            FakeToolCall("search_knowledge", {"query": "VPN"}),
            content="Looking.",
            prompt_tokens=100,
            completion_tokens=20,
        ),
        tool_reply(
            FakeToolCall("read_document", {"document_id": doc}),
            prompt_tokens=200,
            completion_tokens=10,
        ),
        text_reply(
            f"Use WireGuard and rotate keys monthly [document {doc}].",
            prompt_tokens=300,
            completion_tokens=30,
        ),
    )
    spent: list[int] = []

    outcome = await runtime.execute(ctx, now=NOW, on_tokens=spent.append)

    assert outcome.state == "succeeded" and outcome.reason is None and outcome.error is None
    assert outcome.output == f"Use WireGuard and rotate keys monthly [document {doc}]."
    assert outcome.tokens_used == 660
    assert spent == [120, 330, 660]

    first, second, third = fake_openai.requests
    assert first["model"] == "gpt-fake"
    assert first["messages"][0] == {
        "role": "system",
        "content": "You work for ACME. Cite document ids.\n\nSummarise the VPN guidance.",
    }
    assert first["messages"][1]["role"] == "user"
    assert _offered(first) == list(CORE_TOOL_NAMES)
    assert fake_openai.request_headers[0]["authorization"] == "Bearer sk-test-123"
    search = json.loads(_tool_messages(second)[0])
    assert search["results"][0]["document_id"] == doc
    assistant = second["messages"][2]
    assert assistant["role"] == "assistant" and assistant["content"] == "Looking."
    assert assistant["tool_calls"][0]["function"]["name"] == "search_knowledge"
    assert second["messages"][3]["tool_call_id"] == assistant["tool_calls"][0]["id"]
    assert "Rotate keys monthly." in _tool_messages(third)[1]


async def test_iteration_cap_keeps_partial_output(
    engine: AsyncEngine, factories: Factories, fake_openai: FakeOpenAIServer, runtime: Runtime
) -> None:
    await factories.setting(ITERATION_CAP, 3)
    ctx = await _context(engine, factories, fake_openai)
    assert ctx.iteration_cap == 3
    fake_openai.script(
        lambda body: tool_reply(
            FakeToolCall("search_knowledge", {"query": "more"}),
            content=f"step {len(body['messages'])}",
        )
    )
    outcome = await runtime.execute(ctx, now=NOW)
    assert (outcome.state, outcome.reason) == ("failed", "iteration_cap")
    assert fake_openai.request_count == 3
    assert outcome.tokens_used == 45
    assert outcome.output == "step 2\n\nstep 4\n\nstep 6"
    assert outcome.error is not None and "3 model calls" in outcome.error


async def test_provider_500_ends_as_error_naming_the_model_not_the_endpoint(
    engine: AsyncEngine, factories: Factories, fake_openai: FakeOpenAIServer, runtime: Runtime
) -> None:
    ctx = await _context(engine, factories, fake_openai)
    fake_openai.enqueue(
        tool_reply(FakeToolCall("search_knowledge", {"query": "x"}), content="Searching first.")
    )
    fake_openai.script(lambda body: error_reply(500, "upstream exploded"))
    spent: list[int] = []
    outcome = await runtime.execute(ctx, now=NOW, on_tokens=spent.append)
    assert (outcome.state, outcome.reason) == ("failed", "error")
    assert outcome.error is not None
    assert outcome.error == "model 'Fake GPT' failed: the provider failed (HTTP 500)"
    assert outcome.output == "Searching first."
    assert outcome.tokens_used == 15 and spent == [15]
    assert fake_openai.request_count == 4  # one good call, then the SDK's two retries


async def test_provider_timeout_ends_as_error(
    engine: AsyncEngine, factories: Factories, fake_openai: FakeOpenAIServer
) -> None:
    ctx = await _context(engine, factories, fake_openai)
    fake_openai.script(lambda body: FakeReply(content="too late", delay_seconds=30))
    async with Runtime(engine, model_timeout_seconds=0.3) as runtime:
        outcome = await runtime.execute(ctx, now=NOW)
    assert (outcome.state, outcome.reason, outcome.tokens_used) == ("failed", "error", 0)
    assert outcome.error == "model 'Fake GPT' failed: timed out (no answer within 0.3 s)"


async def test_bad_tool_calls_go_back_to_the_model(
    engine: AsyncEngine, factories: Factories, fake_openai: FakeOpenAIServer, runtime: Runtime
) -> None:
    ctx = await _context(engine, factories, fake_openai)
    fake_openai.enqueue(
        tool_reply(
            FakeToolCall("launch_missiles", {"target": "moon"}),
            FakeToolCall("read_document", "{not json"),
            FakeToolCall("read_document", {"document_id": 99999}),
            FakeToolCall("search_knowledge", {"limit": 2}),
            FakeToolCall("calculator", {"expression": "1+1"}),  # not selected, not offered
        ),
        text_reply("Recovered."),
    )
    outcome = await runtime.execute(ctx, now=NOW)
    assert outcome.state == "succeeded" and outcome.output == "Recovered."
    results = _tool_messages(fake_openai.requests[1])
    assert results[0].startswith("error: unknown tool 'launch_missiles'")
    assert "read_document" in results[0]
    assert results[1].startswith("error: the arguments are not valid JSON")
    assert results[2] == "error: document 99999 not found"
    assert results[3] == "error: missing required argument 'query'"
    assert results[4].startswith("error: unknown tool 'calculator'")


async def test_outputs_and_tool_results_are_bounded(
    engine: AsyncEngine, factories: Factories, fake_openai: FakeOpenAIServer
) -> None:
    async with engine.begin() as conn:
        doc = await put_document(conn, title="Long", body="word " * 5000, public=True)
    ctx = await _context(engine, factories, fake_openai)
    fake_openai.enqueue(
        tool_reply(FakeToolCall("read_document", {"document_id": doc})),
        text_reply("answer " * 1000),
    )
    async with Runtime(engine, max_tool_result_chars=300, max_output_chars=120) as runtime:
        outcome = await runtime.execute(ctx, now=NOW)
    result = _tool_messages(fake_openai.requests[1])[0]
    assert len(result) == 300 and result.startswith(f"Document {doc}: Long")
    assert "truncated" in result
    assert outcome.output is not None and len(outcome.output) == 120


async def test_disallowed_and_deleted_tools_are_not_offered(
    engine: AsyncEngine, factories: Factories, fake_openai: FakeOpenAIServer, runtime: Runtime
) -> None:
    ctx = await _context(
        engine,
        factories,
        fake_openai,
        tools={"calculator": False, "current_time": True, "retired_plugin": True},
    )
    # Disallowed (calculator) and no-longer-registered (retired_plugin) tools are filtered.
    assert ctx.optional_tools == ("current_time",)
    fake_openai.enqueue(tool_reply(FakeToolCall("current_time", {})), text_reply("It is morning."))
    assert (await runtime.execute(ctx, now=NOW)).state == "succeeded"
    assert _offered(fake_openai.requests[0]) == [*CORE_TOOL_NAMES, "current_time"]
    assert _tool_messages(fake_openai.requests[1]) == [
        "2025-03-03T09:30:00+00:00 (Monday, time zone UTC)"
    ]

    async with engine.begin() as conn:  # the admin deletes the tool: the selection cascades
        await conn.execute(text("DELETE FROM tools WHERE name = 'current_time'"))
    async with engine.connect() as conn:
        degraded = await load_run_context(conn, ctx.run_id)
    assert degraded is not None and degraded.optional_tools == ()
    fake_openai.reset()
    fake_openai.enqueue(
        tool_reply(FakeToolCall("search_knowledge", {"query": "time"})), text_reply("Fine.")
    )
    outcome = await runtime.execute(degraded, now=NOW)
    assert outcome.state == "succeeded" and outcome.output == "Fine."
    assert _offered(fake_openai.requests[0]) == list(CORE_TOOL_NAMES)


async def test_optional_tools_answer(
    engine: AsyncEngine, factories: Factories, fake_openai: FakeOpenAIServer, runtime: Runtime
) -> None:
    ctx = await _context(
        engine,
        factories,
        fake_openai,
        timezone="Asia/Tokyo",
        tools={"calculator": True, "current_time": True, "previous_output": True},
    )
    fake_openai.enqueue(
        tool_reply(FakeToolCall("previous_output", {})), text_reply("First digest.")
    )
    first = await runtime.execute(ctx, now=NOW)
    assert _tool_messages(fake_openai.requests[1]) == ["This agent has no earlier successful run."]
    async with engine.begin() as conn:
        await conn.execute(
            text(
                "UPDATE agent_runs SET state = 'succeeded', output = :o, finished_at = :t"
                " WHERE id = :id"
            ),
            {"o": first.output, "t": NOW, "id": ctx.run_id},
        )
    second_run = await factories.run(agent_id=ctx.agent_id, state="running")
    async with engine.connect() as conn:
        second = await load_run_context(conn, second_run["id"])
    assert second is not None
    fake_openai.reset()
    fake_openai.enqueue(
        tool_reply(
            FakeToolCall("previous_output", {}),
            FakeToolCall("current_time", {}),
            FakeToolCall("calculator", {"expression": "(17 * 3) / 4"}),
            FakeToolCall("calculator", {"expression": "__import__('os')"}),
        ),
        text_reply("Done."),
    )
    await runtime.execute(second, now=NOW)
    previous, clock, sum_, refused = _tool_messages(fake_openai.requests[1])
    assert previous.endswith("\n\nFirst digest.") and "2025-03-03T09:30:00+00:00" in previous
    assert clock == "2025-03-03T18:30:00+09:00 (Monday, time zone Asia/Tokyo)"
    assert sum_ == "12.75"
    assert refused.startswith("error: only the functions")


async def test_load_run_context(
    engine: AsyncEngine, factories: Factories, fake_openai: FakeOpenAIServer
) -> None:
    await factories.setting(TIMEZONE, "Europe/Berlin")
    await factories.setting(PLATFORM_PROMPT, "Platform layer.")
    ctx = await _context(engine, factories, fake_openai, timezone=None)
    assert ctx.owner_timezone == "Europe/Berlin"  # the organisation's zone as fallback
    assert ctx.platform_prompt == "Platform layer."
    assert ctx.iteration_cap == 8
    assert ctx.model.provider == "openai" and ctx.model.api_key_env == KEY_ENV
    async with engine.begin() as conn:
        assert await load_run_context(conn, 10_000_000) is None
        await conn.execute(
            text("UPDATE agents SET model_id = NULL WHERE id = :id"), {"id": ctx.agent_id}
        )
        assert await load_run_context(conn, ctx.run_id) is None


async def test_missing_key_uses_a_placeholder_and_clients_are_reused(
    engine: AsyncEngine,
    factories: Factories,
    fake_openai: FakeOpenAIServer,
    runtime: Runtime,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(KEY_ENV, raising=False)
    ctx = await _context(engine, factories, fake_openai)
    for _ in range(3):
        assert (await runtime.execute(ctx, now=NOW)).output == "ok"
    assert {h["authorization"] for h in fake_openai.request_headers} == {"Bearer not-needed"}
    monkeypatch.setenv(KEY_ENV, "rotated")
    await runtime.execute(ctx, now=NOW)
    assert fake_openai.request_headers[-1]["authorization"] == "Bearer rotated"
