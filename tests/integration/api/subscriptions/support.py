"""A real Uvicorn api in a thread, a graphql-transport-ws client on `websockets`, and helpers."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from starlette.applications import Starlette
from websockets.asyncio.client import ClientConnection, connect
from websockets.typing import Subprotocol

from agent_engine.api.app import create_app
from agent_engine.api.auth import mint_token
from agent_engine.api.live import Broadcaster, LiveUpdates
from agent_engine.settings import Settings
from tests.integration.api.support import serving

EVENT_TIMEOUT_SECONDS = 20.0
TRANSPORT_WS = Subprotocol("graphql-transport-ws")
LEGACY_WS = Subprotocol("graphql-ws")

RUN_EVENTS = """
subscription Events($agentId: ID) {
  runEvents(agentId: $agentId) {
    previousState
    run { id state reason output tokensUsed startedAt finishedAt agent { id name } }
  }
}
"""
BUDGET = "subscription { budget { usedTokens capTokens remainingTokens exceeded windowStart } }"
START_RUN = "mutation Start($id: ID!) { startRun(agentId: $id) { id state reason } }"


def token(settings: Settings, user_id: int, *, admin: bool = False) -> str:
    return mint_token(
        settings.jwt_secret or "", user_id=user_id, admin=admin, ttl=timedelta(hours=1)
    )


@dataclass
class Server:
    url: str
    app: Starlette

    @property
    def ws_url(self) -> str:
        return self.url.replace("http://", "ws://", 1) + "/graphql"

    @property
    def hub(self) -> LiveUpdates:
        """The process's live path (its LISTEN state, its subscriptions)."""
        live: LiveUpdates = self.app.state.live
        return live

    @property
    def broadcaster(self) -> Broadcaster:
        broadcaster: Broadcaster = self.app.state.broadcaster
        return broadcaster

    @property
    def subscriber_count(self) -> int:
        """Open subscriptions: in groups, or fed by the hub directly."""
        return self.hub.subscriber_count

    async def wait_subscribers(self, count: int, within: float = 10.0) -> None:
        """The server registered exactly `count` subscribers (the protocol has no "subscribed")."""
        deadline = time.monotonic() + within
        while self.subscriber_count != count:
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"expected {count} subscribers, the server has {self.subscriber_count}"
                )
            await asyncio.sleep(0.02)


@contextmanager
def running_api(settings: Settings) -> Iterator[Server]:
    """`create_app(settings)` (real clock) served by Uvicorn on 127.0.0.1:<free port>."""
    app = create_app(settings)
    with serving(app) as url:
        yield Server(url=url, app=app)


class GraphQLWs:
    """The client side of graphql-transport-ws, message by message."""

    def __init__(self, connection: ClientConnection) -> None:
        self.connection = connection
        self._pending: list[dict[str, Any]] = []

    async def send(self, message: dict[str, Any]) -> None:
        await self.connection.send(json.dumps(message))

    async def init(self, payload: dict[str, Any] | None = None) -> dict[str, Any]:
        await self.send({"type": "connection_init", "payload": payload or {}})
        return await self.receive()

    async def subscribe(self, id: str, query: str, variables: dict[str, Any] | None = None) -> None:
        await self.send(
            {"id": id, "type": "subscribe", "payload": {"query": query, "variables": variables}}
        )

    async def complete(self, id: str) -> None:
        await self.send({"id": id, "type": "complete"})

    async def receive(self, within: float = EVENT_TIMEOUT_SECONDS) -> dict[str, Any]:
        if self._pending:
            return self._pending.pop(0)
        async with asyncio.timeout(within):
            while True:
                message: dict[str, Any] = json.loads(await self.connection.recv())
                if message.get("type") == "ping":
                    await self.send({"type": "pong"})
                    continue
                return message

    async def message_for(self, id: str, within: float = EVENT_TIMEOUT_SECONDS) -> dict[str, Any]:
        """The next message of operation `id`; others are kept for later."""
        for index, message in enumerate(self._pending):
            if message.get("id") == id:
                return self._pending.pop(index)
        async with asyncio.timeout(within):
            while True:
                message: dict[str, Any] = json.loads(await self.connection.recv())
                if message.get("type") == "ping":
                    await self.send({"type": "pong"})
                elif message.get("id") == id:
                    return message
                else:
                    self._pending.append(message)

    async def next_data(self, id: str, within: float = EVENT_TIMEOUT_SECONDS) -> dict[str, Any]:
        message = await self.message_for(id, within)
        assert message["type"] == "next", message
        assert not message["payload"].get("errors"), message
        data: dict[str, Any] = message["payload"]["data"]
        return data

    async def nothing_for(self, seconds: float) -> None:
        """No message arrives for `seconds`."""
        assert not self._pending, self._pending
        try:
            async with asyncio.timeout(seconds):
                message = await self.connection.recv()
        except TimeoutError:
            return
        raise AssertionError(f"unexpected message: {message!r}")


@asynccontextmanager
async def ws_client(
    server: Server, *, subprotocol: Subprotocol = TRANSPORT_WS
) -> AsyncIterator[GraphQLWs]:
    async with connect(server.ws_url, subprotocols=[subprotocol], proxy=None) as connection:
        yield GraphQLWs(connection)


@asynccontextmanager
async def acknowledged_client(
    server: Server, bearer: str, *, header: str = "Authorization"
) -> AsyncIterator[GraphQLWs]:
    """A connection acknowledged for `bearer`."""
    async with ws_client(server) as client:
        value = bearer if header == "token" else f"Bearer {bearer}"
        ack = await client.init({header: value})
        assert ack["type"] == "connection_ack", ack
        yield client
