"""A real OAuth 2.1 authorization server and an MCP server that is its resource server, built
with the `mcp` SDK's own auth (`mcp.server.auth`): the demo's and the tests' OWNER_OAUTH source.

- The authorization server (`AuthorizationServer`): the SDK's handlers (metadata RFC 8414,
  /authorize with PKCE, /token, /register RFC 7591, /revoke RFC 7009) over `TestProvider`. Its
  /authorize signs the user in without a form: the `test_user` cookie names the account (default
  `demo@example.com`), `test_deny=1` makes it answer `access_denied`. Access tokens are HS256
  JWTs (`sub`, `aud` = the resource asked for, `exp`); refresh tokens rotate (a used one is
  refused); /revoke forgets both. It sends `iss` with the code (RFC 9207).
- The resource server (`ResourceServer`): the ticket server of `mcp_tickets` behind the SDK's
  bearer middleware and protected resource metadata (RFC 9728); a token whose audience is not
  this server, an expired or revoked one, or none is refused with 401 and the metadata's URL.
  Each call records the token's subject.

Both answer `GET /test/state` (JSON: refreshes, token requests, revocations, calls with subjects)
and the authorization server `POST /test/config` (`access_ttl`, `refuse_refresh`, `slow_seconds`)
so a test in another process can steer and inspect them.

    python -m agent_engine.testing.oauth_servers --role as --port 8766 --secret S
    python -m agent_engine.testing.oauth_servers --role rs --port 8765 --secret S \\
        --issuer http://127.0.0.1:8766

The authorization server's parts (`TestProvider`, `verify`, `ServerState`) live in
`testing/oauth_authorization.py` (re-exported here).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import uvicorn
from mcp.server.auth.middleware.auth_context import AuthContextMiddleware, get_access_token
from mcp.server.auth.middleware.bearer_auth import BearerAuthBackend, RequireAuthMiddleware
from mcp.server.auth.provider import (
    AccessToken,
)
from mcp.server.auth.routes import (
    build_resource_metadata_url,
    create_protected_resource_routes,
)
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from pydantic import AnyHttpUrl
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.authentication import AuthenticationMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Message, Receive, Scope, Send

from agent_engine.server_thread import ServerThread
from agent_engine.testing.mcp_tickets import TicketServer, TicketState, _Gate, build_server
from agent_engine.testing.oauth_authorization import DEFAULT_USER as DEFAULT_USER
from agent_engine.testing.oauth_authorization import SCOPES as SCOPES
from agent_engine.testing.oauth_authorization import ServerState as ServerState
from agent_engine.testing.oauth_authorization import TestProvider as TestProvider
from agent_engine.testing.oauth_authorization import (
    build_authorization_server as build_authorization_server,
)
from agent_engine.testing.oauth_authorization import verify as verify

logging.getLogger("mcp.server.streamable_http").setLevel(logging.CRITICAL)


class _AudienceVerifier:
    def __init__(self, secret: str, resource: str) -> None:
        self.secret, self.resource = secret, resource
        self.revoked: set[str] = set()

    async def verify_token(self, token: str) -> AccessToken | None:
        return verify(token, self.secret, self.resource, self.revoked)


# What a caller without a token may send when the server allows anonymous listing.
ANONYMOUS_METHODS = frozenset({"initialize", "notifications/initialized", "tools/list"})


class AnonymousListing:
    """Lets a request without a token through when it only initializes or lists tools (the
    server "allows an unauthenticated listing"); anything else goes to `protected` (401)."""

    def __init__(self, open_app: Any, protected: Any) -> None:
        self.open_app, self.protected = open_app, protected

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        user = scope.get("user")
        if scope.get("method") != "POST" or (user is not None and user.is_authenticated):
            await self.protected(scope, receive, send)
            return
        chunks: list[bytes] = []
        while True:
            message = await receive()
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        body = b"".join(chunks)
        try:
            method = json.loads(body).get("method")
        except (ValueError, AttributeError):
            method = None
        sent = False

        async def replay() -> Message:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        target = self.open_app if method in ANONYMOUS_METHODS else self.protected
        await target(scope, replay, send)


def build_resource_server(
    tickets: TicketState,
    resource: str,
    issuer: str,
    secret: str,
    *,
    anonymous_listing: bool = False,
) -> Starlette:
    gate = _Gate()

    def subject() -> str | None:
        token = get_access_token()
        return None if token is None else token.subject

    tickets.subject_of = subject
    manager = StreamableHTTPSessionManager(app=build_server(tickets, gate.wait), json_response=True)
    metadata_url = build_resource_metadata_url(AnyHttpUrl(resource))

    async def endpoint(scope: Scope, receive: Receive, send: Send) -> None:
        await manager.handle_request(scope, receive, send)

    async def test_state(request: Request) -> Response:
        return JSONResponse(
            {
                "calls": [
                    {"name": c.name, "arguments": c.arguments, "subject": c.subject}
                    for c in tickets.calls
                ],
                "tickets": tickets.tickets,
                "lists": tickets.lists,
            }
        )

    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        async with manager.run():
            yield

    protected = RequireAuthMiddleware(endpoint, [], metadata_url)
    routes: list[Route] = [
        *create_protected_resource_routes(
            resource_url=AnyHttpUrl(resource),
            authorization_servers=[AnyHttpUrl(issuer)],
            scopes_supported=SCOPES,
            resource_name="Tickets",
        ),
        Route("/test/state", test_state),
        Route(
            "/mcp",
            AnonymousListing(endpoint, protected) if anonymous_listing else protected,
            methods=["GET", "POST", "DELETE"],
        ),
    ]
    app = Starlette(
        routes=routes,
        middleware=[
            Middleware(
                AuthenticationMiddleware,
                backend=BearerAuthBackend(_AudienceVerifier(secret, resource)),
            ),
            Middleware(AuthContextMiddleware),
        ],
        lifespan=lifespan,
    )
    app.state.manager = manager
    return app


class AuthorizationServer(ServerThread):
    """The authorization server in a thread (the demo's `run`)."""

    thread_name = "oauth-as"
    description = "the test authorization server"

    def __init__(self, *, secret: str, host: str = "127.0.0.1", port: int = 0) -> None:
        super().__init__(host=host, port=port)
        self.secret = secret
        self.state = ServerState()

    def app(self) -> Starlette:
        return build_authorization_server(self.state, self.issuer, self.secret)

    @property
    def issuer(self) -> str:
        return f"http://127.0.0.1:{self.port}"


class ResourceServer(TicketServer):
    """The ticket server as an OAuth resource server, in a thread (the demo's `run`)."""

    thread_name = "oauth-rs"
    description = "the OAuth ticket server"

    def __init__(
        self,
        *,
        issuer: str,
        secret: str,
        anonymous_listing: bool = True,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        super().__init__(host=host, port=port)
        self.issuer, self.secret, self.anonymous_listing = issuer, secret, anonymous_listing

    def app(self) -> Starlette:
        self._app = build_resource_server(
            self.state,
            self.url,
            self.issuer,
            self.secret,
            anonymous_listing=self.anonymous_listing,
        )
        return self._app


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="The OAuth test servers (see the module's doc).")
    parser.add_argument("--role", choices=["as", "rs"], required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--secret", required=True, help="HS256 key shared by the two servers")
    parser.add_argument("--issuer", help="rs: the authorization server's URL")
    parser.add_argument(
        "--anonymous-listing",
        action="store_true",
        help="rs: answer initialize and tools/list without a token",
    )
    args = parser.parse_args(argv)
    here = f"http://{args.host}:{args.port}"
    if args.role == "as":
        app = build_authorization_server(ServerState(), here, args.secret)
    else:
        if not args.issuer:
            parser.error("--issuer is required with --role rs")
        app = build_resource_server(
            TicketState(),
            f"{here}/mcp",
            args.issuer,
            args.secret,
            anonymous_listing=args.anonymous_listing,
        )
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
