"""A real Uvicorn api in a thread, a graphql-transport-ws client on `websockets`, and helpers."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass

from starlette.applications import Starlette
from websockets.typing import Subprotocol

from agent_engine.api.app import create_app
from agent_engine.api.live import Broadcaster, LiveUpdates
from agent_engine.settings import Settings
from tests.integration.api.support import serving
from tests.support.graphql import (
    EVENT_TIMEOUT_SECONDS,
    LEGACY_WS,
    TRANSPORT_WS,
    GraphQLWs,
    token,
    websocket,
    ws_url,
)

__all__ = ["EVENT_TIMEOUT_SECONDS", "LEGACY_WS", "TRANSPORT_WS", "GraphQLWs", "token"]


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


@dataclass
class Server:
    url: str
    app: Starlette

    @property
    def ws_url(self) -> str:
        return ws_url(self.url)

    @property
    def hub(self) -> LiveUpdates:
        """The process's live path (its LISTEN state, its subscriptions)."""
        live: LiveUpdates = self.app.state.live
        return live

    @property
    def broadcaster(self) -> Broadcaster:
        return self.hub.broadcaster

    def subscribers_of(self, field: str) -> int:
        """Open subscriptions of one field (e.g. "budgetAlerts")."""
        return self.hub.broadcaster.members_of(field)

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


@asynccontextmanager
async def ws_client(
    server: Server, *, subprotocol: Subprotocol = TRANSPORT_WS
) -> AsyncIterator[GraphQLWs]:
    async with websocket(server.url, subprotocol=subprotocol) as client:
        yield client


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
