"""Calls that carry the owner's own account (OWNER_OAUTH), and runs that wait for it, against the
real MCP ticket server and the real worker: each owner's call carries that owner's token and
nothing else; a call without a CONNECTED account parks the run (no call, no worker holds it) until
the owner connects, then it is made once; expiry tells the model; cancel and a pause end the wait;
approval first, then connection, still one call.

The connections are written through the db layer with the real token keys (the OAuth flow that
writes them is tested on its own); the server records the Authorization header each call sent.
"""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from agent_engine.db import connections as connections_db
from agent_engine.domain.gate import RESUME_STOP_MESSAGES, ResumeStop
from agent_engine.oauth.keys import ENV as TOKEN_KEYS_ENV
from agent_engine.oauth.keys import TokenKeys, new_key
from agent_engine.oauth.store import access_purpose
from agent_engine.runs import connection_waits
from agent_engine.settings import Settings
from agent_engine.testing.fake_openai import FakeToolCall, text_reply, tool_reply
from agent_engine.workers.actors import worker_context
from agent_engine.workers.broker import enqueue_execute
from tests.integration.runs.support import eventually, fetch
from tests.integration.runs.transcript.support import CANCEL, Gql
from tests.integration.tool_sources.conftest import ATTACH, TOKEN, McpAgent, Scene
from tests.integration.tool_sources.test_resume_gate import (
    Action,
    deactivate,
    delete,
    pause,
    remove_model,
    switch_off,
)

SEARCH = "tickets__search_tickets"
CREATE = "tickets__create_ticket"
RUN = """
query($id: ID!) {
  run(id: $id) {
    id state reason error output tokensUsed waitingFor
    pendingApproval { id status }
    pendingConnection { sourceId sourceName status account }
    steps { index kind name output error authority account approval { id status } }
  }
}
"""
DECIDE = """
mutation($id: ID!) { decideToolCall(approvalId: $id, approve: true) { id status } }
"""


@pytest.fixture
def settings(settings: Settings) -> Settings:
    return settings.model_copy(update={"queued_resend_after_seconds": 0.1})


@pytest.fixture(autouse=True)
def token_keys(monkeypatch: pytest.MonkeyPatch) -> TokenKeys:
    value = new_key()
    monkeypatch.setenv(TOKEN_KEYS_ENV, value)
    return TokenKeys.parse(value)


async def owner_oauth_agent(mcp: Scene, engine: AsyncEngine) -> tuple[McpAgent, int]:
    """An agent with the ticket tools, their source switched to OWNER_OAUTH; (agent, source id)."""
    agent = await mcp.agent()
    return agent, await to_owner_oauth(engine)


async def to_owner_oauth(engine: AsyncEngine) -> int:
    """The ticket source made OWNER_OAUTH (as an admin's upsert with `auth` does); its id."""
    async with engine.begin() as conn:
        source_id = (
            await conn.execute(
                text(
                    "UPDATE tool_sources SET auth = 'owner_oauth', auth_env = NULL"
                    " WHERE name = 'tickets' RETURNING id"
                )
            )
        ).scalar_one()
    return int(source_id)


async def another_agent(mcp: Scene, first: McpAgent) -> McpAgent:
    """A second owner's agent with the same ticket tools."""
    row = await mcp.fake_agent()
    for tool_id in first.tools.values():
        await mcp.gql.data(
            ATTACH, {"agent": str(row["id"]), "tool": tool_id}, as_user=int(row["user_id"])
        )
    return McpAgent(row, first.tools)


async def connect(
    engine: AsyncEngine, keys: TokenKeys, owner: int, source_id: int, token: str, account: str
) -> None:
    """The owner's account, as the OAuth callback stores it (encrypted)."""
    async with engine.begin() as conn:
        await connections_db.save_connected(
            conn,
            owner_id=owner,
            source_id=source_id,
            account=account,
            scopes=["tickets"],
            access=keys.encrypt(token, access_purpose(owner, source_id)),
            refresh=None,
            expires_at=None,
        )


async def run_view(gql: Gql, run_id: str, *, as_user: int, admin: bool = False) -> dict[str, Any]:
    data = await gql.data(RUN, {"id": run_id}, as_user=as_user, admin=admin)
    run: dict[str, Any] = data["run"]
    return run


async def waiting(gql: Gql, run_id: str, *, as_user: int, wait: str) -> dict[str, Any]:
    async def probe() -> dict[str, Any] | None:
        run = await run_view(gql, run_id, as_user=as_user)
        return run if run["waitingFor"] == wait else None

    await eventually(probe, what=f"run {run_id} to wait for {wait}")
    return await run_view(gql, run_id, as_user=as_user)


def search(mcp: Scene, final: str = "done") -> None:
    mcp.fake_openai.enqueue(
        tool_reply(FakeToolCall(SEARCH, {"query": "certificate"}), prompt_tokens=30),
        text_reply(final),
    )


async def test_each_owners_call_carries_their_own_token_and_nothing_else(
    mcp: Scene, engine: AsyncEngine, token_keys: TokenKeys
) -> None:
    alice = await mcp.agent()
    bob = await another_agent(mcp, alice)
    source_id = await to_owner_oauth(engine)
    await connect(engine, token_keys, alice.owner, source_id, "alice-token", "alice@tickets")
    await connect(engine, token_keys, bob.owner, source_id, "bob-token", "bob@tickets")

    opened = mcp.tickets.state.sessions
    search(mcp)
    alice_run = await mcp.finished(alice)
    search(mcp)
    bob_run = await mcp.finished(bob)
    search(mcp)
    await mcp.finished(alice)

    assert alice_run["state"] == bob_run["state"] == "SUCCEEDED"
    first, second, _ = mcp.tickets.calls_of("search_tickets")
    # The owner's token, never the shared credential the source had (still in the environment).
    assert first.authorization == "Bearer alice-token"
    assert second.authorization == "Bearer bob-token"
    assert TOKEN not in {first.authorization, second.authorization}
    assert mcp.tickets.calls_of("search_tickets")[2].authorization == "Bearer alice-token"
    # One session per (owner, server): Alice's second run paid no handshake.
    assert mcp.tickets.state.sessions - opened == 2
    # `_meta` still names who acts (a hint beside the token).
    assert first.meta["agentEngine/userId"] == str(alice.owner)
    step = (await run_view(mcp.gql, alice_run["id"], as_user=alice.owner))["steps"][1]
    assert (step["authority"], step["account"]) == ("OWNER_OAUTH", "alice@tickets")
    # Another viewer (an admin) sees the authority, not the owner's account.
    admin_step = (await run_view(mcp.gql, alice_run["id"], as_user=mcp.admin.id, admin=True))[
        "steps"
    ][1]
    assert (admin_step["authority"], admin_step["account"]) == ("OWNER_OAUTH", None)


async def test_a_shared_source_step_says_shared(mcp: Scene) -> None:
    agent = await mcp.agent()
    search(mcp)
    run = await mcp.finished(agent)

    [call] = mcp.tickets.calls_of("search_tickets")
    assert call.authorization == f"Bearer {TOKEN}"
    step = (await run_view(mcp.gql, run["id"], as_user=agent.owner))["steps"][1]
    assert (step["authority"], step["account"]) == ("SHARED", None)


async def test_a_run_without_a_connection_waits_then_resumes_when_the_owner_connects(
    mcp: Scene, engine: AsyncEngine, token_keys: TokenKeys
) -> None:
    gql = mcp.gql
    agent, source_id = await owner_oauth_agent(mcp, engine)
    search(mcp)
    run_id = await mcp.start(agent)

    run = await waiting(gql, run_id, as_user=agent.owner, wait="CONNECTION")

    assert run["state"] == "RUNNING"
    assert run["pendingApproval"] is None
    assert run["pendingConnection"] == {
        "sourceId": str(source_id),
        "sourceName": "tickets",
        "status": "NOT_CONNECTED",
        "account": None,
    }
    assert mcp.tickets.calls_of("search_tickets") == []
    assert worker_context().in_flight.running == 0  # no worker holds it
    assert run["tokensUsed"] > 0  # the answered model call counts while it waits

    await connect(engine, token_keys, agent.owner, source_id, "alice-token", "alice@tickets")
    resumed = await connection_waits.on_connected(
        engine, agent.owner, source_id, enqueue=enqueue_execute
    )
    assert resumed == [int(run_id)]
    finished = await gql.finished_run(run_id, as_user=agent.owner)

    assert (finished["state"], finished["output"]) == ("SUCCEEDED", "done")
    [call] = mcp.tickets.calls_of("search_tickets")
    assert call.authorization == "Bearer alice-token"
    view = await run_view(gql, run_id, as_user=agent.owner)
    assert view["waitingFor"] is None and view["pendingConnection"] is None
    assert [(s["kind"], s["authority"], s["account"]) for s in view["steps"]] == [
        ("MODEL_CALL", None, None),
        ("TOOL_CALL", "OWNER_OAUTH", "alice@tickets"),
        ("MODEL_CALL", None, None),
    ]
    # A re-sent message resumes nothing and calls nothing.
    for _ in range(3):
        enqueue_execute(int(run_id))
    await mcp.barrier()
    assert len(mcp.tickets.calls_of("search_tickets")) == 1


async def test_an_unanswered_wait_expires_and_the_model_hears_not_connected(
    mcp: Scene, engine: AsyncEngine
) -> None:
    agent, _ = await owner_oauth_agent(mcp, engine)
    search(mcp, final="I could not search")
    run_id = await mcp.start(agent)
    await waiting(mcp.gql, run_id, as_user=agent.owner, wait="CONNECTION")
    async with engine.begin() as conn:  # as if AGENT_ENGINE_APPROVAL_TIMEOUT_SECONDS had passed
        await conn.execute(
            text("UPDATE connection_waits SET expires_at = now() WHERE run_id = :id"),
            {"id": int(run_id)},
        )

    sent = await connection_waits.sweep(engine, enqueue=enqueue_execute, resend_after_seconds=3600)
    finished = await mcp.gql.finished_run(run_id, as_user=agent.owner)

    assert sent == 1
    assert (finished["state"], finished["output"]) == ("SUCCEEDED", "I could not search")
    assert mcp.tickets.calls_of("search_tickets") == []
    assert mcp.tool_messages()[0].startswith("error: the account at tickets is not connected")
    step = (await run_view(mcp.gql, run_id, as_user=agent.owner))["steps"][1]
    assert step["error"].startswith("the account at tickets is not connected")
    assert step["authority"] == "OWNER_OAUTH"


async def test_cancelling_a_run_that_waits_for_a_connection_ends_the_wait(
    mcp: Scene, engine: AsyncEngine, token_keys: TokenKeys
) -> None:
    agent, source_id = await owner_oauth_agent(mcp, engine)
    search(mcp)
    run_id = await mcp.start(agent)
    await waiting(mcp.gql, run_id, as_user=agent.owner, wait="CONNECTION")

    cancelled = (await mcp.gql.data(CANCEL, {"id": run_id}, as_user=agent.owner))["cancelRun"]

    assert (cancelled["state"], cancelled["reason"]) == ("FAILED", "CANCELLED")
    view = await run_view(mcp.gql, run_id, as_user=agent.owner)
    assert view["waitingFor"] is None and view["pendingConnection"] is None
    # Connecting later resumes nothing.
    await connect(engine, token_keys, agent.owner, source_id, "alice-token", "alice@tickets")
    assert await connection_waits.on_connected(engine, agent.owner, source_id) == []
    enqueue_execute(int(run_id))
    await mcp.barrier()
    assert mcp.tickets.calls_of("search_tickets") == []


@pytest.mark.parametrize(
    ("action", "stop"),
    [
        (pause, ResumeStop.ADMIN_PAUSED),
        (switch_off, ResumeStop.DISABLED),
        (deactivate, ResumeStop.OWNER_INACTIVE),
        (remove_model, ResumeStop.NO_MODEL),
        (delete, ResumeStop.DELETED),
    ],
    ids=["admin-pause", "owner-switch-off", "owner-deactivated", "model-removed", "deleted"],
)
async def test_closing_the_gate_ends_a_run_waiting_for_a_connection(
    mcp: Scene, engine: AsyncEngine, token_keys: TokenKeys, action: Action, stop: ResumeStop
) -> None:
    agent, source_id = await owner_oauth_agent(mcp, engine)
    search(mcp)
    run_id = await mcp.start(agent)
    await waiting(mcp.gql, run_id, as_user=agent.owner, wait="CONNECTION")

    await action(mcp, agent)

    [run] = await fetch(
        engine, "SELECT state, reason, error FROM agent_runs WHERE id = :id", id=int(run_id)
    )
    assert (run["state"], run["reason"], run["error"]) == (
        "failed",
        "cancelled",
        RESUME_STOP_MESSAGES[stop],
    )
    [wait] = await fetch(
        engine,
        "SELECT w.status, s.error FROM connection_waits w JOIN agent_run_steps s"
        " ON s.run_id = w.run_id AND s.index = w.step_index WHERE w.run_id = :id",
        id=int(run_id),
    )
    assert (wait["status"], wait["error"]) == ("cancelled", RESUME_STOP_MESSAGES[stop])
    # Connecting afterwards resumes nothing and calls nothing.
    await connect(engine, token_keys, agent.owner, source_id, "alice-token", "alice@tickets")
    assert await connection_waits.on_connected(engine, agent.owner, source_id) == []
    assert mcp.tickets.calls_of("search_tickets") == []


async def test_approval_first_then_the_connection_and_the_call_is_made_once(
    mcp: Scene, engine: AsyncEngine, token_keys: TokenKeys
) -> None:
    gql = mcp.gql
    agent, source_id = await owner_oauth_agent(mcp, engine)
    mcp.fake_openai.enqueue(tool_reply(FakeToolCall(CREATE, {"title": "Rotate the keys"})))
    run_id = await mcp.start(agent)
    approval = (await waiting(gql, run_id, as_user=agent.owner, wait="APPROVAL"))["pendingApproval"]
    assert approval["status"] == "PENDING"

    await gql.data(DECIDE, {"id": approval["id"]}, as_user=agent.owner)
    run = await waiting(gql, run_id, as_user=agent.owner, wait="CONNECTION")

    assert run["pendingConnection"]["sourceName"] == "tickets"
    assert mcp.tickets.calls_of("create_ticket") == []
    # Messages for the (approved) approval do not take the run back while it waits.
    for _ in range(3):
        enqueue_execute(int(run_id))
    await mcp.barrier()
    assert (await run_view(gql, run_id, as_user=agent.owner))["waitingFor"] == "CONNECTION"

    mcp.fake_openai.enqueue(text_reply("filed"))  # the model's answer after the call
    await connect(engine, token_keys, agent.owner, source_id, "alice-token", "alice@tickets")
    await connection_waits.on_connected(engine, agent.owner, source_id, enqueue=enqueue_execute)
    for _ in range(5):  # duplicates racing the resume
        enqueue_execute(int(run_id))
    finished = await gql.finished_run(run_id, as_user=agent.owner)

    assert (finished["state"], finished["output"]) == ("SUCCEEDED", "filed")
    await mcp.barrier()
    [call] = mcp.tickets.calls_of("create_ticket")
    assert call.authorization == "Bearer alice-token"
    steps = (await run_view(gql, run_id, as_user=agent.owner))["steps"]
    assert [s["kind"] for s in steps] == ["MODEL_CALL", "TOOL_CALL", "MODEL_CALL"]
    assert steps[1]["approval"]["status"] == "APPROVED"
    assert (steps[1]["authority"], steps[1]["account"]) == ("OWNER_OAUTH", "alice@tickets")
