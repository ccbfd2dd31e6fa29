"""runSteps over a real WebSocket client: the replay, then each change, then the end."""

from __future__ import annotations

from typing import Any

import dramatiq
from sqlalchemy.ext.asyncio import AsyncEngine

from agent_engine.settings import Settings
from agent_engine.testing.fake_openai import (
    FakeOpenAIServer,
    FakeToolCall,
    text_reply,
    tool_reply,
)
from tests.integration.api.subscriptions.support import Server, acknowledged_client, token
from tests.integration.runs.support import FakeAgent, eventually, fetch
from tests.integration.runs.transcript.support import Gql
from tests.support.factories import Factories

RUN_STEPS = """
subscription Steps($runId: ID!) {
  runSteps(runId: $runId) { index kind name input output error finishedAt }
}
"""
SLOW_SECONDS = 2.0


async def _steps_started(engine: AsyncEngine, run_id: int, count: int) -> bool:
    rows = await fetch(engine, "SELECT 1 FROM agent_run_steps WHERE run_id = :r", r=run_id)
    return len(rows) >= count


async def _until_complete(client: Any, op: str) -> list[dict[str, Any]]:
    seen: list[dict[str, Any]] = []
    while True:
        message = await client.message_for(op)
        if message["type"] == "complete":
            return seen
        assert message["type"] == "next" and not message["payload"].get("errors"), message
        seen.append(message["payload"]["data"]["runSteps"])


async def test_run_steps_replays_then_follows_the_run_to_its_end(
    server: Server,
    gql: Gql,
    settings: Settings,
    engine: AsyncEngine,
    fake_openai: FakeOpenAIServer,
    fake_agent: FakeAgent,
    worker: dramatiq.Worker,
) -> None:
    agent = await fake_agent()
    owner = int(agent["user_id"])
    fake_openai.enqueue(
        tool_reply(FakeToolCall("search_knowledge", {"query": "rotation"})),
        text_reply("Here is the digest.", delay_seconds=SLOW_SECONDS),
    )
    run_id = await gql.start(agent["id"], as_user=owner)
    # Subscribe while the second model call is under way: two steps done, the third open.
    await eventually(lambda: _steps_started(engine, int(run_id), 3), what="the third step")

    async with acknowledged_client(server, token(settings, owner)) as client:
        await client.subscribe("s", RUN_STEPS, {"runId": run_id})
        seen = await _until_complete(client, "s")

    assert [(s["index"], s["kind"], s["finishedAt"] is not None) for s in seen] == [
        (0, "MODEL_CALL", True),
        (1, "TOOL_CALL", True),
        (2, "MODEL_CALL", False),
        (2, "MODEL_CALL", True),
    ]
    assert seen[1]["input"] == {"query": "rotation"}
    assert seen[3]["output"] == "Here is the digest."
    assert (await gql.run(run_id, as_user=owner))["state"] == "SUCCEEDED"


async def test_a_finished_runs_steps_are_replayed_and_the_stream_ends(
    server: Server,
    gql: Gql,
    settings: Settings,
    factories: Factories,
    fake_openai: FakeOpenAIServer,
    fake_agent: FakeAgent,
    worker: dramatiq.Worker,
) -> None:
    agent = await fake_agent()
    owner = int(agent["user_id"])
    admin = (await factories.user())["id"]
    stranger = (await factories.user())["id"]
    fake_openai.enqueue(text_reply("Short answer."))
    run_id = await gql.start(agent["id"], as_user=owner)
    await gql.finished_run(run_id, as_user=owner)

    async with acknowledged_client(server, token(settings, owner)) as client:
        await client.subscribe("mine", RUN_STEPS, {"runId": run_id})
        (step,) = await _until_complete(client, "mine")
        assert (step["kind"], step["output"]) == ("MODEL_CALL", "Short answer.")

    async with acknowledged_client(server, token(settings, admin, admin=True)) as client:
        await client.subscribe("admin", RUN_STEPS, {"runId": run_id})
        (step,) = await _until_complete(client, "admin")
        assert (step["kind"], step["output"], step["input"]) == ("MODEL_CALL", None, None)

    async with acknowledged_client(server, token(settings, stranger)) as client:
        await client.subscribe("other", RUN_STEPS, {"runId": run_id})
        message = await client.message_for("other")
        assert message["type"] == "error", message
        assert message["payload"][0]["extensions"]["code"] == "NOT_FOUND"
    await server.wait_subscribers(0)
