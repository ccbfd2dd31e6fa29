"""The WebSocket transport: graphql-transport-ws only, a token on connection_init, a cap."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine
from websockets.exceptions import ConnectionClosed

from agent_engine.api.auth import mint_token
from agent_engine.settings import Settings
from tests.integration.api.subscriptions.support import (
    BUDGET,
    LEGACY_WS,
    RUN_EVENTS,
    Server,
    acknowledged_client,
    running_api,
    token,
    ws_client,
)
from tests.support.factories import Factories

CAP = 2


async def test_the_legacy_graphql_ws_protocol_is_refused(server: Server) -> None:
    async with ws_client(server, subprotocol=LEGACY_WS) as client:
        assert client.connection.subprotocol is None
        with pytest.raises(ConnectionClosed) as closed:
            await client.init({"Authorization": "Bearer whatever"})
    assert closed.value.rcvd is not None
    assert closed.value.rcvd.code == 4406


@pytest.mark.parametrize(
    "payload",
    [{}, {"Authorization": "Bearer not-a-jwt"}, {"Authorization": "Basic abc"}, {"token": ""}],
    ids=["no-token", "bad-token", "wrong-scheme", "empty-token"],
)
async def test_a_connection_without_a_valid_token_is_closed(
    server: Server, payload: dict[str, str]
) -> None:
    async with ws_client(server) as client:
        with pytest.raises(ConnectionClosed) as closed:
            await client.init(payload)
    assert closed.value.rcvd is not None
    assert closed.value.rcvd.code == 4403
    assert server.subscriber_count == 0


async def test_a_subscribe_before_connection_init_is_closed_unauthorized(server: Server) -> None:
    async with ws_client(server) as client:
        await client.subscribe("1", RUN_EVENTS)
        with pytest.raises(ConnectionClosed) as closed:
            await client.receive()
    assert closed.value.rcvd is not None
    assert closed.value.rcvd.code == 4401
    assert server.subscriber_count == 0


async def test_a_deactivated_owner_is_refused(
    server: Server, settings: Settings, factories: Factories
) -> None:
    user = await factories.user(is_active=False)
    async with ws_client(server) as client:
        with pytest.raises(ConnectionClosed) as closed:
            await client.init({"Authorization": f"Bearer {token(settings, user['id'])}"})
    assert closed.value.rcvd is not None
    assert closed.value.rcvd.code == 4403


async def test_a_subscription_flood_is_capped_per_connection(
    settings: Settings, factories: Factories
) -> None:
    capped = settings.model_copy(update={"max_subscriptions_per_connection": CAP})
    user = await factories.user()
    with running_api(capped) as server:
        async with acknowledged_client(server, token(settings, user["id"])) as client:
            for number in range(CAP):
                await client.subscribe(str(number), BUDGET)
            await server.wait_subscribers(CAP)
            await client.subscribe("extra", BUDGET)
            refused = await client.message_for("extra")
            assert refused["type"] == "error", refused
            assert "limit" in refused["payload"][0]["message"].lower()
            assert server.subscriber_count == CAP
            # Completing one makes room for another.
            await client.complete("0")
            await server.wait_subscribers(CAP - 1)
            await client.subscribe("again", BUDGET)
            await server.wait_subscribers(CAP)
        await server.wait_subscribers(0)


async def test_subscriptions_over_plain_http_are_refused(
    server: Server, settings: Settings, factories: Factories
) -> None:
    user = await factories.user()
    async with httpx.AsyncClient() as http:
        response = await http.post(
            f"{server.url}/graphql",
            json={"query": BUDGET},
            headers={"Authorization": f"Bearer {token(settings, user['id'])}"},
        )
    assert response.status_code == 400, response.text
    assert response.json()["errors"][0]["extensions"]["code"] == "BAD_REQUEST"
    assert server.subscriber_count == 0


async def test_a_subscriber_that_falls_behind_is_told_and_ended(
    settings: Settings, factories: Factories, engine: AsyncEngine
) -> None:
    tiny = settings.model_copy(update={"subscriber_queue_size": 1})
    agent = await factories.agent()
    with running_api(tiny) as server:
        async with acknowledged_client(server, token(settings, agent["user_id"])) as client:
            await client.subscribe("1", RUN_EVENTS)
            await server.wait_subscribers(1)
            # One transaction: the notifications arrive as one burst, faster than any socket.
            async with engine.begin() as conn:
                await conn.execute(
                    text(
                        "INSERT INTO agent_runs (agent_id, trigger, state, reason)"
                        " SELECT :agent, 'manual', 'skipped', 'budget_exceeded'"
                        " FROM generate_series(1, 50)"
                    ),
                    {"agent": agent["id"]},
                )
            while (message := await client.message_for("1"))["type"] == "next" and not message[
                "payload"
            ].get("errors"):
                pass
            assert message["payload"]["errors"][0]["extensions"]["code"] == "SUBSCRIBER_TOO_SLOW"
            assert (await client.message_for("1"))["type"] == "complete"
            await server.wait_subscribers(0)


async def _row_versions(engine: AsyncEngine, user_id: object) -> tuple[str, str]:
    """The user row's xmin (its last writer) and xmax (its last updater or locker).

    Per row, not per cluster: other databases of a shared server (parallel test
    workers) take transaction ids too.
    """
    async with engine.connect() as conn:
        row = (
            await conn.execute(
                text("SELECT xmin::text, xmax::text FROM users WHERE id = :id"), {"id": user_id}
            )
        ).one()
    return str(row[0]), str(row[1])


async def test_connections_write_the_user_only_when_the_claims_change(
    server: Server, settings: Settings, factories: Factories, engine: AsyncEngine
) -> None:
    user = await factories.user()
    bearer = token(settings, user["id"])
    before = await _row_versions(engine, user["id"])
    for _ in range(3):
        async with acknowledged_client(server, bearer) as client:
            await client.subscribe("1", BUDGET)
            await server.wait_subscribers(1)
        await server.wait_subscribers(0)
    # Reads only: the row was neither written nor locked (either changes xmin or xmax).
    assert await _row_versions(engine, user["id"]) == before

    renamed = mint_token(
        settings.jwt_secret or "", user_id=user["id"], name="Renamed", ttl=timedelta(hours=1)
    )
    async with acknowledged_client(server, renamed):
        pass
    async with engine.connect() as conn:
        name = await conn.scalar(
            text("SELECT display_name FROM users WHERE id = :id"), {"id": user["id"]}
        )
    assert name == "Renamed"


async def test_many_first_connections_of_a_new_user_are_all_accepted(
    server: Server, settings: Settings, engine: AsyncEngine
) -> None:
    # Concurrent first sights race on the users row; the database settles it, nobody is refused.
    # More of them than the api's pool has connections: none may hold its reader while it waits
    # for a writer.
    bearer = token(settings, 424_242)
    sockets = 3 * 2 * settings.db_pool_size

    async def connect() -> str:
        async with ws_client(server) as client:
            return str((await client.init({"Authorization": f"Bearer {bearer}"}))["type"])

    acks = await asyncio.gather(*(connect() for _ in range(sockets)))
    assert acks == ["connection_ack"] * sockets
    async with engine.connect() as conn:
        count = await conn.scalar(text("SELECT count(*) FROM users WHERE id = 424242"))
    assert count == 1
