"""Crashes around a run that waited for its owner's connection (approval first, then the
connection): the worker is SIGKILLed while the call the connection let go on is on its way to the
MCP server. Real processes (api, worker, clock), the real MCP ticket server.

What the user sees: the run waits for the approval, then for the connection; once the owner
connects, the call is made with their token -- and a worker dying mid-call never leads to a second
call: the run fails (stale) and the server has seen it once, whatever messages and ticks follow.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from agent_engine.db import connections as connections_db
from agent_engine.oauth.keys import TokenKeys, new_key
from agent_engine.oauth.store import access_purpose
from agent_engine.runs import connection_waits
from agent_engine.settings import Settings
from agent_engine.testing.fake_openai import FakeOpenAIServer, FakeToolCall, text_reply, tool_reply
from agent_engine.testing.mcp_tickets import TicketServer
from agent_engine.workers.broker import close_broker, configure_broker, enqueue_execute
from tests.e2e.support import (  # noqa: F401 (fixtures)
    Client,
    Stack,
    all_terminal,
    eventually,
    fake_model,
    fake_openai,
    fetch,
    invariant_violations,
    more_ticks,
    stack,
    token,
)
from tests.support.factories import Factories

pytestmark = pytest.mark.slow

CREATE = "tickets__create_ticket"
UPSERT = """
mutation($i: ToolSourceInput!) { upsertToolSource(input: $i) { id lastError tools { id name } } }
"""
ALLOW = "mutation($t: ID!) { setToolAllowed(toolId: $t, allowed: true) { id } }"
ATTACH = "mutation($a: ID!, $t: ID!) { attachTool(agentId: $a, toolId: $t) { id } }"
START = "mutation($id: ID!) { startRun(agentId: $id) { id state } }"
WAITING = "query($id: ID!) { run(id: $id) { state waitingFor pendingApproval { id } } }"
DECIDE = "mutation($id: ID!) { decideToolCall(approvalId: $id, approve: true) { status } }"
KEYS = new_key()


@pytest.fixture
def settings(settings: Settings) -> Settings:
    """The token keys every process of the stack reads (AGENT_ENGINE_TOKEN_KEYS)."""
    return settings.model_copy(update={"token_keys": KEYS})


@pytest.fixture
def tickets() -> Iterator[TicketServer]:
    with TicketServer() as server:
        yield server


async def _run(engine: AsyncEngine, run_id: str) -> dict[str, object]:
    [row] = await fetch(
        engine, "SELECT state, reason, error FROM agent_runs WHERE id = :i", i=int(run_id)
    )
    return row


async def test_sigkill_during_the_call_after_connecting_is_never_followed_by_a_second_call(
    engine: AsyncEngine,
    factories: Factories,
    fake_openai: FakeOpenAIServer,  # noqa: F811
    stack: Stack,  # noqa: F811
    tickets: TicketServer,
) -> None:
    victim = stack.worker(threads=2)
    stack.clock()
    api = await stack.api()
    admin = (await factories.user())["id"]
    owner = (await factories.user())["id"]
    admin_client = Client(api.url or "", bearer=token(stack.settings, admin, admin=True))
    client = Client(api.url or "", bearer=token(stack.settings, owner))
    try:
        source = (await admin_client.data(UPSERT, {"i": {"name": "tickets", "url": tickets.url}}))[
            "upsertToolSource"
        ]
        tool_id = next(t["id"] for t in source["tools"] if t["name"] == CREATE)
        await admin_client.data(ALLOW, {"t": tool_id})
        async with engine.begin() as conn:  # the admin makes it OWNER_OAUTH
            source_id = (
                await conn.execute(
                    text(
                        "UPDATE tool_sources SET auth = 'owner_oauth' WHERE name = 'tickets'"
                        " RETURNING id"
                    )
                )
            ).scalar_one()
        model = await fake_model(factories, fake_openai)
        agent = await factories.agent(user_id=owner, model_id=model["id"])
        await client.data(ATTACH, {"a": str(agent["id"]), "t": tool_id})
        fake_openai.enqueue(
            tool_reply(FakeToolCall(CREATE, {"title": "Renew the certificate"})),
            text_reply("Opened."),
        )
        run_id = (await client.data(START, {"id": str(agent["id"])}))["startRun"]["id"]

        async def waits_for(what: str) -> dict[str, object] | None:
            run = (await client.data(WAITING, {"id": run_id}))["run"]
            return run if run["waitingFor"] == what else None

        approval = await eventually(lambda: waits_for("APPROVAL"), within=30, what="the approval")
        assert approval is not None
        pending = approval["pendingApproval"]
        assert isinstance(pending, dict)
        await client.data(DECIDE, {"id": pending["id"]})
        await eventually(lambda: waits_for("CONNECTION"), within=30, what="the connection wait")
        assert tickets.calls_of("create_ticket") == []

        # The owner connects; the server takes the call and does not answer.
        tickets.hold()
        keys = TokenKeys.parse(KEYS)
        async with engine.begin() as conn:
            await connections_db.save_connected(
                conn,
                owner_id=owner,
                source_id=int(source_id),
                account="owner@tickets",
                scopes=[],
                access=keys.encrypt("owner-token", access_purpose(owner, int(source_id))),
                refresh=None,
                expires_at=None,
            )
        configure_broker(stack.settings)
        try:
            assert await connection_waits.on_connected(
                engine, owner, int(source_id), enqueue=enqueue_execute
            ) == [int(run_id)]
        finally:
            close_broker()

        async def reached() -> bool:
            return len(tickets.calls_of("create_ticket")) == 1

        await eventually(reached, within=30, what="the call to reach the server")
        victim.kill()
        tickets.release()
        stack.worker(threads=2)
        # The reaper fails the silent run; nothing resumes it or calls again.
        await eventually(lambda: all_terminal(engine, [int(run_id)]), within=60, what="the run")
        row = await _run(engine, run_id)
        assert (row["state"], row["reason"]) == ("failed", "stale")
        configure_broker(stack.settings)
        try:
            enqueue_execute(int(run_id))
        finally:
            close_broker()
        await more_ticks(engine, 2, tick="reap")
        # A barrier: another run of the owner's, started after all that, ended.
        other = await factories.agent(user_id=owner, model_id=model["id"])
        fake_openai.enqueue(text_reply("barrier"))
        barrier = (await client.data(START, {"id": str(other["id"])}))["startRun"]["id"]
        await eventually(lambda: all_terminal(engine, [int(barrier)]), within=60, what="barrier")

        [call] = tickets.calls_of("create_ticket")
        assert call.authorization == "Bearer owner-token"
        assert (await _run(engine, run_id))["state"] == "failed"
        assert await invariant_violations(engine) == []
    finally:
        await client.aclose()
        await admin_client.aclose()
