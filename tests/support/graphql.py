"""The one GraphQL-over-HTTP test client of the integration and e2e suites.

Who is asking is said the same way everywhere, by keyword:

- `as_user=<id>` (with `admin=True` for an admin): a bearer minted with the settings' secret, as
  the suites always did (`token`, 1-hour ttl);
- `token=<raw token>`: exactly this bearer (tests of bad, expired or foreign tokens);
- neither: the client's `bearer` if it has one (an e2e session), else no Authorization header.

`post` returns the response; `body` asserts HTTP 200 and returns the JSON (and, with
`no_internal`, that no error is INTERNAL); `data` asserts there are no errors and returns `data`.
`codes`, `error` and `error_code` read a body's errors.

`websocket(url)` opens a graphql-transport-ws connection, `GraphQLWs` speaks it message by message.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import httpx
from websockets.asyncio.client import ClientConnection, connect
from websockets.typing import Subprotocol

from agent_engine.api.auth import mint_token
from agent_engine.settings import Settings

TOKEN_TTL = timedelta(hours=1)
EVENT_TIMEOUT_SECONDS = 20.0
TRANSPORT_WS = Subprotocol("graphql-transport-ws")
LEGACY_WS = Subprotocol("graphql-ws")


def token(settings: Settings, user_id: int, *, admin: bool = False, **claims: Any) -> str:
    """A bearer for `user_id`, signed with the settings' secret, valid for an hour."""
    return mint_token(
        settings.jwt_secret or "", user_id=user_id, admin=admin, ttl=TOKEN_TTL, **claims
    )


def codes(body: dict[str, Any]) -> list[str | None]:
    """The `extensions.code` of every error of a response body."""
    return [(e.get("extensions") or {}).get("code") for e in body.get("errors") or []]


def error(body: dict[str, Any]) -> dict[str, Any]:
    """The one error of a response body (it must have exactly one)."""
    errors = body.get("errors") or []
    assert len(errors) == 1, body
    first: dict[str, Any] = errors[0]
    return first


def error_code(body: dict[str, Any]) -> str | None:
    """The `extensions.code` of the one error of a response body."""
    code: str | None = (error(body).get("extensions") or {}).get("code")
    return code


@dataclass
class GraphQL:
    """GraphQL over HTTP against `url` (the server's base URL, `/graphql` is appended)."""

    url: str
    settings: Settings | None = None
    http: httpx.AsyncClient = field(
        default_factory=lambda: httpx.AsyncClient(timeout=30.0), repr=False
    )
    bearer: str | None = None
    # Every body is checked for an INTERNAL error (a bug the user would see as "internal error").
    no_internal: bool = False

    def token(self, user_id: int, *, admin: bool = False, **claims: Any) -> str:
        assert self.settings is not None, "this client has no settings to mint tokens with"
        return token(self.settings, user_id, admin=admin, **claims)

    def _authorization(self, as_user: int | None, admin: bool, token: str | None) -> dict[str, str]:
        assert as_user is None or token is None, "say who is asking once: as_user= or token="
        if as_user is not None:
            bearer: str | None = self.token(as_user, admin=admin)
        else:
            assert not admin, "admin= goes with as_user="
            bearer = token if token is not None else self.bearer
        return {"Authorization": f"Bearer {bearer}"} if bearer else {}

    async def post(
        self,
        query: str,
        variables: dict[str, Any] | None = None,
        *,
        as_user: int | None = None,
        admin: bool = False,
        token: str | None = None,
    ) -> httpx.Response:
        return await self.http.post(
            f"{self.url}/graphql",
            json={"query": query, "variables": variables or {}},
            headers=self._authorization(as_user, admin, token),
        )

    async def body(
        self,
        query: str,
        variables: dict[str, Any] | None = None,
        *,
        as_user: int | None = None,
        admin: bool = False,
        token: str | None = None,
    ) -> dict[str, Any]:
        """The JSON body of an HTTP 200 answer."""
        response = await self.post(query, variables, as_user=as_user, admin=admin, token=token)
        assert response.status_code == 200, response.text
        body: dict[str, Any] = response.json()
        if self.no_internal:
            assert "INTERNAL" not in codes(body), body
        return body

    async def data(
        self,
        query: str,
        variables: dict[str, Any] | None = None,
        *,
        as_user: int | None = None,
        admin: bool = False,
        token: str | None = None,
    ) -> dict[str, Any]:
        """The data of a query that must succeed."""
        body = await self.body(query, variables, as_user=as_user, admin=admin, token=token)
        assert not body.get("errors"), body["errors"]
        data: dict[str, Any] = body["data"]
        return data

    async def aclose(self) -> None:
        await self.http.aclose()


# --- graphql-transport-ws -------------------------------------------------------------------------


class GraphQLWs:
    """The client side of graphql-transport-ws, message by message."""

    def __init__(self, connection: ClientConnection) -> None:
        self.connection = connection
        self._pending: list[dict[str, Any]] = []

    async def _next_message(self) -> dict[str, Any]:
        """The next message from the server; pings are answered, never returned."""
        while True:
            message: dict[str, Any] = json.loads(await self.connection.recv())
            if message.get("type") != "ping":
                return message
            await self.send({"type": "pong"})

    async def send(self, message: dict[str, Any]) -> None:
        await self.connection.send(json.dumps(message))

    async def init(
        self, payload: dict[str, Any] | None = None, *, bearer: str | None = None
    ) -> dict[str, Any]:
        """`connection_init` with `payload`, or with `bearer` as its Authorization."""
        if bearer:
            payload = {**(payload or {}), "Authorization": f"Bearer {bearer}"}
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
            return await self._next_message()

    async def message_for(self, id: str, within: float = EVENT_TIMEOUT_SECONDS) -> dict[str, Any]:
        """The next message of operation `id`; others are kept for later."""
        for index, message in enumerate(self._pending):
            if message.get("id") == id:
                return self._pending.pop(index)
        async with asyncio.timeout(within):
            while (message := await self._next_message()).get("id") != id:
                self._pending.append(message)
            return message

    async def next_data(self, id: str, within: float = EVENT_TIMEOUT_SECONDS) -> dict[str, Any]:
        message = await self.message_for(id, within)
        assert message["type"] == "next", message
        assert not message["payload"].get("errors"), message
        data: dict[str, Any] = message["payload"]["data"]
        return data

    async def messages_for(self, seconds: float) -> list[dict[str, Any]]:
        """Every message that arrives within `seconds` (after those kept for later)."""
        found, self._pending = self._pending, []
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            try:
                found.append(await self.receive(within=left))
            except TimeoutError:
                break
        return found

    async def messages_until(
        self,
        done: Callable[[dict[str, Any]], bool],
        *,
        within: float = EVENT_TIMEOUT_SECONDS,
        then: float = 0.5,
    ) -> list[dict[str, Any]]:
        """Every message up to the first one `done` accepts (waiting up to `within` for it), and
        what else arrives in the `then` seconds after it (a duplicate, an event too many)."""
        found: list[dict[str, Any]] = []
        try:
            async with asyncio.timeout(within):
                while not found or not done(found[-1]):
                    found.append(await self.receive())
        except TimeoutError:
            raise AssertionError(f"no awaited message within {within:g}s: {found[-5:]}") from None
        return found + await self.messages_for(then)

    async def nothing_for(self, seconds: float) -> None:
        """No message arrives for `seconds`."""
        assert not self._pending, self._pending
        try:
            async with asyncio.timeout(seconds):
                message = await self.connection.recv()
        except TimeoutError:
            return
        raise AssertionError(f"unexpected message: {message!r}")


def ws_url(url: str) -> str:
    """The GraphQL WebSocket endpoint of the server at the http:// base URL `url`."""
    return url.replace("http://", "ws://", 1) + "/graphql"


@asynccontextmanager
async def websocket(
    url: str, *, subprotocol: Subprotocol = TRANSPORT_WS
) -> AsyncIterator[GraphQLWs]:
    """A WebSocket to `url`/graphql (`url`: the server's http:// base URL)."""
    async with connect(ws_url(url), subprotocols=[subprotocol], proxy=None) as connection:
        yield GraphQLWs(connection)
