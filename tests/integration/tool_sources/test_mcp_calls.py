"""Calling MCP tools from a run, against the real MCP ticket server and the real worker: what the
model is offered, who the server hears is acting, refusals back to the model, failures naming the
tool, and sessions reused across calls."""

from __future__ import annotations

from agent_engine.testing.fake_openai import FakeToolCall, text_reply, tool_reply
from agent_engine.testing.mcp_tickets import SEARCH_SCHEMA, TicketServer
from tests.integration.tool_sources.conftest import TOKEN, Scene

SEARCH = "tickets__search_tickets"


async def test_a_read_call_reaches_the_server_as_the_owner_with_the_credential(mcp: Scene) -> None:
    agent = await mcp.agent()
    mcp.fake_openai.enqueue(
        tool_reply(FakeToolCall(SEARCH, {"query": "vpn"})),
        text_reply("T-1 is the VPN ticket."),
    )

    run = await mcp.finished(agent)

    assert run["state"] == "SUCCEEDED"
    [call] = mcp.tickets.calls
    assert (call.name, call.arguments) == ("search_tickets", {"query": "vpn"})
    assert call.authorization == f"Bearer {TOKEN}"
    assert call.meta == {
        "agentEngine/userId": str(agent.owner),
        "agentEngine/agentId": agent.id,
        "agentEngine/runId": run["id"],
    }
    # The model was offered the tool with its description and JSON Schema.
    offered = {t["function"]["name"]: t["function"] for t in mcp.fake_openai.requests[0]["tools"]}
    assert offered[SEARCH]["parameters"] == SEARCH_SCHEMA
    assert offered[SEARCH]["description"] == "Search the ticket system by words in the title."
    tool_step = run["steps"][1]
    assert (tool_step["kind"], tool_step["name"]) == ("TOOL_CALL", SEARCH)
    assert tool_step["output"] == "T-1 [high] VPN drops every hour"
    assert tool_step["error"] is None


async def test_arguments_outside_the_schema_and_server_errors_go_back_to_the_model(
    mcp: Scene,
) -> None:
    agent = await mcp.agent()
    mcp.fake_openai.enqueue(
        tool_reply(FakeToolCall(SEARCH, {"query": 42})),
        tool_reply(FakeToolCall(SEARCH, {"query": "vpn", "limit": 3})),
        text_reply("gave up"),
    )

    run = await mcp.finished(agent)

    assert run["state"] == "SUCCEEDED"
    assert mcp.tickets.calls == []  # neither call reached the server
    first, second = run["steps"][1], run["steps"][3]
    assert "at query" in first["error"] and 'is not of type "string"' in first["error"]
    assert "Additional properties" in second["error"]
    assert mcp.tool_messages()[0].startswith("error: arguments do not fit the schema")


async def test_an_is_error_result_goes_back_to_the_model(mcp: Scene) -> None:
    # A READ tool the server lists but answers with isError (it does not know it).
    mcp.tickets.state.extra_specs = [
        {"name": "flaky", "inputSchema": {"type": "object"}, "annotations": {"readOnlyHint": True}}
    ]
    agent = await mcp.agent()
    mcp.fake_openai.enqueue(tool_reply(FakeToolCall("tickets__flaky", {})), text_reply("noted"))

    run = await mcp.finished(agent)

    assert run["state"] == "SUCCEEDED"
    assert run["steps"][1]["error"] == "unknown tool flaky"
    assert mcp.tool_messages()[0] == "error: unknown tool flaky"


async def test_a_huge_result_is_cut_for_the_model_and_the_transcript(mcp: Scene) -> None:
    agent = await mcp.agent()
    mcp.tickets.state.result_chars = 1_000_000
    mcp.fake_openai.enqueue(tool_reply(FakeToolCall(SEARCH, {"query": "vpn"})), text_reply("ok"))

    run = await mcp.finished(agent)

    assert run["state"] == "SUCCEEDED"
    seen = mcp.tool_messages()[0]
    assert 19_000 < len(seen) <= 20_100
    assert len(run["steps"][1]["output"]) <= 8_100


async def test_an_unreachable_server_fails_the_run_naming_the_tool_not_the_url(
    mcp: Scene,
) -> None:
    agent = await mcp.agent()
    url, port = mcp.tickets.url, str(mcp.tickets.port)
    mcp.tickets.stop()
    mcp.fake_openai.enqueue(tool_reply(FakeToolCall(SEARCH, {"query": "vpn"})))

    run = await mcp.finished(agent)

    assert (run["state"], run["reason"]) == ("FAILED", "ERROR")
    assert SEARCH in run["error"] and "could not be reached" in run["error"]
    assert url not in run["error"] and port not in run["error"]


async def test_calls_reuse_one_session(mcp: Scene) -> None:
    agent = await mcp.agent()
    opened_by_syncs = mcp.tickets.state.sessions
    for _round in range(3):
        mcp.fake_openai.enqueue(
            tool_reply(FakeToolCall(SEARCH, {"query": "vpn"})), text_reply("ok")
        )
        run = await mcp.finished(agent)
        assert run["state"] == "SUCCEEDED"
    assert len(mcp.tickets.calls) == 3
    # One MCP session for the three runs: a single initialize on the server.
    assert mcp.tickets.state.sessions == opened_by_syncs + 1


async def test_agents_keep_running_when_their_source_is_removed(mcp: Scene) -> None:
    agent = await mcp.agent()
    admin = mcp.admin
    source_id = (await mcp.gql.data("{ toolSources { id } }", as_user=admin.id, admin=True))[
        "toolSources"
    ][0]["id"]
    await mcp.gql.data(
        "mutation($id: ID!) { removeToolSource(id: $id) }",
        {"id": source_id},
        as_user=admin.id,
        admin=True,
    )
    mcp.fake_openai.enqueue(text_reply("still here"))

    run = await mcp.finished(agent)

    assert (run["state"], run["output"]) == ("SUCCEEDED", "still here")
    offered = {t["function"]["name"] for t in mcp.fake_openai.requests[0]["tools"]}
    assert SEARCH not in offered


async def test_a_restarted_server_is_reached_again_by_the_next_read_call(mcp: Scene) -> None:
    agent = await mcp.agent()
    mcp.fake_openai.enqueue(tool_reply(FakeToolCall(SEARCH, {"query": "vpn"})), text_reply("ok"))
    first = await mcp.finished(agent)
    assert first["state"] == "SUCCEEDED"
    port = mcp.tickets.port
    assert port is not None
    mcp.tickets.stop()  # the worker's pooled session now names a session the new server never made

    with TicketServer(port=port) as restarted:
        mcp.fake_openai.enqueue(
            tool_reply(FakeToolCall(SEARCH, {"query": "vpn"})), text_reply("ok")
        )
        again = await mcp.finished(agent)

        assert again["state"] == "SUCCEEDED", again["error"]
        assert len(restarted.calls) == 1
