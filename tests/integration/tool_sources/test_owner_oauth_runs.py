"""Scheduled runs of OWNER_OAUTH tools against the real OAuth test servers (an authorization
server and the MCP ticket server as its resource server, processes of their own) and the real
worker: each owner's agent creates its ticket as that owner's account, and a run whose owner has
not connected waits for them -- connecting in the browser resumes it, the call is made once."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import dramatiq
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from agent_engine.db import connections as connections_db
from agent_engine.oauth.keys import ENV as KEYS_ENV
from agent_engine.oauth.keys import TokenKeys
from agent_engine.oauth.store import access_purpose
from agent_engine.runs.scheduler import schedule_due_agents
from agent_engine.settings import Settings
from agent_engine.testing.fake_openai import FakeOpenAIServer, FakeToolCall, text_reply, tool_reply
from agent_engine.workers.actors import worker_context
from agent_engine.workers.broker import enqueue_execute
from tests.integration.api.subscriptions.support import Server
from tests.integration.runs.support import FakeAgent, eventually, fetch
from tests.integration.runs.transcript.support import Gql
from tests.integration.tool_sources.conftest import ATTACH, Admin
from tests.integration.tool_sources.oauth_support import (
    DISCONNECT,
    OAUTH_SOURCE,
    OAuthServers,
    connected,
    oauth_servers,
)

KEY = base64.b64encode(b"K" * 32).decode()
CREATE = "tickets__create_ticket"
EVERY_6H = {"type": "interval", "every_hours": 6}
ALLOW = "mutation($id: ID!) { setToolAllowed(toolId: $id, allowed: true) { id } }"
AUTO = """
mutation($agent: ID!, $tool: ID!) {
  setToolAutoApproved(agentId: $agent, toolId: $tool, autoApproved: true) { id }
}
"""
RUN = """
query($id: ID!) {
  run(id: $id) {
    id state trigger output waitingFor
    pendingConnection { sourceName status }
    steps { kind name authority account error }
  }
}
"""
RUNS = "query($id: ID!) { agent(id: $id) { runs(first: 5) { edges { node { id } } } } }"


@pytest.fixture
def oauth() -> Iterator[OAuthServers]:
    with oauth_servers() as servers:
        yield servers


@pytest.fixture
async def tickets(
    settings: Settings,
    server: Server,
    monkeypatch: pytest.MonkeyPatch,
    admin: Admin,
    oauth: OAuthServers,
) -> dict[str, Any]:
    """The OAuth-protected ticket server registered as OWNER_OAUTH; its create tool allowed."""
    settings.public_url = server.url
    settings.token_keys = KEY
    monkeypatch.setenv(KEYS_ENV, KEY)
    data = await admin.gql.data(
        OAUTH_SOURCE,
        {"input": {"name": "tickets", "url": oauth.resource, "auth": "OWNER_OAUTH"}},
        as_user=admin.id,
        admin=True,
    )
    source: dict[str, Any] = data["upsertToolSource"]
    # The server lists its tools to a signed-in caller only: the admin's own connection.
    await connected(admin.gql, source["id"], admin.id, "admin@corp.example")
    tools = (await admin.sync(source["id"]))["tools"]
    source["create_id"] = next(t["id"] for t in tools if t["name"] == CREATE)
    await admin.gql.data(ALLOW, {"id": source["create_id"]}, as_user=admin.id, admin=True)
    return source


async def scheduled_agent(
    gql: Gql, fake_agent: FakeAgent, tool_id: str, next_run_at: datetime
) -> dict[str, Any]:
    """An owner's scheduled agent with the create tool, auto-approved (no approval step)."""
    agent = await fake_agent(schedule=EVERY_6H, next_run_at=next_run_at)
    owner = int(agent["user_id"])
    await gql.data(ATTACH, {"agent": str(agent["id"]), "tool": tool_id}, as_user=owner)
    await gql.data(AUTO, {"agent": str(agent["id"]), "tool": tool_id}, as_user=owner)
    return agent


async def the_run(gql: Gql, agent: dict[str, Any]) -> str:
    async def started() -> str | None:
        data = await gql.data(RUNS, {"id": str(agent["id"])}, as_user=int(agent["user_id"]))
        edges = data["agent"]["runs"]["edges"]
        return edges[0]["node"]["id"] if edges else None

    run_id: str = await eventually(started, what="the scheduled run")
    return run_id


async def test_scheduled_runs_act_as_their_owners_and_one_waits_for_its_owner_to_connect(
    tickets: dict[str, Any],
    oauth: OAuthServers,
    gql: Gql,
    engine: AsyncEngine,
    fake_agent: FakeAgent,
    fake_openai: FakeOpenAIServer,
    worker: dramatiq.Worker,
) -> None:
    now = datetime.now(UTC)
    alice_agent = await scheduled_agent(
        gql, fake_agent, tickets["create_id"], now - timedelta(minutes=2)
    )
    bob_agent = await scheduled_agent(
        gql, fake_agent, tickets["create_id"], now + timedelta(hours=1)
    )
    alice, bob = int(alice_agent["user_id"]), int(bob_agent["user_id"])
    await connected(gql, tickets["id"], alice, "alice@corp.example")

    # Alice's agent is due: its run calls with her account.
    fake_openai.enqueue(
        tool_reply(FakeToolCall(CREATE, {"title": "Alice's ticket"})), text_reply("filed")
    )
    await schedule_due_agents(engine, now=now, batch_size=10, enqueue=enqueue_execute)
    alice_run = await gql.finished_run(await the_run(gql, alice_agent), as_user=alice)
    assert (alice_run["state"], alice_run["output"]) == ("SUCCEEDED", "filed")

    # Bob's is due and Bob has not connected: the run waits, no worker holds it, no call.
    fake_openai.enqueue(tool_reply(FakeToolCall(CREATE, {"title": "Bob's ticket"})))
    await schedule_due_agents(
        engine, now=now + timedelta(hours=2), batch_size=10, enqueue=enqueue_execute
    )
    bob_run_id = await the_run(gql, bob_agent)

    async def waits() -> dict[str, Any] | None:
        run: dict[str, Any] = (await gql.data(RUN, {"id": bob_run_id}, as_user=bob))["run"]
        return run if run["waitingFor"] == "CONNECTION" else None

    waiting = await eventually(waits, what="Bob's run to wait for his connection")
    assert waiting["trigger"] == "SCHEDULED" and waiting["state"] == "RUNNING"
    assert waiting["pendingConnection"] == {"sourceName": "tickets", "status": "NOT_CONNECTED"}
    assert worker_context().in_flight.running == 0
    assert [c["arguments"]["title"] for c in oauth.resource_state()["calls"]] == ["Alice's ticket"]

    # Bob connects in his browser: the callback resumes his run on a worker.
    fake_openai.enqueue(text_reply("filed for Bob"))
    page = await connected(gql, tickets["id"], bob, "bob@corp.example")
    assert page.status_code == 200
    bob_run = await gql.finished_run(bob_run_id, as_user=bob)

    assert (bob_run["state"], bob_run["output"]) == ("SUCCEEDED", "filed for Bob")
    calls = oauth.resource_state()["calls"]
    assert [(c["arguments"]["title"], c["subject"]) for c in calls] == [
        ("Alice's ticket", "alice@corp.example"),
        ("Bob's ticket", "bob@corp.example"),
    ]
    steps = (await gql.data(RUN, {"id": bob_run_id}, as_user=bob))["run"]["steps"]
    assert [(s["kind"], s["authority"], s["account"]) for s in steps] == [
        ("MODEL_CALL", None, None),
        ("TOOL_CALL", "OWNER_OAUTH", "bob@corp.example"),
        ("MODEL_CALL", None, None),
    ]

    # Bob disconnects: his agent's next run waits for him again.
    await gql.data(DISCONNECT, {"id": tickets["id"]}, as_user=bob)
    fake_openai.enqueue(tool_reply(FakeToolCall(CREATE, {"title": "Bob's second ticket"})))
    again = await gql.start(str(bob_agent["id"]), as_user=bob)

    async def waits_again() -> dict[str, Any] | None:
        run: dict[str, Any] = (await gql.data(RUN, {"id": again}, as_user=bob))["run"]
        return run if run["waitingFor"] == "CONNECTION" else None

    await eventually(waits_again, what="Bob's next run to wait for him again")
    assert len(oauth.resource_state()["calls"]) == 2


async def test_a_token_the_server_refuses_expires_the_connection_and_the_run_names_the_source(
    tickets: dict[str, Any],
    oauth: OAuthServers,
    gql: Gql,
    engine: AsyncEngine,
    fake_agent: FakeAgent,
    fake_openai: FakeOpenAIServer,
    worker: dramatiq.Worker,
) -> None:
    agent = await scheduled_agent(
        gql, fake_agent, tickets["create_id"], datetime.now(UTC) + timedelta(hours=1)
    )
    owner, source_id = int(agent["user_id"]), int(tickets["id"])
    # A connection whose token the server no longer honours (here: one it never issued).
    async with engine.begin() as conn:
        await connections_db.save_connected(
            conn,
            owner_id=owner,
            source_id=source_id,
            account="carol@corp.example",
            scopes=[],
            access=TokenKeys.parse(KEY).encrypt("forged-token", access_purpose(owner, source_id)),
            refresh=None,
            expires_at=None,
        )
    fake_openai.enqueue(tool_reply(FakeToolCall(CREATE, {"title": "Carol's ticket"})))

    run = await gql.finished_run(await gql.start(str(agent["id"]), as_user=owner), as_user=owner)

    assert (run["state"], run["reason"]) == ("FAILED", "ERROR")
    assert "tool source tickets refused the owner's account (HTTP 401)" in run["error"]
    assert "forged-token" not in run["error"] and "127.0.0.1" not in run["error"]
    assert oauth.resource_state()["calls"] == []
    async with engine.connect() as conn:
        row = await connections_db.fetch_connection(conn, owner, source_id)
    assert row is not None and row.status == connections_db.EXPIRED
    expired = await fetch(engine, "SELECT * FROM audit_log WHERE action = 'connection.expired'")
    assert [e["user_id"] for e in expired] == [owner]

    # The next run waits for the owner to connect again, and says the account expired.
    fake_openai.enqueue(tool_reply(FakeToolCall(CREATE, {"title": "Carol's ticket"})))
    again = await gql.start(str(agent["id"]), as_user=owner)

    async def waits() -> dict[str, Any] | None:
        found: dict[str, Any] = (await gql.data(RUN, {"id": again}, as_user=owner))["run"]
        return found if found["waitingFor"] == "CONNECTION" else None

    waiting = await eventually(waits, what="the next run to wait for the connection")
    assert waiting["pendingConnection"] == {"sourceName": "tickets", "status": "EXPIRED"}
