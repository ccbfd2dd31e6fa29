"""What a tool server or a model sends is capped by the bytes actually read, not by what its
headers say (issue 38): a listing or a result sent chunked or as SSE, a result that never ends,
a model answer without a Content-Length. The call fails naming the limit, the sender stops
because we stopped reading, and a NUL in a result never reaches the run's record."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import dramatiq
import pytest

from agent_engine.testing.fake_openai import (
    FakeOpenAIServer,
    FakeToolCall,
    flood_reply,
    text_reply,
    tool_reply,
)
from agent_engine.testing.hostile_mcp import Delivery, HostileServer, write_tool
from agent_engine.tool_sources.client import MAX_LISTING_BYTES, MAX_RESPONSE_BYTES
from tests.integration.runs.support import FakeAgent
from tests.integration.runs.transcript.support import Gql
from tests.integration.tool_sources.conftest import ATTACH, Admin

TOOL = "hostile__create_ticket"
# What the server would send in full: the filler listing (100k tools) or the result (50 MB).
LISTING_FULL_BYTES = 20_000_000
RESULT_FULL_BYTES = 50_000_000


@pytest.fixture
def hostile() -> Iterator[HostileServer]:
    with HostileServer() as server:
        # Its one tool says it only reads: a run calls it without waiting for an approval.
        server.state.tools = [write_tool(read_only=True)]
        yield server


async def register(admin: Admin, server: HostileServer) -> dict[str, Any]:
    source = await admin.upsert(name="hostile", url=server.url)
    assert [t["name"] for t in source["tools"]] == [TOOL]
    return source


async def test_a_listing_over_the_cap_fails_the_sync_and_keeps_the_tools(
    admin: Admin, hostile: HostileServer
) -> None:
    source = await register(admin, hostile)
    hostile.apply("many_tools")  # 100k tools, chunked: no Content-Length
    for delivery in (Delivery.CHUNKED, Delivery.SSE):
        hostile.state.delivery = delivery
        hostile.state.sent_bytes = 0

        synced = await admin.sync(source["id"])

        assert synced["lastError"] == (
            f"sync failed: the server's answer is larger than {MAX_LISTING_BYTES} bytes"
        ), delivery
        assert [t["name"] for t in synced["tools"]] == [TOOL]
        # The client stopped reading, so the server stopped sending.
        assert hostile.state.sent_bytes < LISTING_FULL_BYTES / 2, delivery


class Runs:
    def __init__(
        self, admin: Admin, gql: Gql, fake_agent: FakeAgent, server: HostileServer
    ) -> None:
        self.admin, self.gql, self.fake_agent, self.server = admin, gql, fake_agent, server

    async def agent(self) -> dict[str, Any]:
        source = await register(self.admin, self.server)
        tool_id = source["tools"][0]["id"]
        await self.admin.allow(tool_id)
        agent = await self.fake_agent()
        await self.gql.data(
            ATTACH, {"agent": str(agent["id"]), "tool": tool_id}, as_user=int(agent["user_id"])
        )
        return agent

    async def finished(self, agent: dict[str, Any]) -> dict[str, Any]:
        owner = int(agent["user_id"])
        return await self.gql.finished_run(
            await self.gql.start(agent["id"], as_user=owner), as_user=owner
        )


@pytest.fixture
def runs(
    admin: Admin,
    gql: Gql,
    fake_agent: FakeAgent,
    hostile: HostileServer,
    worker: dramatiq.Worker,
) -> Runs:
    return Runs(admin, gql, fake_agent, hostile)


def call_the_tool(fake_openai: FakeOpenAIServer) -> None:
    fake_openai.enqueue(
        tool_reply(FakeToolCall(TOOL, {"title": "vpn"})), text_reply("the model carried on")
    )


@pytest.mark.parametrize("preset", ["big_result", "endless_result"])
async def test_a_result_over_the_cap_sent_as_sse_fails_the_run_naming_the_limit(
    runs: Runs, fake_openai: FakeOpenAIServer, preset: str
) -> None:
    agent = await runs.agent()
    runs.server.apply(preset)  # 50 MB, or a stream that never ends; SSE, no Content-Length
    runs.server.state.sent_bytes = 0
    call_the_tool(fake_openai)

    run = await runs.finished(agent)

    # Not the tool timeout (an endless stream would reach it): the cap, once that much was read.
    assert (run["state"], run["reason"]) == ("FAILED", "ERROR")
    assert run["error"] == (
        f"tool {TOOL} failed: the server's answer is larger than {MAX_RESPONSE_BYTES} bytes"
    )
    assert runs.server.state.sent_bytes < RESULT_FULL_BYTES / 2


async def test_a_nul_in_a_result_is_removed_and_the_run_finishes(
    runs: Runs, fake_openai: FakeOpenAIServer
) -> None:
    agent = await runs.agent()
    runs.server.apply("nul_result")
    call_the_tool(fake_openai)

    run = await runs.finished(agent)

    assert run["state"] == "SUCCEEDED"
    assert run["steps"][1]["output"] == "created T-9 and more"
    heard = [m["content"] for m in fake_openai.requests[1]["messages"] if m["role"] == "tool"]
    assert heard == ["created T-9 and more"]


@pytest.mark.parametrize("size", [RESULT_FULL_BYTES, None], ids=["big", "endless"])
async def test_a_model_answer_over_the_cap_fails_the_run_naming_the_model_and_the_limit(
    runs: Runs, fake_openai: FakeOpenAIServer, size: int | None
) -> None:
    agent = await runs.fake_agent()
    fake_openai.enqueue(flood_reply(size))

    run = await runs.finished(agent)

    assert (run["state"], run["reason"]) == ("FAILED", "ERROR")
    assert run["error"] == "model 'Fake' failed: its answer is larger than 4000000 bytes"
    assert fake_openai.request_count == 1  # not retried
    assert fake_openai.flood_sent_bytes < RESULT_FULL_BYTES / 2
