"""An MCP server that misbehaves during a run: one that hangs, one that goes away mid-call. The
run fails naming the tool (never the URL), within the tool timeout, and the next run works."""

from __future__ import annotations

import pytest

from agent_engine.settings import Settings
from agent_engine.testing.fake_openai import FakeToolCall, text_reply, tool_reply
from tests.integration.runs.support import eventually
from tests.integration.tool_sources.conftest import Scene

SEARCH = "tickets__search_tickets"


@pytest.fixture
def settings(settings: Settings) -> Settings:
    return settings.model_copy(update={"tool_timeout_seconds": 1.0})


async def test_a_hanging_server_fails_the_run_within_the_tool_timeout_and_recovers(
    mcp: Scene,
) -> None:
    agent = await mcp.agent()
    mcp.tickets.hold()
    mcp.fake_openai.enqueue(tool_reply(FakeToolCall(SEARCH, {"query": "vpn"})))

    run = await mcp.finished(agent)

    assert (run["state"], run["reason"]) == ("FAILED", "ERROR")
    assert run["error"] == f"tool {SEARCH} failed: no answer within 1 s"
    mcp.tickets.release()
    mcp.fake_openai.enqueue(tool_reply(FakeToolCall(SEARCH, {"query": "vpn"})), text_reply("ok"))
    again = await mcp.finished(agent)
    assert again["state"] == "SUCCEEDED"
    assert again["steps"][1]["output"] == "T-1 [high] VPN drops every hour"


async def test_a_server_that_goes_away_mid_call_fails_the_run_naming_the_tool(
    mcp: Scene,
) -> None:
    agent = await mcp.agent()
    url = mcp.tickets.url
    mcp.tickets.hold()
    mcp.fake_openai.enqueue(tool_reply(FakeToolCall(SEARCH, {"query": "vpn"})))
    run_id = await mcp.start(agent)

    async def called() -> bool:
        return len(mcp.tickets.calls) == 1

    await eventually(called, what="the call to reach the server")
    mcp.tickets.stop()  # the connection drops with the call in flight

    run = await mcp.gql.finished_run(run_id, as_user=agent.owner)
    assert (run["state"], run["reason"]) == ("FAILED", "ERROR")
    assert run["error"].startswith(f"tool {SEARCH} failed:")
    assert url not in run["error"]


async def test_a_result_over_the_size_limit_fails_the_run_with_a_clear_error(
    mcp: Scene,
) -> None:
    agent = await mcp.agent()
    mcp.tickets.state.result_chars = 10_000_000
    mcp.fake_openai.enqueue(tool_reply(FakeToolCall(SEARCH, {"query": "vpn"})))

    run = await mcp.finished(agent)

    assert (run["state"], run["reason"]) == ("FAILED", "ERROR")
    assert run["error"] == (
        f"tool {SEARCH} failed: the server's answer is larger than 4000000 bytes"
    )
