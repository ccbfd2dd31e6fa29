"""Calling MCP tools from a run, against the real MCP ticket server and the real worker: what the
model is offered, who the server hears is acting, refusals back to the model, failures naming the
tool, and sessions reused across calls."""

from __future__ import annotations

import dramatiq

from agent_engine.testing.fake_openai import FakeOpenAIServer, FakeToolCall, text_reply, tool_reply
from agent_engine.testing.mcp_tickets import SEARCH_SCHEMA, TicketServer
from tests.integration.runs.support import FakeAgent
from tests.integration.runs.transcript.support import Gql
from tests.integration.tool_sources.conftest import TOKEN, Admin, mcp_agent

SEARCH = "tickets__search_tickets"


async def test_a_read_call_reaches_the_server_as_the_owner_with_the_credential(
    admin: Admin,
    gql: Gql,
    tickets: TicketServer,
    fake_openai: FakeOpenAIServer,
    fake_agent: FakeAgent,
    worker: dramatiq.Worker,
) -> None:
    agent, _tools = await mcp_agent(admin, gql, tickets, fake_agent)
    owner = int(agent["user_id"])
    fake_openai.enqueue(
        tool_reply(FakeToolCall(SEARCH, {"query": "vpn"})),
        text_reply("T-1 is the VPN ticket."),
    )

    run = await gql.finished_run(await gql.start(agent["id"], as_user=owner), as_user=owner)

    assert run["state"] == "SUCCEEDED"
    [call] = tickets.calls
    assert (call.name, call.arguments) == ("search_tickets", {"query": "vpn"})
    assert call.authorization == f"Bearer {TOKEN}"
    assert call.meta == {
        "agentEngine/userId": str(owner),
        "agentEngine/agentId": str(agent["id"]),
        "agentEngine/runId": run["id"],
    }
    # The model was offered the tool with its description and JSON Schema.
    offered = {t["function"]["name"]: t["function"] for t in fake_openai.requests[0]["tools"]}
    assert offered[SEARCH]["parameters"] == SEARCH_SCHEMA
    assert offered[SEARCH]["description"] == "Search the ticket system by words in the title."
    tool_step = run["steps"][1]
    assert (tool_step["kind"], tool_step["name"]) == ("TOOL_CALL", SEARCH)
    assert tool_step["output"] == "T-1 [high] VPN drops every hour"
    assert tool_step["error"] is None


async def test_arguments_outside_the_schema_and_server_errors_go_back_to_the_model(
    admin: Admin,
    gql: Gql,
    tickets: TicketServer,
    fake_openai: FakeOpenAIServer,
    fake_agent: FakeAgent,
    worker: dramatiq.Worker,
) -> None:
    agent, _tools = await mcp_agent(admin, gql, tickets, fake_agent)
    owner = int(agent["user_id"])
    fake_openai.enqueue(
        tool_reply(FakeToolCall(SEARCH, {"query": 42})),
        tool_reply(FakeToolCall(SEARCH, {"query": "vpn", "limit": 3})),
        text_reply("gave up"),
    )

    run = await gql.finished_run(await gql.start(agent["id"], as_user=owner), as_user=owner)

    assert run["state"] == "SUCCEEDED"
    assert tickets.calls == []  # neither call reached the server
    first, second = run["steps"][1], run["steps"][3]
    assert "at query" in first["error"] and "is not of type 'string'" in first["error"]
    assert "Additional properties" in second["error"]
    tool_messages = [m for m in fake_openai.requests[1]["messages"] if m["role"] == "tool"]
    assert tool_messages[0]["content"].startswith("error: arguments do not fit the schema")


async def test_an_is_error_result_goes_back_to_the_model(
    admin: Admin,
    gql: Gql,
    tickets: TicketServer,
    fake_openai: FakeOpenAIServer,
    fake_agent: FakeAgent,
    worker: dramatiq.Worker,
) -> None:
    # A READ tool the server lists but answers with isError (it does not know it).
    tickets.state.extra_specs = [
        {"name": "flaky", "inputSchema": {"type": "object"}, "annotations": {"readOnlyHint": True}}
    ]
    agent, _tools = await mcp_agent(admin, gql, tickets, fake_agent)
    owner = int(agent["user_id"])
    fake_openai.enqueue(tool_reply(FakeToolCall("tickets__flaky", {})), text_reply("noted"))

    run = await gql.finished_run(await gql.start(agent["id"], as_user=owner), as_user=owner)

    assert run["state"] == "SUCCEEDED"
    assert run["steps"][1]["error"] == "unknown tool flaky"
    seen = [m for m in fake_openai.requests[1]["messages"] if m["role"] == "tool"]
    assert seen[0]["content"] == "error: unknown tool flaky"


async def test_a_huge_result_is_cut_for_the_model_and_the_transcript(
    admin: Admin,
    gql: Gql,
    tickets: TicketServer,
    fake_openai: FakeOpenAIServer,
    fake_agent: FakeAgent,
    worker: dramatiq.Worker,
) -> None:
    agent, _tools = await mcp_agent(admin, gql, tickets, fake_agent)
    owner = int(agent["user_id"])
    tickets.state.result_chars = 1_000_000
    fake_openai.enqueue(tool_reply(FakeToolCall(SEARCH, {"query": "vpn"})), text_reply("ok"))

    run = await gql.finished_run(await gql.start(agent["id"], as_user=owner), as_user=owner)

    assert run["state"] == "SUCCEEDED"
    seen = next(m for m in fake_openai.requests[1]["messages"] if m["role"] == "tool")["content"]
    assert 19_000 < len(seen) <= 20_100
    assert len(run["steps"][1]["output"]) <= 8_100


async def test_an_unreachable_server_fails_the_run_naming_the_tool_not_the_url(
    admin: Admin,
    gql: Gql,
    tickets: TicketServer,
    fake_openai: FakeOpenAIServer,
    fake_agent: FakeAgent,
    worker: dramatiq.Worker,
) -> None:
    agent, _tools = await mcp_agent(admin, gql, tickets, fake_agent)
    owner = int(agent["user_id"])
    url, port = tickets.url, str(tickets.port)
    tickets.stop()
    fake_openai.enqueue(tool_reply(FakeToolCall(SEARCH, {"query": "vpn"})))

    run = await gql.finished_run(await gql.start(agent["id"], as_user=owner), as_user=owner)

    assert (run["state"], run["reason"]) == ("FAILED", "ERROR")
    assert SEARCH in run["error"] and "could not be reached" in run["error"]
    assert url not in run["error"] and port not in run["error"]


async def test_calls_reuse_one_session(
    admin: Admin,
    gql: Gql,
    tickets: TicketServer,
    fake_openai: FakeOpenAIServer,
    fake_agent: FakeAgent,
    worker: dramatiq.Worker,
) -> None:
    agent, _tools = await mcp_agent(admin, gql, tickets, fake_agent)
    owner = int(agent["user_id"])
    opened_by_syncs = tickets.state.sessions
    for _round in range(3):
        fake_openai.enqueue(tool_reply(FakeToolCall(SEARCH, {"query": "vpn"})), text_reply("ok"))
        run = await gql.finished_run(await gql.start(agent["id"], as_user=owner), as_user=owner)
        assert run["state"] == "SUCCEEDED"
    assert len(tickets.calls) == 3
    # One MCP session for the three runs: a single initialize on the server.
    assert tickets.state.sessions == opened_by_syncs + 1


async def test_agents_keep_running_when_their_source_is_removed(
    admin: Admin,
    gql: Gql,
    tickets: TicketServer,
    fake_openai: FakeOpenAIServer,
    fake_agent: FakeAgent,
    worker: dramatiq.Worker,
) -> None:
    agent, _tools = await mcp_agent(admin, gql, tickets, fake_agent)
    owner = int(agent["user_id"])
    source_id = (await gql.data("{ toolSources { id } }", as_user=admin.id, admin=True))[
        "toolSources"
    ][0]["id"]
    await gql.data(
        "mutation($id: ID!) { removeToolSource(id: $id) }",
        {"id": source_id},
        as_user=admin.id,
        admin=True,
    )
    fake_openai.enqueue(text_reply("still here"))

    run = await gql.finished_run(await gql.start(agent["id"], as_user=owner), as_user=owner)

    assert (run["state"], run["output"]) == ("SUCCEEDED", "still here")
    offered = {t["function"]["name"] for t in fake_openai.requests[0]["tools"]}
    assert SEARCH not in offered


async def test_a_restarted_server_is_reached_again_by_the_next_read_call(
    admin: Admin,
    gql: Gql,
    tickets: TicketServer,
    fake_openai: FakeOpenAIServer,
    fake_agent: FakeAgent,
    worker: dramatiq.Worker,
) -> None:
    agent, _tools = await mcp_agent(admin, gql, tickets, fake_agent)
    owner = int(agent["user_id"])
    fake_openai.enqueue(tool_reply(FakeToolCall(SEARCH, {"query": "vpn"})), text_reply("ok"))
    first = await gql.finished_run(await gql.start(agent["id"], as_user=owner), as_user=owner)
    assert first["state"] == "SUCCEEDED"
    port = tickets.port
    assert port is not None
    tickets.stop()  # the worker's pooled session now names a session the new server never made

    with TicketServer(port=port) as restarted:
        fake_openai.enqueue(tool_reply(FakeToolCall(SEARCH, {"query": "vpn"})), text_reply("ok"))
        again = await gql.finished_run(await gql.start(agent["id"], as_user=owner), as_user=owner)

        assert again["state"] == "SUCCEEDED", again["error"]
        assert len(restarted.calls) == 1
