"""The OAuth 2.1 client side of the MCP authorization specification (2025-06-18), over httpx.

The documents are the `mcp` SDK's models (`mcp.shared.auth`: ProtectedResourceMetadata,
OAuthMetadata, OAuthClientMetadata, OAuthClientInformationFull, OAuthToken): the SDK keeps them in
step with the specification. The SDK's `OAuthClientProvider` is an interactive httpx.Auth for one
user at a desktop (it waits on a redirect handler and keeps tokens in one process's storage), so
the steps are driven here, server-side, one HTTP request each, with the state in PostgreSQL.

Every URL fetched obeys the outbound rules of a tool source's URL (`url_problem`): https (http only
to loopback, and loopback only when the source itself is on loopback), no credentials in the URL,
no private, link-local (cloud metadata), multicast or reserved address; redirects are never
followed; every answer is read through `CountingTransport` (at most `MAX_DOCUMENT_BYTES`, counted
as the bytes arrive) within `seconds`.

Where the parts live: the fetching under those rules is `oauth/fetch.py`, the discovery of a
source's authorization server `oauth/discovery.py`; this module keeps the client's steps
(registration, PKCE, the authorization URL, the token requests, revocation, the account). The
names are re-exported here.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import secrets
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode, urlsplit

from mcp.shared.auth import (
    OAuthClientInformationFull,
    OAuthClientMetadata,
    OAuthToken,
)
from pydantic import AnyUrl, ValidationError

from agent_engine.oauth.discovery import ServerMetadata as ServerMetadata
from agent_engine.oauth.discovery import (
    authorization_server_metadata as authorization_server_metadata,
)
from agent_engine.oauth.discovery import discover as discover
from agent_engine.oauth.fetch import CLIENT_NAME as CLIENT_NAME
from agent_engine.oauth.fetch import DEFAULT_SECONDS as DEFAULT_SECONDS
from agent_engine.oauth.fetch import MAX_DOCUMENT_BYTES as MAX_DOCUMENT_BYTES
from agent_engine.oauth.fetch import MCP_PROTOCOL_VERSION as MCP_PROTOCOL_VERSION
from agent_engine.oauth.fetch import Fetcher as Fetcher
from agent_engine.oauth.fetch import OAuthProblem as OAuthProblem
from agent_engine.oauth.fetch import Refused as Refused
from agent_engine.oauth.fetch import first_error, json_object, loopback
from agent_engine.oauth.fetch import url_problem as url_problem

# --- the client ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Client:
    client_id: str
    client_secret: str | None


async def register(
    server: ServerMetadata,
    *,
    redirect_uri: str,
    scope: str | None,
    seconds: float = DEFAULT_SECONDS,
) -> Client:
    """Dynamic client registration (RFC 7591)."""
    endpoint = server.metadata.get("registration_endpoint")
    if not endpoint:
        raise OAuthProblem(
            "the authorization server offers no dynamic client registration: configure a client"
            " (oauthClientIdEnv, oauthClientSecretEnv)"
        )
    body = OAuthClientMetadata(
        redirect_uris=[AnyUrl(redirect_uri)],
        token_endpoint_auth_method="client_secret_post",
        grant_types=["authorization_code", "refresh_token"],
        response_types=["code"],
        scope=scope,
        client_name=CLIENT_NAME,
    ).model_dump(mode="json", exclude_none=True)
    fetcher = _fetcher_for(server, seconds)
    response, raw = await fetcher.request(
        "registering the engine at the authorization server", "POST", str(endpoint), json=body
    )
    if response.status_code not in (200, 201):
        raise OAuthProblem(
            f"the authorization server refused the registration (HTTP {response.status_code}"
            f"{_error_code(raw)})"
        )
    try:
        info = OAuthClientInformationFull.model_validate(json_object("registration", raw))
    except ValidationError as exc:
        raise OAuthProblem(f"the registration answer is not valid ({first_error(exc)})") from exc
    if not info.client_id:
        raise OAuthProblem("the registration answer has no client_id")
    return Client(info.client_id, info.client_secret)


def _fetcher_for(server: ServerMetadata, seconds: float) -> Fetcher:
    return Fetcher(
        allow_loopback=loopback(urlsplit(server.resource).hostname or ""), seconds=seconds
    )


def _error_code(raw: bytes) -> str:
    """`: invalid_grant` from an OAuth error answer (the code only: a description may echo
    anything)."""
    try:
        value = json.loads(raw)
    except ValueError:
        return ""
    code = value.get("error") if isinstance(value, dict) else None
    if isinstance(code, str) and re.fullmatch(r"[a-z_]{1,40}", code):
        return f": {code}"
    return ""


@dataclass(frozen=True)
class Pkce:
    verifier: str
    challenge: str

    @classmethod
    def new(cls) -> Pkce:
        verifier = secrets.token_urlsafe(48)
        digest = hashlib.sha256(verifier.encode()).digest()
        return cls(verifier, base64.urlsafe_b64encode(digest).rstrip(b"=").decode())


def authorization_url(
    server: ServerMetadata,
    client: Client,
    *,
    redirect_uri: str,
    state: str,
    challenge: str,
    scope: str | None,
) -> str:
    params = {
        "response_type": "code",
        "client_id": client.client_id,
        "redirect_uri": redirect_uri,
        "state": state,
        "code_challenge": challenge,
        "code_challenge_method": "S256",
        "resource": server.resource,
    }
    if scope:
        params["scope"] = scope
    endpoint = str(server.metadata["authorization_endpoint"])
    joiner = "&" if urlsplit(endpoint).query else "?"
    return f"{endpoint}{joiner}{urlencode(params)}"


@dataclass(frozen=True)
class Tokens:
    access_token: str
    refresh_token: str | None
    expires_at: float | None  # epoch seconds
    scopes: tuple[str, ...]
    account: str | None


def _client_auth(client: Client) -> dict[str, str]:
    fields = {"client_id": client.client_id}
    if client.client_secret:
        fields["client_secret"] = client.client_secret
    return fields


async def _token_request(
    server: ServerMetadata, client: Client, fields: dict[str, str], what: str, seconds: float
) -> Tokens:
    fetcher = _fetcher_for(server, seconds)
    response, raw = await fetcher.request(
        what,
        "POST",
        str(server.metadata["token_endpoint"]),
        data=fields | _client_auth(client),
        headers={"Accept": "application/json"},
    )
    if response.status_code in (400, 401):
        raise Refused(
            f"{what}: the authorization server refused (HTTP {response.status_code}"
            f"{_error_code(raw)})"
        )
    if response.status_code != 200:
        raise OAuthProblem(f"{what}: the authorization server answered HTTP {response.status_code}")
    document = json_object(what, raw)
    try:
        token = OAuthToken.model_validate(document)
    except ValidationError as exc:
        raise OAuthProblem(f"{what}: the token answer is not valid ({first_error(exc)})") from exc
    scopes = tuple(token.scope.split()) if token.scope else tuple(fields.get("scope", "").split())
    return Tokens(
        access_token=token.access_token,
        refresh_token=token.refresh_token,
        expires_at=None if token.expires_in is None else time.time() + token.expires_in,
        scopes=scopes,
        account=account_of(document),
    )


async def exchange_code(
    server: ServerMetadata,
    client: Client,
    *,
    code: str,
    verifier: str,
    redirect_uri: str,
    seconds: float = DEFAULT_SECONDS,
) -> Tokens:
    fields = {
        "grant_type": "authorization_code",
        "code": code,
        "code_verifier": verifier,
        "redirect_uri": redirect_uri,
        "resource": server.resource,
    }
    return await _token_request(server, client, fields, "exchanging the code for tokens", seconds)


async def refresh(
    server: ServerMetadata,
    client: Client,
    *,
    refresh_token: str,
    seconds: float = DEFAULT_SECONDS,
) -> Tokens:
    fields = {
        "grant_type": "refresh_token",
        "refresh_token": refresh_token,
        "resource": server.resource,
    }
    return await _token_request(server, client, fields, "refreshing the account's tokens", seconds)


async def revoke(
    server: ServerMetadata,
    client: Client,
    *,
    token: str,
    hint: str,
    seconds: float = DEFAULT_SECONDS,
) -> bool:
    """RFC 7009, when the authorization server offers it; False when it does not."""
    endpoint = server.metadata.get("revocation_endpoint")
    if not endpoint:
        return False
    fetcher = _fetcher_for(server, seconds)
    response, raw = await fetcher.request(
        "revoking the account's tokens",
        "POST",
        str(endpoint),
        data={"token": token, "token_type_hint": hint} | _client_auth(client),
    )
    if response.status_code != 200:
        raise OAuthProblem(
            f"revoking the account's tokens: the authorization server answered HTTP "
            f"{response.status_code}{_error_code(raw)}"
        )
    return True


def _jwt_claims(token: object) -> dict[str, Any] | None:
    if not isinstance(token, str) or token.count(".") != 2:
        return None
    payload = token.split(".")[1]
    try:
        value = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def account_of(document: dict[str, Any]) -> str | None:
    """The account the tokens are for, as the authorization server names it: the ID token's or a
    JWT access token's subject (preferring a readable name). The answer came straight from the
    token endpoint over TLS, so no signature is checked; the account is shown, never trusted
    for a decision."""
    for field in ("id_token", "access_token"):
        claims = _jwt_claims(document.get(field))
        if not claims:
            continue
        for claim in ("preferred_username", "email", "sub"):
            value = claims.get(claim)
            if isinstance(value, str) and value:
                return value[:200]
    return None
