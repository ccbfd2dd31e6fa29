"""A parked run goes on only while its agent may still run: pausing, switching off, deleting,
deactivating the owner or removing the model ends the runs parked on a WRITE call (failed /
cancelled, the reason in `error`, the approval `cancelled`); a resume or an approved call that finds
the gate closed anyway ends the run the same way. The ticket server is never called."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from agent_engine.domain.gate import RESUME_STOP_MESSAGES, ResumeStop
from agent_engine.runs import approvals, resume_gate
from agent_engine.testing.fake_openai import FakeToolCall, text_reply, tool_reply
from agent_engine.workers.broker import enqueue_execute
from tests.integration.runs.support import eventually, fetch
from tests.integration.runs.transcript.support import error_code
from tests.integration.tool_sources.conftest import McpAgent, Scene

CREATE = "tickets__create_ticket"
RUN = """
query($id: ID!) {
  run(id: $id) {
    id state reason error tokensUsed
    pendingApproval { id status }
    steps { index kind error finishedAt approval { id status } }
  }
}
"""
DECIDE = """
mutation($id: ID!, $approve: Boolean!) { decideToolCall(approvalId: $id, approve: $approve) {
  id status } }
"""
APPROVALS = "{ toolApprovals { edges { node { id status } } } }"
PAUSE = """
mutation($id: ID!, $paused: Boolean!) { setAdminPaused(agentId: $id, paused: $paused) { id } }
"""
SWITCH = "mutation($id: ID!, $on: Boolean!) { setAgentEnabled(id: $id, enabled: $on) { id } }"
DELETE = "mutation($id: ID!) { deleteAgent(id: $id) }"
DEACTIVATE = "mutation($id: ID!) { deactivateOwner(userId: $id) }"
REACTIVATE = "mutation($id: ID!) { reactivateOwner(userId: $id) { id } }"
REMOVE_MODEL = "mutation($id: ID!) { removeAgentModel(id: $id) }"
AUDIT = "{ adminAuditLog(first: 5) { edges { node { action details } } } }"

Action = Callable[[Scene, McpAgent], Awaitable[None]]


async def pause(mcp: Scene, agent: McpAgent) -> None:
    await mcp.gql.data(PAUSE, {"id": agent.id, "paused": True}, as_user=mcp.admin.id, admin=True)


async def switch_off(mcp: Scene, agent: McpAgent) -> None:
    await mcp.gql.data(SWITCH, {"id": agent.id, "on": False}, as_user=agent.owner)


async def delete(mcp: Scene, agent: McpAgent) -> None:
    await mcp.gql.data(DELETE, {"id": agent.id}, as_user=agent.owner)


async def deactivate(mcp: Scene, agent: McpAgent) -> None:
    gql, admin = mcp.gql, mcp.admin.id
    await gql.data(DEACTIVATE, {"id": str(agent.owner)}, as_user=admin, admin=True)
    # Back, so the owner can look (their agents stay switched off).
    await gql.data(REACTIVATE, {"id": str(agent.owner)}, as_user=admin, admin=True)


async def remove_model(mcp: Scene, agent: McpAgent) -> None:
    model = str(agent.row["model_id"])
    await mcp.gql.data(REMOVE_MODEL, {"id": model}, as_user=mcp.admin.id, admin=True)


async def start_write(mcp: Scene, agent: McpAgent | None = None) -> tuple[McpAgent, str]:
    """A run whose model asks for a ticket (a WRITE call), then says "done"; (agent, run id)."""
    agent = agent or await mcp.agent()
    mcp.fake_openai.enqueue(
        tool_reply(FakeToolCall(CREATE, {"title": "Renew the TLS certificate"}), prompt_tokens=30),
        text_reply("done"),
    )
    return agent, await mcp.start(agent)


async def run_view(mcp: Scene, run_id: str, owner: int) -> dict[str, Any]:
    run: dict[str, Any] = (await mcp.gql.data(RUN, {"id": run_id}, as_user=owner))["run"]
    return run


async def parked(mcp: Scene, run_id: str, owner: int) -> str:
    """The id of the run's pending approval, once it has parked."""

    async def probe() -> str | None:
        waiting = (await run_view(mcp, run_id, owner))["pendingApproval"]
        return None if waiting is None else str(waiting["id"])

    found: str = await eventually(probe, what=f"run {run_id} to park")
    return found


async def approval_statuses(mcp: Scene, owner: int) -> dict[str, str]:
    edges = (await mcp.gql.data(APPROVALS, as_user=owner))["toolApprovals"]["edges"]
    return {e["node"]["id"]: e["node"]["status"] for e in edges}


async def stored_run(engine: AsyncEngine, run_id: str) -> dict[str, Any]:
    [row] = await fetch(
        engine,
        "SELECT state, reason, error, parked_at, tokens_used FROM agent_runs WHERE id = :id",
        id=int(run_id),
    )
    return row


@pytest.mark.parametrize(
    ("action", "stop"),
    [
        (pause, ResumeStop.ADMIN_PAUSED),
        (switch_off, ResumeStop.DISABLED),
        (deactivate, ResumeStop.OWNER_INACTIVE),
        (remove_model, ResumeStop.NO_MODEL),
    ],
    ids=["admin-pause", "owner-switch-off", "owner-deactivated", "model-removed"],
)
async def test_closing_the_gate_ends_a_parked_run_and_cancels_its_approval(
    mcp: Scene, engine: AsyncEngine, action: Action, stop: ResumeStop
) -> None:
    agent, run_id = await start_write(mcp)
    owner = agent.owner
    approval = await parked(mcp, run_id, owner)

    await action(mcp, agent)

    run = await run_view(mcp, run_id, owner)
    assert (run["state"], run["reason"]) == ("FAILED", "CANCELLED")
    assert run["error"] == RESUME_STOP_MESSAGES[stop]
    assert run["pendingApproval"] is None
    assert run["tokensUsed"] > 0  # the answered model call still counts
    tool_step = run["steps"][1]
    assert tool_step["approval"] == {"id": approval, "status": "CANCELLED"}
    assert tool_step["error"] == RESUME_STOP_MESSAGES[stop] and tool_step["finishedAt"]
    assert (await approval_statuses(mcp, owner))[approval] == "CANCELLED"
    body = await mcp.gql.body(DECIDE, {"id": approval, "approve": True}, as_user=owner)
    assert error_code(body) == "CONFLICT"
    await mcp.barrier()
    assert mcp.tickets.calls_of("create_ticket") == []


async def test_deleting_the_agent_ends_its_parked_run(mcp: Scene, engine: AsyncEngine) -> None:
    agent, run_id = await start_write(mcp)
    owner = agent.owner
    approval = await parked(mcp, run_id, owner)

    await delete(mcp, agent)

    # The agent is hidden (its run's tokens count this week), so the run is read in SQL.
    run = await stored_run(engine, run_id)
    assert (run["state"], run["reason"]) == ("failed", "cancelled")
    assert run["error"] == RESUME_STOP_MESSAGES[ResumeStop.DELETED]
    assert run["parked_at"] is None and run["tokens_used"] > 0
    [stored] = await fetch(
        engine, "SELECT status FROM tool_approvals WHERE id = :id", id=int(approval)
    )
    assert stored["status"] == "cancelled"
    # The approvals of a deleted agent leave toolApprovals with it (docs: what a vanished
    # target means), and deciding it is refused.
    assert approval not in await approval_statuses(mcp, owner)
    body = await mcp.gql.body(DECIDE, {"id": approval, "approve": True}, as_user=owner)
    assert error_code(body) in ("CONFLICT", "NOT_FOUND")
    await mcp.barrier()
    assert mcp.tickets.calls_of("create_ticket") == []


async def test_the_admin_action_names_the_runs_it_ended_in_the_audit_log(mcp: Scene) -> None:
    agent, run_id = await start_write(mcp)
    await parked(mcp, run_id, agent.owner)

    await pause(mcp, agent)

    log = await mcp.gql.data(AUDIT, as_user=mcp.admin.id, admin=True)
    entries = [e["node"] for e in log["adminAuditLog"]["edges"]]
    paused = [e for e in entries if e["action"] == "agent.admin_paused"]
    assert paused[0]["details"]["runsCancelled"] == [run_id]


@pytest.mark.parametrize(
    ("lock", "stop"),
    [
        ("UPDATE agents SET admin_paused = true WHERE id = :agent", ResumeStop.ADMIN_PAUSED),
        ("UPDATE agents SET enabled = false WHERE id = :agent", ResumeStop.DISABLED),
        ("UPDATE users SET is_active = false WHERE id = :owner", ResumeStop.OWNER_INACTIVE),
        ("UPDATE agents SET model_id = NULL WHERE id = :agent", ResumeStop.NO_MODEL),
    ],
    ids=["paused", "switched-off", "owner-inactive", "no-model"],
)
async def test_a_resume_that_finds_the_gate_closed_ends_the_run_without_calling(
    mcp: Scene, engine: AsyncEngine, lock: str, stop: ResumeStop
) -> None:
    agent, run_id = await start_write(mcp)
    owner = agent.owner
    approval = await parked(mcp, run_id, owner)
    # The owner approves; the decision's message is held back until the lock is written, around
    # the mutations (which would end the parked run themselves).
    held: list[int] = []
    await approvals.decide(
        engine, int(approval), actor_id=owner, approve=True, note=None, enqueue=held.append
    )
    async with engine.begin() as conn:
        await conn.execute(text(lock), {"agent": int(agent.id), "owner": owner})

    for run in held:
        enqueue_execute(run)

    async def ended() -> dict[str, Any] | None:
        run = await stored_run(engine, run_id)
        return run if run["state"] != "running" else None

    run = await eventually(ended, what=f"run {run_id} to end")
    assert (run["state"], run["reason"]) == ("failed", "cancelled")
    assert run["error"] == RESUME_STOP_MESSAGES[stop]
    [row] = await fetch(
        engine,
        "SELECT status, call_started_at FROM tool_approvals WHERE id = :id",
        id=int(approval),
    )
    assert (row["status"], row["call_started_at"]) == ("cancelled", None)
    await mcp.barrier()
    assert mcp.tickets.calls_of("create_ticket") == []


async def test_an_approved_call_is_not_claimed_once_the_gate_closed(
    mcp: Scene, engine: AsyncEngine
) -> None:
    """The call's own compare-and-set reads the gate: a run taken back just before the pause
    committed does not make its call after it."""
    agent, run_id = await start_write(mcp)
    approval = int(await parked(mcp, run_id, agent.owner))
    # As a worker leaves it between taking the run back and calling: approved, no longer parked.
    async with engine.begin() as conn:
        await conn.execute(
            text("UPDATE tool_approvals SET status = 'approved' WHERE id = :id"),
            {"id": approval},
        )
        await conn.execute(
            text("UPDATE agent_runs SET parked_at = NULL WHERE id = :id"), {"id": int(run_id)}
        )
    await pause(mcp, agent)
    assert (await stored_run(engine, run_id))["state"] == "running"  # not parked: left to the call

    assert await resume_gate.claim_call(engine, int(run_id), approval) is False

    run = await stored_run(engine, run_id)
    assert (run["state"], run["reason"]) == ("failed", "cancelled")
    assert run["error"] == RESUME_STOP_MESSAGES[ResumeStop.ADMIN_PAUSED]
    [row] = await fetch(
        engine, "SELECT status, call_started_at FROM tool_approvals WHERE id = :id", id=approval
    )
    assert (row["status"], row["call_started_at"]) == ("cancelled", None)


RACE_ROUNDS = 24


async def test_approve_racing_a_pause_never_calls_after_the_pause(
    mcp: Scene, engine: AsyncEngine
) -> None:
    """Each round: a parked run, then its owner's approval and an admin's pause at the same
    moment. Whichever commits first, the ticket is made at most once, never when the pause came
    first, and a call that was made started before the pause's answer."""

    def reply(request: dict[str, Any]) -> Any:
        if request["messages"][-1]["role"] == "tool":
            return text_reply("done")
        return tool_reply(FakeToolCall(CREATE, {"title": "Renew the TLS certificate"}))

    mcp.fake_openai.script(reply)
    agent = await mcp.agent()
    owner, admin, gql = agent.owner, mcp.admin.id, mcp.gql
    for _ in range(RACE_ROUNDS):
        calls_before = len(mcp.tickets.calls_of("create_ticket"))
        run_id = await mcp.start(agent)
        approval = await parked(mcp, run_id, owner)

        async def paused_at() -> float:
            await gql.data(PAUSE, {"id": agent.id, "paused": True}, as_user=admin, admin=True)
            return time.time()

        decided, pause_answered = await asyncio.gather(
            gql.body(DECIDE, {"id": approval, "approve": True}, as_user=owner), paused_at()
        )
        run = await gql.finished_run(run_id, as_user=owner)
        [row] = await fetch(
            engine,
            "SELECT status, extract(epoch FROM call_started_at) AS started"
            " FROM tool_approvals WHERE id = :id",
            id=int(approval),
        )
        calls = len(mcp.tickets.calls_of("create_ticket")) - calls_before
        if decided.get("errors"):  # the pause came first
            assert error_code(decided) == "CONFLICT"
            assert calls == 0 and row["status"] == "cancelled"
        elif row["started"] is not None:  # called before the pause committed
            assert calls == 1 and run["state"] == "SUCCEEDED"
            assert float(row["started"]) <= pause_answered
        else:  # approved, then stopped by the pause before the call
            assert calls == 0 and (run["state"], run["reason"]) == ("FAILED", "CANCELLED")
            assert row["status"] == "cancelled"
        await gql.data(PAUSE, {"id": agent.id, "paused": False}, as_user=admin, admin=True)


async def test_a_run_whose_agent_was_paused_while_it_ran_does_not_park(
    mcp: Scene, engine: AsyncEngine
) -> None:
    """The pause finds no parked run (the model is still answering); the park then finds the
    agent paused and ends the run instead of asking its owner."""
    agent = await mcp.agent()
    mcp.fake_openai.hold()
    _, run_id = await start_write(mcp, agent)

    async def answering() -> bool:
        return mcp.fake_openai.active_requests == 1

    await eventually(answering, what="the model call to arrive")
    await pause(mcp, agent)
    mcp.fake_openai.release()

    async def ended() -> dict[str, Any] | None:
        run = await stored_run(engine, run_id)
        return run if run["state"] != "running" else None

    run = await eventually(ended, what=f"run {run_id} to end")
    assert (run["state"], run["reason"]) == ("failed", "cancelled")
    assert run["error"] == RESUME_STOP_MESSAGES[ResumeStop.ADMIN_PAUSED]
    assert run["tokens_used"] > 0  # the model call that asked counts
    assert await fetch(engine, "SELECT id FROM tool_approvals") == []
    steps = await fetch(
        engine,
        "SELECT index, error, finished_at FROM agent_run_steps WHERE run_id = :id ORDER BY index",
        id=int(run_id),
    )
    assert steps[1]["error"] == RESUME_STOP_MESSAGES[ResumeStop.ADMIN_PAUSED]
    assert all(step["finished_at"] is not None for step in steps)
    assert mcp.tickets.calls_of("create_ticket") == []
