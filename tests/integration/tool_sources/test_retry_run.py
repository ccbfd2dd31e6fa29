"""`retryRun` against the real API, worker, fake model and MCP ticket server: a run that failed at
step k goes on from there (the model is not asked again for the steps before k, a completed
WRITE call is not made again, an in-flight one is reported as unknown and never made twice), its
tokens are only its new calls', and the rules on who and what may be retried."""

from __future__ import annotations

from typing import Any

import pytest

from agent_engine.runs.retry import UNKNOWN_OUTCOME
from agent_engine.settings import Settings
from agent_engine.testing.fake_openai import (
    FakeToolCall,
    error_reply,
    text_reply,
    tool_reply,
)
from tests.integration.runs.support import eventually
from tests.integration.tool_sources.conftest import McpAgent, Scene
from tests.support.graphql import error, error_code

SEARCH = "tickets__search_tickets"
CREATE = "tickets__create_ticket"

RETRY = "mutation($id: ID!) { retryRun(runId: $id) { id state reason trigger retryOf { id } } }"
RUN = """
query($id: ID!) {
  run(id: $id) {
    id state reason error trigger tokensUsed promptTokens completionTokens
    retryOf { id } retriedBy { id }
    steps { index kind name input output error promptTokens completionTokens reused }
  }
}
"""
AGENT = "query($id: ID!) { agent(id: $id) { id usedTokensThisWeek } }"
AUTO_APPROVE = """
mutation($agent: ID!, $tool: ID!) {
  setToolAutoApproved(agentId: $agent, toolId: $tool, autoApproved: true) { id }
}
"""


@pytest.fixture
def settings(settings: Settings) -> Settings:
    # A held tool call times out quickly: the run fails while the call is in flight.
    return settings.model_copy(update={"tool_timeout_seconds": 1.5})


async def _agent(mcp: Scene) -> McpAgent:
    agent = await mcp.agent()
    await mcp.gql.data(
        AUTO_APPROVE, {"agent": agent.id, "tool": agent.tools[CREATE]}, as_user=agent.owner
    )
    return agent


async def _run(mcp: Scene, run_id: str, owner: int) -> dict[str, Any]:
    data = await mcp.gql.data(RUN, {"id": run_id}, as_user=owner)
    run: dict[str, Any] = data["run"]
    return run


async def _ended(mcp: Scene, run_id: str, owner: int) -> dict[str, Any]:
    async def done() -> dict[str, Any] | None:
        run = await _run(mcp, run_id, owner)
        return run if run["state"] not in ("QUEUED", "RUNNING") else None

    found: dict[str, Any] = await eventually(done, within=30, what=f"run {run_id} to end")
    return found


async def _retry(mcp: Scene, run_id: str, owner: int) -> dict[str, Any]:
    data = await mcp.gql.data(RETRY, {"id": run_id}, as_user=owner)
    retried: dict[str, Any] = data["retryRun"]
    return retried


async def test_a_run_that_failed_at_step_k_goes_on_without_redoing_the_steps_before(
    mcp: Scene,
) -> None:
    agent = await _agent(mcp)
    mcp.fake_openai.enqueue(
        tool_reply(FakeToolCall(SEARCH, {"query": "vpn"}), prompt_tokens=100, completion_tokens=10),
        tool_reply(
            FakeToolCall(CREATE, {"title": "VPN drops again"}),
            prompt_tokens=200,
            completion_tokens=20,
        ),
        error_reply(400, "the model refused"),  # step k: the third model call dies
    )
    failed_id = await mcp.start(agent)
    failed = await _ended(mcp, failed_id, agent.owner)
    assert (failed["state"], failed["reason"]) == ("FAILED", "ERROR")
    assert failed["tokensUsed"] == 330
    assert mcp.fake_openai.request_count == 3

    mcp.fake_openai.enqueue(text_reply("Filed T-3.", prompt_tokens=40, completion_tokens=5))
    retried = await _retry(mcp, failed_id, agent.owner)
    assert (retried["state"], retried["trigger"]) == ("QUEUED", "RETRY")
    assert retried["retryOf"] == {"id": failed_id}
    run = await _ended(mcp, retried["id"], agent.owner)

    assert (run["state"], run["reason"]) == ("SUCCEEDED", None)
    # One model call for the retry: none for the two answered before.
    assert mcp.fake_openai.request_count == 4
    # Each completed call was made once, the write included.
    assert [c.name for c in mcp.tickets.calls] == ["search_tickets", "create_ticket"]
    assert [t["title"] for t in mcp.tickets.state.tickets].count("VPN drops again") == 1
    # The model heard the whole conversation so far, the tools' answers included.
    heard = mcp.fake_openai.requests[3]["messages"]
    tool_answers = [m["content"] for m in heard if m["role"] == "tool"]
    assert tool_answers == ["T-1 [high] VPN drops every hour", "created T-3: VPN drops again"]
    # The carried-over steps are marked, keep their tokens, and count nowhere.
    kinds = [(s["kind"], s["name"], s["reused"]) for s in run["steps"]]
    assert kinds == [
        ("MODEL_CALL", "fake-model", True),
        ("TOOL_CALL", SEARCH, True),
        ("MODEL_CALL", "fake-model", True),
        ("TOOL_CALL", CREATE, True),
        ("MODEL_CALL", "fake-model", False),
    ]
    assert run["steps"][0]["promptTokens"] == 100
    assert (run["tokensUsed"], run["promptTokens"], run["completionTokens"]) == (45, 40, 5)
    assert run["retryOf"] == {"id": failed_id}
    assert (await _run(mcp, failed_id, agent.owner))["retriedBy"] == {"id": run["id"]}
    used = (await mcp.gql.data(AGENT, {"id": agent.id}, as_user=agent.owner))["agent"]
    assert used["usedTokensThisWeek"] == 330 + 45

    # A run is retried at most once.
    again = await mcp.gql.body(RETRY, {"id": failed_id}, as_user=agent.owner)
    assert error_code(again) == "CONFLICT"


async def test_a_write_in_flight_when_the_run_failed_is_reported_unknown_never_made_twice(
    mcp: Scene,
) -> None:
    agent = await _agent(mcp)
    mcp.fake_openai.enqueue(
        tool_reply(FakeToolCall(CREATE, {"title": "Disk full"}), prompt_tokens=50),
    )
    mcp.tickets.hold()  # the server takes the call and does not answer in time
    try:
        failed_id = await mcp.start(agent)
        failed = await _ended(mcp, failed_id, agent.owner)
    finally:
        mcp.tickets.release()
    assert (failed["state"], failed["reason"]) == ("FAILED", "ERROR")
    assert CREATE in failed["error"]
    assert len(mcp.tickets.calls_of("create_ticket")) == 1

    mcp.fake_openai.enqueue(text_reply("I will check whether the ticket exists."))
    retried = await _retry(mcp, failed_id, agent.owner)
    run = await _ended(mcp, retried["id"], agent.owner)

    assert run["state"] == "SUCCEEDED"
    # Never made a second time, and the model was told the outcome is unknown.
    assert len(mcp.tickets.calls_of("create_ticket")) == 1
    heard = mcp.fake_openai.requests[-1]["messages"]
    assert [m["content"] for m in heard if m["role"] == "tool"] == [UNKNOWN_OUTCOME]
    write_step = run["steps"][1]
    assert (write_step["name"], write_step["reused"]) == (CREATE, True)
    assert "outcome unknown" in write_step["error"]
    assert failed["tokensUsed"] == 55
    assert run["tokensUsed"] == 15  # the one new call (10 + 5), not the failed run's 55
    assert run["steps"][2]["reused"] is False


async def test_only_failed_error_or_stale_runs_of_ones_own_agent_are_retried(
    mcp: Scene,
) -> None:
    agent = await _agent(mcp)
    mcp.fake_openai.enqueue(text_reply("fine"))
    succeeded_id = await mcp.start(agent)
    await _ended(mcp, succeeded_id, agent.owner)

    refused = await mcp.gql.body(RETRY, {"id": succeeded_id}, as_user=agent.owner)
    assert error_code(refused) == "BAD_USER_INPUT"
    assert "SUCCEEDED" in error(refused)["message"]
    assert error(refused)["extensions"]["field"] == "runId"

    other = await mcp.fake_agent()
    stranger = await mcp.gql.body(RETRY, {"id": succeeded_id}, as_user=int(other["user_id"]))
    assert error_code(stranger) == "NOT_FOUND"
    admin = await mcp.gql.body(RETRY, {"id": succeeded_id}, as_user=mcp.admin.id, admin=True)
    assert error_code(admin) == "FORBIDDEN"
