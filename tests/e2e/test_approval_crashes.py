"""Crashes around a write tool that waits for the owner: the worker is SIGKILLed while the run is
parked, and while the approved call is on its way to the MCP server. Real processes (api, worker,
clock), the real MCP ticket server.

What the user sees: the parked run survives its worker and finishes on another once approved,
with one call; a call whose worker died mid-flight is never made again -- the run fails (stale)
and the server has seen it once, whatever messages and ticks follow.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

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
mutation($i: ToolSourceInput!) { upsertToolSource(input: $i) { lastError tools { id name } } }
"""
ALLOW = "mutation($t: ID!) { setToolAllowed(toolId: $t, allowed: true) { id } }"
ATTACH = "mutation($a: ID!, $t: ID!) { attachTool(agentId: $a, toolId: $t) { id } }"
START = "mutation($id: ID!) { startRun(agentId: $id) { id state } }"
PENDING = "query($id: ID!) { run(id: $id) { state pendingApproval { id } } }"
DECIDE = "mutation($id: ID!) { decideToolCall(approvalId: $id, approve: true) { status } }"


@pytest.fixture
def tickets() -> Iterator[TicketServer]:
    with TicketServer() as server:
        yield server


async def _parked_run(
    running: Stack, factories: Factories, fake: FakeOpenAIServer, tickets: TicketServer
) -> tuple[Client, str, str]:
    """An owner's run parked on a create_ticket call; (owner client, run id, approval id)."""
    api = await running.api()
    admin = (await factories.user())["id"]
    owner = (await factories.user())["id"]
    admin_client = Client(api.url or "", bearer=token(running.settings, admin, admin=True))
    client = Client(api.url or "", bearer=token(running.settings, owner))
    try:
        source = (await admin_client.data(UPSERT, {"i": {"name": "tickets", "url": tickets.url}}))[
            "upsertToolSource"
        ]
        assert source["lastError"] is None
        tool_id = next(t["id"] for t in source["tools"] if t["name"] == CREATE)
        await admin_client.data(ALLOW, {"t": tool_id})
    finally:
        await admin_client.aclose()
    model = await fake_model(factories, fake)
    agent = await factories.agent(user_id=owner, model_id=model["id"])
    await client.data(ATTACH, {"a": str(agent["id"]), "t": tool_id})
    fake.enqueue(
        tool_reply(FakeToolCall(CREATE, {"title": "Renew the certificate"})),
        text_reply("Opened."),
    )
    run_id = (await client.data(START, {"id": str(agent["id"])}))["startRun"]["id"]

    async def approval() -> str | None:
        run = (await client.data(PENDING, {"id": run_id}))["run"]
        return run["pendingApproval"]["id"] if run["pendingApproval"] else None

    approval_id: str = await eventually(approval, within=30, what="the run to park")
    return client, run_id, approval_id


async def _run(engine: AsyncEngine, run_id: str) -> dict[str, Any]:
    [row] = await fetch(
        engine, "SELECT state, reason, error FROM agent_runs WHERE id = :i", i=int(run_id)
    )
    return row


async def _stale_enough(engine: AsyncEngine, run_id: str, stale_after_seconds: float) -> bool:
    [row] = await fetch(
        engine,
        "SELECT heartbeat_at < now() - make_interval(secs => :s) AS stale"
        " FROM agent_runs WHERE id = :i",
        s=stale_after_seconds,
        i=int(run_id),
    )
    return bool(row["stale"])


async def _barrier_run(
    engine: AsyncEngine, client: Client, factories: Factories, fake: FakeOpenAIServer
) -> None:
    """A run of another agent of the owner, started after what came before and ended."""
    owner = (await client.data("{ viewer { user { id } } }"))["viewer"]["user"]["id"]
    model = await fake_model(factories, fake)
    agent = await factories.agent(user_id=int(owner), model_id=model["id"])
    fake.enqueue(text_reply("barrier"))
    barrier = (await client.data(START, {"id": str(agent["id"])}))["startRun"]["id"]
    await eventually(lambda: all_terminal(engine, [int(barrier)]), within=60, what="the barrier")


async def test_sigkill_while_parked_the_run_finishes_on_another_worker_with_one_call(
    engine: AsyncEngine,
    factories: Factories,
    fake_openai: FakeOpenAIServer,  # noqa: F811
    stack: Stack,  # noqa: F811
    tickets: TicketServer,
) -> None:
    victim = stack.worker(threads=2)
    stack.clock()
    client, run_id, approval_id = await _parked_run(stack, factories, fake_openai, tickets)
    try:
        victim.kill()
        # The parked run has no heartbeat to miss: once its last one is older than the stale
        # limit, two reap ticks (run by a second worker, with nothing to resume yet) leave it
        # waiting.
        survivor = stack.worker(threads=2)
        await eventually(
            lambda: _stale_enough(engine, run_id, stack.settings.stale_after_seconds),
            what="the parked run's last heartbeat to be older than the stale limit",
        )
        await more_ticks(engine, 2, tick="reap")
        assert (await _run(engine, run_id))["state"] == "running"
        survivor.kill()
        # Decided while no worker runs at all: the message waits in the broker.
        assert (await client.data(DECIDE, {"id": approval_id}))["decideToolCall"] == {
            "status": "APPROVED"
        }
        stack.worker(threads=2)
        await eventually(lambda: all_terminal(engine, [int(run_id)]), within=60, what="the run")

        assert (await _run(engine, run_id))["state"] == "succeeded"
        assert len(tickets.calls_of("create_ticket")) == 1
        assert await invariant_violations(engine) == []
    finally:
        await client.aclose()


async def test_sigkill_during_the_approved_call_is_never_followed_by_a_second_call(
    engine: AsyncEngine,
    factories: Factories,
    fake_openai: FakeOpenAIServer,  # noqa: F811
    stack: Stack,  # noqa: F811
    tickets: TicketServer,
) -> None:
    victim = stack.worker(threads=2)
    stack.clock()
    client, run_id, approval_id = await _parked_run(stack, factories, fake_openai, tickets)
    try:
        tickets.hold()  # the server takes the call and does not answer
        await client.data(DECIDE, {"id": approval_id})

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
        # More ticks and a re-sent message change nothing: two reap ticks (they also sweep the
        # approvals) and a run sent after the message, ended, are the barrier.
        configure_broker(stack.settings)
        try:
            enqueue_execute(int(run_id))
        finally:
            close_broker()
        await more_ticks(engine, 2, tick="reap")
        await _barrier_run(engine, client, factories, fake_openai)
        assert len(tickets.calls_of("create_ticket")) == 1
        assert (await _run(engine, run_id))["state"] == "failed"
        assert await invariant_violations(engine) == []
    finally:
        await client.aclose()
