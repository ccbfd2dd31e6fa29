"""The authorization server of `testing/oauth_servers.py`: a real OAuth 2.1 server built with
the `mcp` SDK's handlers (metadata RFC 8414, /authorize with PKCE, /token, /register RFC 7591,
/revoke RFC 7009) over `TestProvider`, and `verify`, the check of its access tokens (HS256 JWTs)
the resource server applies. `ServerState` is what a test steers and reads (`/test/state`,
`/test/config`). `oauth_servers` re-exports these names and runs both servers.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

import jwt
from mcp.server.auth.provider import (
    AccessToken,
    AuthorizationCode,
    AuthorizationParams,
    RefreshToken,
    TokenError,
)
from mcp.server.auth.routes import (
    build_metadata,
    create_auth_routes,
)
from mcp.server.auth.settings import ClientRegistrationOptions, RevocationOptions
from mcp.shared.auth import OAuthClientInformationFull
from pydantic import AnyHttpUrl
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Route

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
