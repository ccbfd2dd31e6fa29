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
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import secrets
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

import jwt
import uvicorn
from mcp.server.auth.middleware.auth_context import AuthContextMiddleware, get_access_token
from mcp.server.auth.middleware.bearer_auth import BearerAuthBackend, RequireAuthMiddleware
from mcp.server.auth.provider import (
    AccessToken,
    AuthorizationCode,
    AuthorizationParams,
    RefreshToken,
    TokenError,
)
from mcp.server.auth.routes import (
    build_metadata,
    build_resource_metadata_url,
    create_auth_routes,
    create_protected_resource_routes,
)
from mcp.server.auth.settings import ClientRegistrationOptions, RevocationOptions
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.shared.auth import OAuthClientInformationFull
from pydantic import AnyHttpUrl
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.authentication import AuthenticationMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Route
from starlette.types import Message, Receive, Scope, Send

from agent_engine.server_thread import ServerThread
from agent_engine.testing.mcp_tickets import TicketServer, TicketState, _Gate, build_server

logging.getLogger("mcp.server.streamable_http").setLevel(logging.CRITICAL)

DEFAULT_USER = "demo@example.com"
SCOPES = ["tickets:read", "tickets:write"]


@dataclass
class ServerState:
    access_ttl: int = 3600
    refuse_refresh: bool = False
    slow_seconds: float = 0.0
    # RFC 9207: the metadata says iss is sent (authorization_response_iss_parameter_supported);
    # omit_iss makes the sign-in leave it out anyway (a mix-up attack's answer).
    omit_iss: bool = False
    refreshes: int = 0
    token_requests: int = 0
    revocations: int = 0
    registrations: int = 0
    clients: dict[str, OAuthClientInformationFull] = field(default_factory=dict)
    pending: dict[str, tuple[str, AuthorizationParams]] = field(default_factory=dict)
    codes: dict[str, AuthorizationCode] = field(default_factory=dict)
    refresh_tokens: dict[str, RefreshToken] = field(default_factory=dict)
    revoked: set[str] = field(default_factory=set)  # access tokens' jti

    def as_json(self) -> dict[str, Any]:
        return {
            "refreshes": self.refreshes,
            "tokenRequests": self.token_requests,
            "revocations": self.revocations,
            "registrations": self.registrations,
            "liveRefreshTokens": len(self.refresh_tokens),
        }


class TestProvider:
    """OAuthAuthorizationServerProvider: everything in memory."""

    def __init__(self, state: ServerState, issuer: str, secret: str) -> None:
        self.state, self.issuer, self.secret = state, issuer, secret

    async def get_client(self, client_id: str) -> OAuthClientInformationFull | None:
        return self.state.clients.get(client_id)

    async def register_client(self, client_info: OAuthClientInformationFull) -> None:
        assert client_info.client_id is not None
        self.state.registrations += 1
        self.state.clients[client_info.client_id] = client_info

    async def authorize(
        self, client: OAuthClientInformationFull, params: AuthorizationParams
    ) -> str:
        pending = secrets.token_urlsafe(16)
        assert client.client_id is not None
        self.state.pending[pending] = (client.client_id, params)
        return f"{self.issuer.rstrip('/')}/login?{urlencode({'pending': pending})}"

    def sign_in(self, pending: str, user: str | None, deny: bool) -> str:
        client_id, params = self.state.pending.pop(pending)
        query: dict[str, str] = {} if self.state.omit_iss else {"iss": self.issuer}
        if params.state is not None:
            query["state"] = params.state
        if deny:
            query["error"] = "access_denied"
        else:
            code = secrets.token_urlsafe(24)
            self.state.codes[code] = AuthorizationCode(
                code=code,
                scopes=params.scopes or SCOPES,
                expires_at=time.time() + 300,
                client_id=client_id,
                code_challenge=params.code_challenge,
                redirect_uri=params.redirect_uri,
                redirect_uri_provided_explicitly=params.redirect_uri_provided_explicitly,
                resource=params.resource,
                subject=user or DEFAULT_USER,
            )
            query["code"] = code
        return f"{params.redirect_uri}?{urlencode(query)}"

    async def load_authorization_code(
        self, client: OAuthClientInformationFull, authorization_code: str
    ) -> AuthorizationCode | None:
        code = self.state.codes.get(authorization_code)
        return code if code is not None and code.client_id == client.client_id else None

    def _issue(
        self, client_id: str, scopes: list[str], resource: str | None, subject: str | None
    ) -> Any:
        from mcp.shared.auth import OAuthToken

        now = int(time.time())
        access = jwt.encode(
            {
                "iss": self.issuer,
                "sub": subject,
                "aud": resource or "",
                "iat": now,
                "exp": now + self.state.access_ttl,
                "jti": secrets.token_hex(8),
                "client_id": client_id,
                "scope": " ".join(scopes),
            },
            self.secret,
            algorithm="HS256",
        )
        refresh = secrets.token_urlsafe(24)
        self.state.refresh_tokens[refresh] = RefreshToken(
            token=refresh, client_id=client_id, scopes=scopes, resource=resource, subject=subject
        )
        return OAuthToken(
            access_token=access,
            expires_in=self.state.access_ttl,
            scope=" ".join(scopes),
            refresh_token=refresh,
        )

    async def exchange_authorization_code(
        self, client: OAuthClientInformationFull, authorization_code: AuthorizationCode
    ) -> Any:
        self.state.token_requests += 1
        if self.state.codes.pop(authorization_code.code, None) is None:  # used once
            raise TokenError("invalid_grant", "authorization code already used")
        assert client.client_id is not None
        return self._issue(
            client.client_id,
            authorization_code.scopes,
            authorization_code.resource,
            authorization_code.subject,
        )

    async def load_refresh_token(
        self, client: OAuthClientInformationFull, refresh_token: str
    ) -> RefreshToken | None:
        token = self.state.refresh_tokens.get(refresh_token)
        return token if token is not None and token.client_id == client.client_id else None

    async def exchange_refresh_token(
        self, client: OAuthClientInformationFull, refresh_token: RefreshToken, scopes: list[str]
    ) -> Any:
        self.state.token_requests += 1
        if self.state.slow_seconds:
            await asyncio.sleep(self.state.slow_seconds)
        if self.state.refresh_tokens.pop(refresh_token.token, None) is None:  # rotation
            raise TokenError("invalid_grant", "refresh token already used")
        if self.state.refuse_refresh:
            raise TokenError("invalid_grant", "refresh refused")
        self.state.refreshes += 1
        assert client.client_id is not None
        return self._issue(
            client.client_id,
            scopes or refresh_token.scopes,
            refresh_token.resource,
            refresh_token.subject,
        )

    async def load_access_token(self, token: str) -> AccessToken | None:
        return verify(token, self.secret, None, self.state.revoked)

    async def revoke_token(self, token: AccessToken | RefreshToken) -> None:
        self.state.revocations += 1
        if isinstance(token, RefreshToken):
            self.state.refresh_tokens.pop(token.token, None)
        else:
            claims = jwt.decode(token.token, options={"verify_signature": False})
            self.state.revoked.add(str(claims.get("jti")))


def verify(token: str, secret: str, audience: str | None, revoked: set[str]) -> AccessToken | None:
    try:
        claims = jwt.decode(
            token,
            secret,
            algorithms=["HS256"],
            audience=audience,
            options={"verify_aud": audience is not None},
        )
    except jwt.PyJWTError:
        return None
    if str(claims.get("jti")) in revoked:
        return None
    return AccessToken(
        token=token,
        client_id=str(claims.get("client_id")),
        scopes=str(claims.get("scope", "")).split(),
        expires_at=int(claims["exp"]),
        resource=claims.get("aud"),
        subject=claims.get("sub"),
    )


def build_authorization_server(state: ServerState, issuer: str, secret: str) -> Starlette:
    provider = TestProvider(state, issuer, secret)
    routes = create_auth_routes(
        provider=provider,
        issuer_url=AnyHttpUrl(issuer),
        client_registration_options=ClientRegistrationOptions(
            enabled=True, valid_scopes=SCOPES, default_scopes=SCOPES
        ),
        revocation_options=RevocationOptions(enabled=True),
    )

    async def login(request: Request) -> Response:
        pending = request.query_params.get("pending", "")
        if pending not in state.pending:
            return JSONResponse({"error": "unknown sign-in"}, status_code=400)
        user = request.cookies.get("test_user") or request.query_params.get("user")
        deny = request.cookies.get("test_deny") == "1"
        return RedirectResponse(provider.sign_in(pending, user, deny), status_code=302)

    async def test_state(request: Request) -> Response:
        return JSONResponse(state.as_json())

    async def test_config(request: Request) -> Response:
        body = await request.json()
        for key in ("access_ttl", "refuse_refresh", "slow_seconds", "omit_iss"):
            if key in body:
                setattr(state, key, body[key])
        return JSONResponse(state.as_json())

    async def metadata(request: Request) -> Response:
        document = build_metadata(
            AnyHttpUrl(issuer),
            None,
            ClientRegistrationOptions(enabled=True, valid_scopes=SCOPES, default_scopes=SCOPES),
            RevocationOptions(enabled=True),
        ).model_dump(mode="json", exclude_none=True)
        document["authorization_response_iss_parameter_supported"] = True
        return JSONResponse(document)

    routes = [r for r in routes if r.path != "/.well-known/oauth-authorization-server"]
    routes += [
        Route("/.well-known/oauth-authorization-server", metadata),
        Route("/login", login),
        Route("/test/state", test_state),
        Route("/test/config", test_config, methods=["POST"]),
    ]
    return Starlette(routes=routes)


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
