"""runEvents and budget over graphql-transport-ws, against a real api and a real worker."""

from __future__ import annotations

import asyncio
from typing import Any

import dramatiq
import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from agent_engine.db.platform import WEEKLY_TOKEN_CAP
from agent_engine.settings import Settings
from tests.conftest import Servers
from tests.integration.api.subscriptions.support import (
    BUDGET,
    RUN_EVENTS,
    START_RUN,
    GraphQLWs,
    Server,
    acknowledged_client,
    token,
)
from tests.integration.runs.support import eventually, run_row
from tests.support.factories import Factories

# Long enough for a wrongly delivered event to arrive (they take milliseconds).
QUIET_SECONDS = 1.0


async def start_run(
    http: httpx.AsyncClient, server: Server, bearer: str, agent_id: int
) -> dict[str, Any]:
    response = await http.post(
        f"{server.url}/graphql",
        json={"query": START_RUN, "variables": {"id": str(agent_id)}},
        headers={"Authorization": f"Bearer {bearer}"},
    )
    body = response.json()
    assert response.status_code == 200 and not body.get("errors"), body
    run: dict[str, Any] = body["data"]["startRun"]
    return run


async def transitions(client: GraphQLWs, id: str, count: int) -> list[dict[str, Any]]:
    return [(await client.next_data(id))["runEvents"] for _ in range(count)]


def states(events: list[dict[str, Any]]) -> list[tuple[str | None, str]]:
    return [(e["previousState"], e["run"]["state"]) for e in events]


async def test_a_manual_run_shows_queued_running_succeeded_in_order(
    server: Server,
    http: httpx.AsyncClient,
    settings: Settings,
    factories: Factories,
    engine: AsyncEngine,
    worker: dramatiq.Worker,
) -> None:
    agent = await factories.agent(name="Digest")
    owner = token(settings, agent["user_id"])
    async with acknowledged_client(server, owner) as client:
        await client.subscribe("1", RUN_EVENTS, {"agentId": str(agent["id"])})
        await server.wait_subscribers(1)
        started = await start_run(http, server, owner, agent["id"])
        assert started["state"] == "QUEUED"

        queued, running, succeeded = await transitions(client, "1", 3)

    assert states([queued, running, succeeded]) == [
        (None, "QUEUED"),
        ("QUEUED", "RUNNING"),
        ("RUNNING", "SUCCEEDED"),
    ]
    assert {e["run"]["id"] for e in (queued, running, succeeded)} == {started["id"]}
    assert queued["run"]["agent"] == {"id": str(agent["id"]), "name": "Digest"}
    # Each event shows its own transition, not the row as it is when delivered.
    assert queued["run"]["startedAt"] is None and queued["run"]["output"] is None
    assert running["run"]["startedAt"] is not None and running["run"]["finishedAt"] is None
    stored = await run_row(engine, int(started["id"]))
    assert succeeded["run"]["output"] == stored["output"] and stored["output"]
    assert succeeded["run"]["tokensUsed"] == stored["tokens_used"]
    await server.wait_subscribers(0)  # the socket closed: the subscriber is gone


async def test_a_skipped_run_shows_its_skipped_event(
    server: Server, http: httpx.AsyncClient, settings: Settings, factories: Factories
) -> None:
    agent = await factories.agent()
    await factories.run(agent["id"], state="running")
    owner = token(settings, agent["user_id"])
    async with acknowledged_client(server, owner) as client:
        await client.subscribe("1", RUN_EVENTS)
        await server.wait_subscribers(1)
        started = await start_run(http, server, owner, agent["id"])
        (event,) = await transitions(client, "1", 1)
    assert started["state"] == "SKIPPED"
    assert event["previousState"] is None
    assert (event["run"]["id"], event["run"]["state"], event["run"]["reason"]) == (
        started["id"],
        "SKIPPED",
        "ALREADY_RUNNING",
    )


async def test_the_budget_is_emitted_when_a_run_finishes(
    server: Server,
    http: httpx.AsyncClient,
    settings: Settings,
    factories: Factories,
    engine: AsyncEngine,
    worker: dramatiq.Worker,
) -> None:
    await factories.setting(WEEKLY_TOKEN_CAP, 100_000)
    agent = await factories.agent()
    owner = token(settings, agent["user_id"])
    async with acknowledged_client(server, owner) as client:
        await client.subscribe("b", BUDGET)
        await server.wait_subscribers(1)
        started = await start_run(http, server, owner, agent["id"])
        budget = (await client.next_data("b"))["budget"]
        stored = await run_row(engine, int(started["id"]))
        # Only the finish emits: QUEUED and RUNNING did not.
        await client.nothing_for(QUIET_SECONDS)
    assert stored["state"] == "succeeded" and stored["tokens_used"] > 0
    assert budget["usedTokens"] == stored["tokens_used"]
    assert budget["capTokens"] == 100_000
    assert budget["remainingTokens"] == 100_000 - stored["tokens_used"]
    assert budget["exceeded"] is False


async def test_other_owners_see_nothing_and_an_admin_sees_everything(
    server: Server,
    http: httpx.AsyncClient,
    settings: Settings,
    factories: Factories,
    worker: dramatiq.Worker,
) -> None:
    agent = await factories.agent()
    stranger = await factories.user()
    stranger_agent = await factories.agent(user_id=stranger["id"])
    owner = token(settings, agent["user_id"])
    admin_user = await factories.user()
    async with (
        acknowledged_client(server, token(settings, stranger["id"])) as other,
        acknowledged_client(server, token(settings, admin_user["id"], admin=True)) as admin,
    ):
        await other.subscribe("all", RUN_EVENTS)
        await other.subscribe("budget", BUDGET)
        await admin.subscribe("all", RUN_EVENTS)
        await server.wait_subscribers(3)
        # Someone else's agent is NOT_FOUND, as over HTTP: existence is not leaked.
        await other.subscribe("theirs", RUN_EVENTS, {"agentId": str(agent["id"])})
        refused = await other.message_for("theirs")
        assert refused["type"] == "error", refused
        assert refused["payload"][0]["extensions"]["code"] == "NOT_FOUND"

        started = await start_run(http, server, owner, agent["id"])
        seen = await transitions(admin, "all", 3)
        assert states(seen) == [(None, "QUEUED"), ("QUEUED", "RUNNING"), ("RUNNING", "SUCCEEDED")]
        assert {e["run"]["id"] for e in seen} == {started["id"]}
        await other.nothing_for(QUIET_SECONDS)

        # The admin's stream is every owner's: the stranger's own run shows up there too.
        theirs = await start_run(
            http, server, token(settings, stranger["id"]), stranger_agent["id"]
        )
        assert [e["run"]["id"] for e in await transitions(admin, "all", 3)] == [theirs["id"]] * 3
    await server.wait_subscribers(0)


async def test_the_token_may_come_as_lowercase_authorization_or_token(
    server: Server, settings: Settings, factories: Factories
) -> None:
    agent = await factories.agent()
    bearer = token(settings, agent["user_id"])
    for header in ("authorization", "token"):
        async with acknowledged_client(server, bearer, header=header) as client:
            await client.subscribe("1", RUN_EVENTS)
            await server.wait_subscribers(1)
            run = await factories.run(agent["id"], state="skipped", reason="budget_exceeded")
            (event,) = await transitions(client, "1", 1)
            assert event["run"]["id"] == str(run["id"])
        await server.wait_subscribers(0)


async def test_complete_ends_the_subscription_and_frees_its_subscriber(
    server: Server, settings: Settings, factories: Factories
) -> None:
    agent = await factories.agent()
    async with acknowledged_client(server, token(settings, agent["user_id"])) as client:
        await client.subscribe("1", RUN_EVENTS)
        await client.subscribe("2", BUDGET)
        await server.wait_subscribers(2)
        await client.complete("1")
        await server.wait_subscribers(1)
        await factories.run(agent["id"], state="skipped", reason="budget_exceeded")
        budget = await client.next_data("2")  # the other subscription goes on
        assert budget["budget"]["usedTokens"] == 0
        await client.nothing_for(QUIET_SECONDS)  # nothing for the completed one
    await server.wait_subscribers(0)


async def test_a_postgres_restart_under_an_open_subscription(
    servers: Servers,
    server: Server,
    http: httpx.AsyncClient,
    settings: Settings,
    factories: Factories,
    worker: dramatiq.Worker,
) -> None:
    if servers.embedded is None or servers.embedded.postgres is None:
        pytest.skip("needs the embedded PostgreSQL to restart it")
    agent = await factories.agent()
    owner = token(settings, agent["user_id"])
    async with acknowledged_client(server, owner) as client:
        await client.subscribe("1", RUN_EVENTS, {"agentId": str(agent["id"])})
        await server.wait_subscribers(1)
        await asyncio.to_thread(servers.embedded.postgres.restart)
        await eventually(
            lambda: _true(server.hub.listening), within=20, what="the listener to reconnect"
        )
        started = await start_run(http, server, owner, agent["id"])
        seen = await transitions(client, "1", 3)
    assert states(seen) == [(None, "QUEUED"), ("QUEUED", "RUNNING"), ("RUNNING", "SUCCEEDED")]
    assert {e["run"]["id"] for e in seen} == {started["id"]}


async def _true(value: bool) -> bool:
    return value
