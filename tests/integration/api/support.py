"""A real Uvicorn server on a free port, in a thread, and a small GraphQL client for it."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import uvicorn
from starlette.types import ASGIApp

from agent_engine.api.app import create_app
from agent_engine.api.auth import mint_token
from agent_engine.settings import Settings

SERVER_START_TIMEOUT_SECONDS = 20.0
# A fixed instant (a Wednesday) so slots and budget windows are predictable.
FIXED_NOW = datetime(2025, 3, 12, 10, 0, tzinfo=UTC)


@dataclass
class Clock:
    now: datetime = FIXED_NOW

    def __call__(self) -> datetime:
        return self.now


@contextmanager
def serving(app: ASGIApp) -> Iterator[str]:
    """Serve `app` with Uvicorn on 127.0.0.1:<free port> in a thread; yield the base URL.

    The app creates its own engine in the server thread's event loop (asyncpg connections
    belong to one loop).
    """
    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="on")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="api-under-test", daemon=True)
    thread.start()
    deadline = time.monotonic() + SERVER_START_TIMEOUT_SECONDS
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the API server did not start")
        time.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=SERVER_START_TIMEOUT_SECONDS)


@contextmanager
def running_server(settings: Settings, clock: Clock) -> Iterator[str]:
    """`create_app(settings)` on `clock`, served; yield the base URL."""
    with serving(create_app(settings, clock=clock)) as url:
        yield url


@dataclass
class Api:
    """GraphQL over HTTP against the running server."""

    url: str
    settings: Settings
    clock: Clock
    client: httpx.AsyncClient = field(repr=False)

    def token(self, user_id: int, *, admin: bool = False, **claims: Any) -> str:
        return mint_token(
            self.settings.jwt_secret or "",
            user_id=user_id,
            admin=admin,
            ttl=timedelta(hours=1),
            **claims,
        )

    async def post(
        self, query: str, variables: dict[str, Any] | None = None, token: str | None = None
    ) -> httpx.Response:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return await self.client.post(
            f"{self.url}/graphql",
            json={"query": query, "variables": variables or {}},
            headers=headers,
        )

    async def gql(
        self, query: str, variables: dict[str, Any] | None = None, token: str | None = None
    ) -> dict[str, Any]:
        response = await self.post(query, variables, token)
        assert response.status_code == 200, response.text
        body: dict[str, Any] = response.json()
        return body

    async def data(
        self, query: str, variables: dict[str, Any] | None = None, token: str | None = None
    ) -> dict[str, Any]:
        """The data of a query that must succeed."""
        body = await self.gql(query, variables, token)
        assert not body.get("errors"), body["errors"]
        data: dict[str, Any] = body["data"]
        return data


def codes(body: dict[str, Any]) -> list[str]:
    return [e.get("extensions", {}).get("code") for e in body.get("errors") or []]


def error(body: dict[str, Any]) -> dict[str, Any]:
    errors = body.get("errors") or []
    assert len(errors) == 1, body
    first: dict[str, Any] = errors[0]
    return first
