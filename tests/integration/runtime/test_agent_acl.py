"""Owner A's agent never sees owner B's private document, whatever the model asks for."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from sqlalchemy.ext.asyncio import AsyncEngine

from agent_engine.knowledge.postgres import put_document
from agent_engine.runtime.context import load_run_context
from agent_engine.runtime.loop import Runtime
from agent_engine.testing import FakeOpenAIServer, FakeToolCall, text_reply, tool_reply
from tests.support.factories import Factories

NOW = datetime(2025, 3, 3, 9, 30, tzinfo=UTC)


async def test_agent_reads_as_its_owner(
    engine: AsyncEngine, factories: Factories, fake_openai: FakeOpenAIServer, runtime: Runtime
) -> None:
    alice = (await factories.user())["id"]
    bob = (await factories.user())["id"]
    async with engine.begin() as conn:
        secret = await put_document(
            conn, title="Payroll export", body="Salaries: BLUEFIN-7 table.", grant_to=[bob]
        )
        public = await put_document(
            conn,
            title="Payroll FAQ",
            body="Payroll runs monthly.",
            public=True,
            links_to=[secret],
        )
    model = await factories.model(provider="openai", model="m", base_url=fake_openai.base_url)
    agent = await factories.agent(user_id=alice, model_id=model["id"])
    run = await factories.run(agent_id=agent["id"], state="running")
    async with engine.connect() as conn:
        ctx = await load_run_context(conn, run["id"])
    assert ctx is not None
    fake_openai.enqueue(
        tool_reply(
            FakeToolCall("search_knowledge", {"query": "payroll salaries export", "limit": 20}),
            FakeToolCall("read_document", {"document_id": secret}),
            FakeToolCall("related_documents", {"document_id": public}),
            FakeToolCall("related_documents", {"document_id": secret}),
            FakeToolCall("read_document", {"document_id": public}),
        ),
        text_reply("done"),
    )
    outcome = await runtime.execute(ctx, now=NOW)
    assert outcome.state == "succeeded"
    results = [m["content"] for m in fake_openai.requests[1]["messages"] if m["role"] == "tool"]
    seen = "\n".join(results)
    assert "BLUEFIN" not in seen and "Payroll export" not in seen
    search, read_secret, related_public, related_secret, read_public = results
    assert [r["document_id"] for r in json.loads(search)["results"]] == [public]
    assert read_secret == f"error: document {secret} not found"
    assert json.loads(related_public)["related"] == []
    assert json.loads(related_secret)["related"] == []
    assert read_public.startswith(f"Document {public}: Payroll FAQ")
