"""A NUL from a model or a tool server never makes a run's writes fail: the run finishes as usual
(not STALE), and its output, steps and checkpoint are stored without it."""

from __future__ import annotations

from typing import Any

from agent_engine.testing.fake_openai import FakeToolCall, text_reply, tool_reply
from tests.integration.runs.support import eventually
from tests.integration.tool_sources.conftest import Scene

CREATE = "tickets__create_ticket"
RUN = """
query($id: ID!) {
  run(id: $id) {
    id state reason error output
    pendingApproval { id input }
    steps { index kind name input output error }
  }
}
"""
AUTO = """
mutation($agent: ID!, $tool: ID!) {
  setToolAutoApproved(agentId: $agent, toolId: $tool, autoApproved: true) { id }
}
"""
DECIDE = """
mutation($id: ID!) { decideToolCall(approvalId: $id, approve: true) { id status } }
"""


async def run_view(mcp: Scene, run_id: str, owner: int) -> dict[str, Any]:
    run: dict[str, Any] = (await mcp.gql.data(RUN, {"id": run_id}, as_user=owner))["run"]
    return run


async def test_a_nul_in_a_tool_call_its_result_and_the_answer_is_dropped(mcp: Scene) -> None:
    agent = await mcp.agent()
    owner = agent.owner
    await mcp.gql.data(AUTO, {"agent": agent.id, "tool": agent.tools[CREATE]}, as_user=owner)
    # The server echoes the title, so its result carries the NUL back too.
    mcp.fake_openai.enqueue(
        tool_reply(FakeToolCall(CREATE, {"title": "Renew\x00 TLS"})),
        text_reply("opened\x00 it"),
    )

    finished = await mcp.gql.finished_run(await mcp.start(agent), as_user=owner)

    assert (finished["state"], finished["reason"]) == ("SUCCEEDED", None)
    assert finished["output"] == "opened it"
    [call] = mcp.tickets.calls_of("create_ticket")
    assert call.arguments == {"title": "Renew\x00 TLS"}  # what the model asked is what was sent
    step = (await run_view(mcp, finished["id"], owner))["steps"][1]
    assert (step["kind"], step["name"]) == ("TOOL_CALL", CREATE)
    assert step["input"] == {"title": "Renew TLS"}
    assert step["output"] == "created T-3: Renew TLS"


async def test_a_run_parked_on_a_call_with_a_nul_parks_and_goes_on(mcp: Scene) -> None:
    """The checkpoint (the conversation so far) and the approval's input are jsonb."""
    agent = await mcp.agent()
    owner = agent.owner
    mcp.fake_openai.enqueue(
        tool_reply(FakeToolCall(CREATE, {"title": "Renew\x00 TLS"}), content="asking\x00"),
        text_reply("done"),
    )
    run_id = await mcp.start(agent)

    async def parked() -> dict[str, Any] | None:
        waiting: dict[str, Any] | None = (await run_view(mcp, run_id, owner))["pendingApproval"]
        return waiting

    waiting = await eventually(parked, what=f"run {run_id} to park")
    assert waiting["input"] == {"title": "Renew TLS"}
    await mcp.gql.data(DECIDE, {"id": waiting["id"]}, as_user=owner)
    finished = await mcp.gql.finished_run(run_id, as_user=owner)

    assert (finished["state"], finished["output"]) == ("SUCCEEDED", "done")
    # The checkpoint keeps the model's call as it came (its arguments are JSON text): the call
    # made on resume is what the model asked, as without a park.
    [call] = mcp.tickets.calls_of("create_ticket")
    assert call.arguments == {"title": "Renew\x00 TLS"}
