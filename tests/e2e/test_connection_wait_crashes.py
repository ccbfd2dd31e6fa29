"""Crashes around a run that waits for its owner's connection (approval first, then the
connection): the worker is SIGKILLed while the run waits, and while the call the connection let go
on is on its way to the MCP server. Real processes (api, worker, clock), the real MCP ticket server.

What the user sees: the run waits for the approval, then for the connection, and survives its
worker dying meanwhile; once the owner connects, the call is made with their token -- and a
worker dying mid-call never leads to a second call: the run fails (stale) and the server has seen
it once, whatever messages and ticks follow.
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


async def _waiting_run(
    running: Stack,
    engine: AsyncEngine,
    factories: Factories,
    fake: FakeOpenAIServer,
    tickets: TicketServer,
) -> tuple[Client, Client, int, int, dict[str, object], str]:
    """An owner's run of an OWNER_OAUTH create_ticket call, approved, now waiting for the owner's
    connection; (owner client, admin client, owner id, source id, model, run id)."""
    api = await running.api()
    admin = (await factories.user())["id"]
    owner = (await factories.user())["id"]
    admin_client = Client(api.url or "", bearer=token(running.settings, admin, admin=True))
    client = Client(api.url or "", bearer=token(running.settings, owner))
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
    model = await fake_model(factories, fake)
    agent = await factories.agent(user_id=owner, model_id=model["id"])
    await client.data(ATTACH, {"a": str(agent["id"]), "t": tool_id})
    fake.enqueue(
        tool_reply(FakeToolCall(CREATE, {"title": "Renew the certificate"})),
        text_reply("Opened."),
    )
    run_id = (await client.data(START, {"id": str(agent["id"])}))["startRun"]["id"]

    async def waits_for(what: str) -> dict[str, object] | None:
        run = (await client.data(WAITING, {"id": run_id}))["run"]
        return run if run["waitingFor"] == what else None

    approval = await eventually(lambda: waits_for("APPROVAL"), within=30, what="the approval")
    pending = approval["pendingApproval"]
    assert isinstance(pending, dict)
    await client.data(DECIDE, {"id": pending["id"]})
    await eventually(lambda: waits_for("CONNECTION"), within=30, what="the connection wait")
    assert tickets.calls_of("create_ticket") == []
    return client, admin_client, owner, int(source_id), model, run_id


async def _connect(engine: AsyncEngine, running: Stack, owner: int, source_id: int) -> list[int]:
    """The owner's account stored as the callback stores it; the waiting runs sent on."""
    keys = TokenKeys.parse(KEYS)
    async with engine.begin() as conn:
        await connections_db.save_connected(
            conn,
            owner_id=owner,
            source_id=source_id,
            account="owner@tickets",
            scopes=[],
            access=keys.encrypt("owner-token", access_purpose(owner, source_id)),
            refresh=None,
            expires_at=None,
        )
    configure_broker(running.settings)
    try:
        return await connection_waits.on_connected(
            engine, owner, source_id, enqueue=enqueue_execute
        )
    finally:
        close_broker()


async def test_sigkill_while_waiting_for_the_connection_the_run_finishes_on_another_worker(
    engine: AsyncEngine,
    factories: Factories,
    fake_openai: FakeOpenAIServer,  # noqa: F811
    stack: Stack,  # noqa: F811
    tickets: TicketServer,
) -> None:
    victim = stack.worker(threads=2)
    stack.clock()
    client, admin_client, owner, source_id, _, run_id = await _waiting_run(
        stack, engine, factories, fake_openai, tickets
    )
    try:
        victim.kill()
        # Reap ticks while no worker holds it leave it waiting (it has no heartbeat to miss).
        survivor = stack.worker(threads=2)
        await more_ticks(engine, 2, tick="reap")
        assert (await _run(engine, run_id))["state"] == "running"
        survivor.kill()
        # Connected while no worker runs at all: the message waits in the broker.
        assert await _connect(engine, stack, owner, source_id) == [int(run_id)]
        stack.worker(threads=2)
        await eventually(lambda: all_terminal(engine, [int(run_id)]), within=60, what="the run")

        assert (await _run(engine, run_id))["state"] == "succeeded"
        [call] = tickets.calls_of("create_ticket")
        assert call.authorization == "Bearer owner-token"
        assert await invariant_violations(engine) == []
    finally:
        await client.aclose()
        await admin_client.aclose()


async def test_sigkill_during_the_call_after_connecting_is_never_followed_by_a_second_call(
    engine: AsyncEngine,
    factories: Factories,
    fake_openai: FakeOpenAIServer,  # noqa: F811
    stack: Stack,  # noqa: F811
    tickets: TicketServer,
) -> None:
    victim = stack.worker(threads=2)
    stack.clock()
    client, admin_client, owner, source_id, model, run_id = await _waiting_run(
        stack, engine, factories, fake_openai, tickets
    )
    try:
        # The owner connects; the server takes the call and does not answer.
        tickets.hold()
        assert await _connect(engine, stack, owner, source_id) == [int(run_id)]

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
