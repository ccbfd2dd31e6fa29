"""Write tools wait for the owner, against the real MCP ticket server and the real worker: a
WRITE call parks the run (no server call, no worker holds it), the owner's decision resumes it on
a worker (approve -> one call; decline -> the model hears the note), expiry, cancel while parked,
auto-approval, who may decide, and duplicate messages never calling twice."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from agent_engine.runs import approvals
from agent_engine.settings import Settings
from agent_engine.testing.fake_openai import FakeToolCall, text_reply, tool_reply
from agent_engine.workers.actors import worker_context
from agent_engine.workers.broker import enqueue_execute
from tests.integration.api.subscriptions.support import Server, acknowledged_client
from tests.integration.runs.support import eventually, fetch
from tests.integration.runs.transcript.support import CANCEL, Gql, error_code
from tests.integration.tool_sources.conftest import ATTACH as ATTACH_TOOL
from tests.integration.tool_sources.conftest import McpAgent, Scene
from tests.support.factories import Factories

CREATE = "tickets__create_ticket"
RUN = """
query($id: ID!) {
  run(id: $id) {
    id state reason error output tokensUsed
    pendingApproval { id status input expiresAt tool { name access } agent { id } run { id } }
    steps { index kind name input output error approval { id status note decidedAt } }
  }
}
"""
DECIDE = """
mutation($id: ID!, $approve: Boolean!, $note: String) {
  decideToolCall(approvalId: $id, approve: $approve, note: $note) {
    id status note decidedAt input
  }
}
"""
APPROVALS = """
query($status: ApprovalStatus) {
  toolApprovals(status: $status) { edges { node { id status input tool { name } run { id } } } }
}
"""
AUTO = """
mutation($agent: ID!, $tool: ID!, $auto: Boolean!) {
  setToolAutoApproved(agentId: $agent, toolId: $tool, autoApproved: $auto) {
    autoApprovedTools { name }
  }
}
"""


@pytest.fixture
def settings(settings: Settings) -> Settings:
    """Resends of lost decisions after a tenth of a second (the sweep test drives the sweep)."""
    return settings.model_copy(update={"queued_resend_after_seconds": 0.1})


async def run_view(gql: Gql, run_id: str, *, as_user: int, admin: bool = False) -> dict[str, Any]:
    data = await gql.data(RUN, {"id": run_id}, as_user=as_user, admin=admin)
    run: dict[str, Any] = data["run"]
    return run


async def parked(gql: Gql, run_id: str, *, as_user: int) -> dict[str, Any]:
    async def probe() -> dict[str, Any] | None:
        run = await run_view(gql, run_id, as_user=as_user)
        return run if run["pendingApproval"] else None

    await eventually(probe, what=f"run {run_id} to park")
    # Read again, now that the park has committed: the probe's run row and its approval come from
    # two statements, and the row may predate the park (tokens not yet written).
    return await run_view(gql, run_id, as_user=as_user)


async def start_write(mcp: Scene, *, final: str = "done") -> tuple[McpAgent, str]:
    """A new agent's run whose model asks for a ticket to be made (a WRITE call), then says
    `final`; (agent, run id)."""
    agent = await mcp.agent()
    mcp.fake_openai.enqueue(
        tool_reply(
            FakeToolCall(CREATE, {"title": "Renew the TLS certificate", "priority": "high"}),
            prompt_tokens=30,
            completion_tokens=4,
        ),
        text_reply(final),
    )
    return agent, await mcp.start(agent)


async def test_a_write_call_parks_until_approved_then_is_made_once(mcp: Scene) -> None:
    gql, tickets, admin = mcp.gql, mcp.tickets, mcp.admin
    agent, run_id = await start_write(mcp)
    owner = agent.owner

    run = await parked(gql, run_id, as_user=owner)

    assert run["state"] == "RUNNING"
    pending = run["pendingApproval"]
    assert pending["status"] == "PENDING"
    assert pending["input"] == {"title": "Renew the TLS certificate", "priority": "high"}
    assert pending["tool"] == {"name": CREATE, "access": "WRITE"}
    assert pending["run"]["id"] == run_id and pending["agent"]["id"] == agent.id
    assert tickets.calls_of("create_ticket") == []
    # The tokens of the answered model call count while the run waits.
    assert run["tokensUsed"] == 34
    # No worker holds it: no in-flight place, and the agent is still busy (one run per agent).
    assert worker_context().in_flight.running == 0
    again = await gql.data(
        "mutation($id: ID!) { startRun(agentId: $id) { state reason } }",
        {"id": agent.id},
        as_user=owner,
    )
    assert again["startRun"] == {"state": "SKIPPED", "reason": "ALREADY_RUNNING"}
    # The admin sees that it waits, not what the owner's run would send.
    admin_view = await run_view(gql, run_id, as_user=admin.id, admin=True)
    assert admin_view["pendingApproval"]["input"] is None
    listed = (await gql.data(APPROVALS, {"status": "PENDING"}, as_user=owner))["toolApprovals"]
    assert [e["node"]["id"] for e in listed["edges"]] == [pending["id"]]

    decided = await gql.data(
        DECIDE, {"id": pending["id"], "approve": True, "note": "go ahead"}, as_user=owner
    )
    assert decided["decideToolCall"]["status"] == "APPROVED"
    finished = await gql.finished_run(run_id, as_user=owner)

    assert finished["state"] == "SUCCEEDED" and finished["output"] == "done"
    [call] = tickets.calls_of("create_ticket")
    assert call.arguments == {"title": "Renew the TLS certificate", "priority": "high"}
    assert call.meta["agentEngine/runId"] == run_id
    full = await run_view(gql, run_id, as_user=owner)
    assert full["pendingApproval"] is None
    kinds = [(s["index"], s["kind"], s["name"]) for s in full["steps"]]
    assert kinds == [
        (0, "MODEL_CALL", "fake-model"),
        (1, "TOOL_CALL", CREATE),
        (2, "MODEL_CALL", "fake-model"),
    ]
    tool_step = full["steps"][1]
    assert tool_step["output"] == "created T-3: Renew the TLS certificate"
    assert tool_step["approval"]["status"] == "APPROVED"
    assert tool_step["approval"]["note"] == "go ahead"
    # The model saw the server's answer as the tool's result.
    assert mcp.tool_messages()[0] == "created T-3: Renew the TLS certificate"
    assert full["tokensUsed"] == 34 + 15

    # A decided approval is a CONFLICT; a re-sent message resumes nothing and calls nothing.
    body = await gql.body(DECIDE, {"id": pending["id"], "approve": True}, as_user=owner)
    assert error_code(body) == "CONFLICT"
    for _ in range(3):
        enqueue_execute(int(run_id))
    await mcp.barrier()
    assert len(tickets.calls_of("create_ticket")) == 1


async def test_a_declined_call_is_never_made_and_the_model_hears_the_note(mcp: Scene) -> None:
    gql = mcp.gql
    agent, run_id = await start_write(mcp, final="understood")
    owner = agent.owner
    pending = (await parked(gql, run_id, as_user=owner))["pendingApproval"]

    await gql.data(
        DECIDE, {"id": pending["id"], "approve": False, "note": "not this week"}, as_user=owner
    )
    finished = await gql.finished_run(run_id, as_user=owner)

    assert (finished["state"], finished["output"]) == ("SUCCEEDED", "understood")
    assert mcp.tickets.calls_of("create_ticket") == []
    heard = mcp.tool_messages()[0]
    assert heard == "error: the owner declined this call; their note: not this week"
    step = (await run_view(gql, run_id, as_user=owner))["steps"][1]
    assert step["approval"]["status"] == "DECLINED"
    assert step["error"] == "the owner declined this call; their note: not this week"


async def test_an_unanswered_approval_expires_and_the_model_hears_a_decline(
    mcp: Scene, engine: AsyncEngine
) -> None:
    gql = mcp.gql
    agent, run_id = await start_write(mcp)
    owner = agent.owner
    pending = (await parked(gql, run_id, as_user=owner))["pendingApproval"]
    # Its time is up (as if AGENT_ENGINE_APPROVAL_TIMEOUT_SECONDS had passed).
    async with engine.begin() as conn:
        await conn.execute(
            text("UPDATE tool_approvals SET expires_at = now() WHERE id = :id"),
            {"id": int(pending["id"])},
        )

    sent = await approvals.sweep(engine, enqueue=enqueue_execute, resend_after_seconds=3600)
    assert sent == 1
    finished = await gql.finished_run(run_id, as_user=owner)

    assert finished["state"] == "SUCCEEDED"
    assert mcp.tickets.calls_of("create_ticket") == []
    assert "no decision before the approval expired" in mcp.tool_messages()[0]
    body = await gql.body(DECIDE, {"id": pending["id"], "approve": True}, as_user=owner)
    assert error_code(body) == "CONFLICT"


async def test_cancelling_a_parked_run_ends_it_and_its_approval(mcp: Scene) -> None:
    gql = mcp.gql
    agent, run_id = await start_write(mcp)
    owner = agent.owner
    pending = (await parked(gql, run_id, as_user=owner))["pendingApproval"]

    cancelled = (await gql.data(CANCEL, {"id": run_id}, as_user=owner))["cancelRun"]

    assert (cancelled["state"], cancelled["reason"]) == ("FAILED", "CANCELLED")
    assert cancelled["tokensUsed"] == 34
    view = await run_view(gql, run_id, as_user=owner)
    assert view["pendingApproval"] is None
    assert view["steps"][1]["approval"]["status"] == "CANCELLED"
    body = await gql.body(DECIDE, {"id": pending["id"], "approve": True}, as_user=owner)
    assert error_code(body) == "CONFLICT"
    assert mcp.tickets.calls_of("create_ticket") == []


async def test_only_the_owner_decides(mcp: Scene, factories: Factories) -> None:
    gql, admin = mcp.gql, mcp.admin
    agent, run_id = await start_write(mcp)
    pending = (await parked(gql, run_id, as_user=agent.owner))["pendingApproval"]
    stranger = (await factories.user())["id"]

    as_admin = await gql.body(
        DECIDE, {"id": pending["id"], "approve": True}, as_user=admin.id, admin=True
    )
    as_stranger = await gql.body(DECIDE, {"id": pending["id"], "approve": True}, as_user=stranger)

    assert error_code(as_admin) == "FORBIDDEN"
    assert error_code(as_stranger) == "NOT_FOUND"
    assert (await gql.data(APPROVALS, as_user=stranger))["toolApprovals"]["edges"] == []
    seen = (await gql.data(APPROVALS, as_user=admin.id, admin=True))["toolApprovals"]["edges"]
    assert [(e["node"]["id"], e["node"]["input"]) for e in seen] == [(pending["id"], None)]
    assert mcp.tickets.calls_of("create_ticket") == []


async def test_an_auto_approved_write_tool_runs_without_asking(
    mcp: Scene, factories: Factories
) -> None:
    gql, admin = mcp.gql, mcp.admin
    agent = await mcp.agent()
    owner = agent.owner
    variables = {"agent": agent.id, "tool": agent.tools[CREATE], "auto": True}
    set_auto = await gql.data(AUTO, variables, as_user=owner)
    assert set_auto["setToolAutoApproved"]["autoApprovedTools"] == [{"name": CREATE}]
    mcp.fake_openai.enqueue(
        tool_reply(FakeToolCall(CREATE, {"title": "Rotate keys"})), text_reply("opened")
    )

    run_id = await mcp.start(agent)
    finished = await gql.finished_run(run_id, as_user=owner)

    assert finished["state"] == "SUCCEEDED"
    assert len(mcp.tickets.calls_of("create_ticket")) == 1
    step = (await run_view(gql, run_id, as_user=owner))["steps"][1]
    assert step["approval"] is None and step["output"].startswith("created")

    # READ tools never wait; tools outside the selection cannot be auto-approved.
    read = {**variables, "tool": agent.tools["tickets__search_tickets"]}
    body = await gql.body(AUTO, read, as_user=owner)
    assert error_code(body) == "BAD_USER_INPUT"
    assert body["errors"][0]["extensions"]["field"] == "toolId"
    other = await factories.tool("other_tool")
    body = await gql.body(AUTO, {**variables, "tool": str(other["id"])}, as_user=owner)
    assert body["errors"][0]["extensions"]["field"] == "toolId"
    body = await gql.body(AUTO, variables, as_user=admin.id, admin=True)
    assert error_code(body) == "FORBIDDEN"


async def test_bad_arguments_are_refused_without_asking_the_owner(
    mcp: Scene, engine: AsyncEngine
) -> None:
    agent = await mcp.agent()
    mcp.fake_openai.enqueue(
        tool_reply(FakeToolCall(CREATE, {"title": ""})), text_reply("could not")
    )

    finished = await mcp.finished(agent)

    assert finished["state"] == "SUCCEEDED"
    assert await fetch(engine, "SELECT id FROM tool_approvals") == []
    step = (await run_view(mcp.gql, finished["id"], as_user=agent.owner))["steps"][1]
    assert "at title" in step["error"]


LIVE = "subscription { toolApprovals { id status input note tool { name } run { id } } }"


async def test_approvals_are_seen_live_by_their_owner_and_the_admins_only(
    mcp: Scene, server: Server, factories: Factories
) -> None:
    gql, admin = mcp.gql, mcp.admin
    agent = await mcp.agent()
    owner = agent.owner
    stranger = (await factories.user())["id"]
    mcp.fake_openai.enqueue(
        tool_reply(FakeToolCall(CREATE, {"title": "Renew the TLS certificate"})),
        text_reply("done"),
    )
    async with (
        acknowledged_client(server, gql.token(owner)) as owner_ws,
        acknowledged_client(server, gql.token(stranger)) as stranger_ws,
        acknowledged_client(server, gql.token(admin.id, admin=True)) as admin_ws,
    ):
        for ws in (owner_ws, stranger_ws, admin_ws):
            await ws.subscribe("a", LIVE)

        async def subscribed() -> bool:
            return server.subscribers_of("toolApprovals") == 3

        await eventually(subscribed, what="three approval subscribers")
        run_id = await mcp.start(agent)

        requested = (await owner_ws.next_data("a"))["toolApprovals"]
        assert requested["status"] == "PENDING" and requested["run"]["id"] == run_id
        assert requested["input"] == {"title": "Renew the TLS certificate"}
        seen_by_admin = (await admin_ws.next_data("a"))["toolApprovals"]
        assert (seen_by_admin["id"], seen_by_admin["input"]) == (requested["id"], None)

        await gql.data(
            DECIDE, {"id": requested["id"], "approve": True, "note": "ok"}, as_user=owner
        )
        decided = (await owner_ws.next_data("a"))["toolApprovals"]
        assert (decided["status"], decided["note"]) == ("APPROVED", "ok")
        assert (await admin_ws.next_data("a"))["toolApprovals"]["status"] == "APPROVED"
        await gql.finished_run(run_id, as_user=owner)
        # The stranger heard nothing of it (a barrier: their own next event arrives first).
        other_agent = await mcp.fake_agent(user_id=stranger)
        await gql.data(
            ATTACH_TOOL,
            {"agent": str(other_agent["id"]), "tool": agent.tools[CREATE]},
            as_user=stranger,
        )
        mcp.fake_openai.enqueue(tool_reply(FakeToolCall(CREATE, {"title": "Mine"})))
        await gql.start(other_agent["id"], as_user=stranger)
        own = (await stranger_ws.next_data("a"))["toolApprovals"]
        assert own["input"] == {"title": "Mine"}


async def test_messages_racing_to_resume_one_decision_make_one_call(mcp: Scene) -> None:
    gql = mcp.gql
    agent, run_id = await start_write(mcp)
    owner = agent.owner
    pending = (await parked(gql, run_id, as_user=owner))["pendingApproval"]

    await gql.data(DECIDE, {"id": pending["id"], "approve": True}, as_user=owner)
    for _ in range(5):  # duplicates racing the decision's own message over 4 worker threads
        enqueue_execute(int(run_id))
    finished = await gql.finished_run(run_id, as_user=owner)

    assert finished["state"] == "SUCCEEDED"
    await mcp.barrier()
    assert len(mcp.tickets.calls_of("create_ticket")) == 1
    kinds = [s["kind"] for s in (await run_view(gql, run_id, as_user=owner))["steps"]]
    assert kinds == ["MODEL_CALL", "TOOL_CALL", "MODEL_CALL"]


RUN_EVENTS = """subscription($agent: ID) { runEvents(agentId: $agent) {
  previousState run { id state pendingApproval { id status } } } }"""


async def test_run_events_show_the_run_waiting_and_then_going_on(
    mcp: Scene, server: Server
) -> None:
    agent = await mcp.agent()
    owner = agent.owner
    mcp.fake_openai.enqueue(
        tool_reply(FakeToolCall(CREATE, {"title": "Renew the TLS certificate"})),
        text_reply("done"),
    )
    async with acknowledged_client(server, mcp.gql.token(owner)) as ws:
        await ws.subscribe("e", RUN_EVENTS, {"agent": agent.id})
        await server.wait_subscribers(1)
        run_id = await mcp.start(agent)

        async def next_event() -> dict[str, Any]:
            event: dict[str, Any] = (await ws.next_data("e"))["runEvents"]
            return event

        seen = [await next_event() for _ in range(3)]
        assert [(e["previousState"], e["run"]["state"]) for e in seen] == [
            (None, "QUEUED"),
            ("QUEUED", "RUNNING"),
            ("RUNNING", "RUNNING"),
        ]
        waiting = seen[2]["run"]["pendingApproval"]
        assert waiting is not None and waiting["status"] == "PENDING"
        await mcp.gql.data(DECIDE, {"id": waiting["id"], "approve": True}, as_user=owner)
        resumed = await next_event()
        assert (resumed["run"]["state"], resumed["run"]["pendingApproval"]) == ("RUNNING", None)
        finished = await next_event()
        assert finished["run"]["state"] == "SUCCEEDED" and finished["run"]["id"] == run_id
