"""WebSocket sessions are held to a request's rules for their whole life, across real
`agent-engine serve` processes: a deactivated user's sockets close on every api process, each
operation on a socket checks the viewer again, and a socket closes when its token expires.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine
from websockets.exceptions import ConnectionClosed

from agent_engine.api.auth import mint_token
from tests.e2e.support import (  # noqa: F401 (fixtures)
    Client,
    GraphQLWs,
    Stack,
    fetch,
    stack,
    token,
    websocket,
)
from tests.support.factories import Factories

RUN_EVENTS = "subscription { runEvents { run { id state } } }"
BUDGET = "subscription { budget { usedTokens } }"
START = "mutation($a: ID!) { startRun(agentId: $a) { id state } }"
# A liveness bound for the close to arrive (the sweep runs every 2 s), not a measurement.
CLOSE_WITHIN_SECONDS = 15.0


async def _closed(ws: GraphQLWs, within: float = CLOSE_WITHIN_SECONDS) -> tuple[int, str]:
    """The close code and reason the server sends (messages before it are skipped)."""
    with pytest.raises(ConnectionClosed) as closed:
        while True:
            await ws.receive(within=within)
    received = closed.value.rcvd
    assert received is not None, "the connection dropped without a close frame"
    return received.code, received.reason


async def test_deactivation_closes_the_users_sockets_on_every_api_process(
    factories: Factories,
    stack: Stack,  # noqa: F811
) -> None:
    owner = (await factories.user())["id"]
    bystander = (await factories.user())["id"]
    admin = (await factories.user())["id"]
    first, second = await stack.api(), await stack.api()
    overseer = Client(first.url or "", bearer=token(stack.settings, admin, admin=True))
    try:
        async with (
            websocket(first.url or "") as on_first,
            websocket(second.url or "") as on_second,
            websocket(second.url or "") as unrelated,
        ):
            for ws, user in ((on_first, owner), (on_second, owner), (unrelated, bystander)):
                assert (await ws.init(bearer=token(stack.settings, user)))[
                    "type"
                ] == "connection_ack"
                await ws.subscribe("events", RUN_EVENTS)
            await on_first.messages_for(0.5)  # the subscriptions are registered
            assert (await overseer.data(f"mutation {{ deactivateOwner(userId: {owner}) }}")) == {
                "deactivateOwner": 0
            }
            for ws in (on_first, on_second):
                assert await _closed(ws) == (4403, "this account is deactivated")
            # Someone else's socket on the same process is untouched.
            await unrelated.send({"type": "ping"})
            assert (await unrelated.receive())["type"] == "pong"
    finally:
        await overseer.aclose()


async def test_every_operation_on_a_socket_checks_the_viewer_again(
    engine: AsyncEngine,
    factories: Factories,
    stack: Stack,  # noqa: F811
) -> None:
    owner = (await factories.user())["id"]
    admin = (await factories.user())["id"]
    agent = await factories.agent(user_id=owner)
    # No sweep during the test: only the per-operation check can stop the mutation.
    stack.settings = stack.settings.model_copy(update={"session_check_seconds": 3600.0})
    api = await stack.api()
    overseer = Client(api.url or "", bearer=token(stack.settings, admin, admin=True))
    try:
        async with websocket(api.url or "") as ws:
            assert (await ws.init(bearer=token(stack.settings, owner)))["type"] == "connection_ack"
            await overseer.data(f"mutation {{ deactivateOwner(userId: {owner}) }}")
            await ws.subscribe("start", START, {"a": str(agent["id"])})
            assert await _closed(ws) == (4403, "this account is deactivated")
    finally:
        await overseer.aclose()
    assert await fetch(engine, "SELECT id FROM agent_runs WHERE agent_id = :a", a=agent["id"]) == []


async def test_a_socket_closes_when_its_token_expires(
    factories: Factories,
    stack: Stack,  # noqa: F811
) -> None:
    owner = (await factories.user())["id"]
    api = await stack.api()
    short = mint_token(stack.settings.jwt_secret or "", user_id=owner, ttl=timedelta(seconds=3))
    async with websocket(api.url or "") as ws:
        assert (await ws.init(bearer=short))["type"] == "connection_ack"
        await ws.subscribe("budget", BUDGET)
        assert await _closed(ws) == (4401, "the token has expired")
