"""Socket limits: sockets per user and operations per socket, with answers a client can act on."""

from __future__ import annotations

import asyncio
import time
from contextlib import AsyncExitStack

import pytest
from websockets.exceptions import ConnectionClosed

from agent_engine.api.sessions import CLOSE_TOO_MANY, SessionRegistry
from agent_engine.settings import Settings
from tests.integration.api.subscriptions.support import (
    BUDGET,
    RUN_EVENTS,
    acknowledged_client,
    running_api,
    token,
    ws_client,
)
from tests.support.factories import Factories

DEFAULTS = Settings()


async def until(condition: object, what: str, within: float = 10.0) -> None:
    deadline = time.monotonic() + within
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.02)


async def test_a_users_socket_over_the_cap_is_closed_with_4429_and_the_others_go_on(
    settings: Settings, factories: Factories
) -> None:
    cap = DEFAULTS.max_sockets_per_user
    assert cap == 20
    user, other = await factories.user(), await factories.user()
    agent = await factories.agent(user["id"])
    capped = settings.model_copy(update={"max_sockets_per_user": cap})
    with running_api(capped) as server:
        registry: SessionRegistry = server.app.state.sessions
        async with AsyncExitStack() as stack:
            sockets = [
                await stack.enter_async_context(
                    acknowledged_client(server, token(settings, user["id"]))
                )
                for _ in range(cap)
            ]
            async with ws_client(server) as extra:
                with pytest.raises(ConnectionClosed) as closed:
                    await extra.init({"Authorization": f"Bearer {token(settings, user['id'])}"})
                    await extra.receive()
            assert closed.value.rcvd is not None
            assert closed.value.rcvd.code == CLOSE_TOO_MANY == 4429
            assert "too many sockets" in closed.value.rcvd.reason
            assert f"at most {cap}" in closed.value.rcvd.reason

            # Another user is not counted against this one.
            async with acknowledged_client(server, token(settings, other["id"])):
                pass
            # The user's open sockets still work.
            await sockets[0].subscribe("e", RUN_EVENTS, {"agentId": str(agent["id"])})
            await server.wait_subscribers(1)
            await factories.run(agent["id"], state="skipped", reason="budget_exceeded")
            event = await sockets[0].next_data("e")
            assert event["runEvents"]["run"]["state"] == "SKIPPED"

            # One closed makes room for another.
            await sockets[-1].connection.close()
            await until(lambda: registry.session_count == cap - 1, "the closed socket to go")
            async with acknowledged_client(server, token(settings, user["id"])):
                pass


async def test_an_operation_over_the_sockets_cap_is_refused_and_the_others_go_on(
    settings: Settings, factories: Factories
) -> None:
    cap = DEFAULTS.max_subscriptions_per_connection
    assert cap == 50
    agent = await factories.agent()
    with running_api(settings.model_copy(update={"max_subscriptions_per_connection": cap})) as api:
        async with acknowledged_client(api, token(settings, agent["user_id"])) as client:
            await client.subscribe("events", RUN_EVENTS, {"agentId": str(agent["id"])})
            for number in range(cap - 1):
                await client.subscribe(str(number), BUDGET)
            await api.wait_subscribers(cap)
            await client.subscribe("one-more", BUDGET)
            refused = await client.message_for("one-more")
            assert refused["type"] == "error", refused
            (error,) = refused["payload"]
            assert error["extensions"] == {"code": "TOO_MANY_SUBSCRIPTIONS", "limit": cap}
            assert f"at most {cap}" in error["message"]
            # The socket and its 50 subscriptions go on.
            await factories.run(agent["id"], state="skipped", reason="budget_exceeded")
            event = await client.next_data("events")
            assert event["runEvents"]["run"]["state"] == "SKIPPED"
            assert api.subscriber_count == cap
