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
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import ipaddress
import json
import re
import secrets
import socket
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode, urlsplit, urlunsplit

import httpx
from mcp.shared.auth import (
    OAuthClientInformationFull,
    OAuthClientMetadata,
    OAuthMetadata,
    OAuthToken,
    ProtectedResourceMetadata,
)
from pydantic import AnyUrl, ValidationError

from agent_engine.bounded_reads import BodyEncoded, BodyTooLarge, CountingTransport
from agent_engine.domain.mcp import source_url_problem

# A metadata document, a registration or a token answer is a few kilobytes.
MAX_DOCUMENT_BYTES = 256_000
DEFAULT_SECONDS = 10.0
CLIENT_NAME = "Agent Engine"
MCP_PROTOCOL_VERSION = "2025-06-18"


class OAuthProblem(Exception):
    """A step failed; the message names the step and the party, never a token or secret."""


class Refused(OAuthProblem):
    """The authorization server answered and refused (e.g. `invalid_grant`): not worth retrying."""


def _loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _address_problem(address: str, allow_loopback: bool) -> str | None:
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if ip.is_loopback:
        return None if allow_loopback else "points at a loopback address"
    if ip.is_link_local:
        return "points at a link-local address (such as a cloud metadata service)"
    if ip.is_private:
        return "points at a private address"
    if ip.is_multicast or ip.is_reserved or ip.is_unspecified:
        return "points at a reserved address"
    return None


async def url_problem(url: str, *, allow_loopback: bool) -> str | None:
    """Why the engine will not fetch `url` for OAuth, or None. The host's addresses are resolved
    and each is checked (a name resolving to a private address is refused like the address)."""
    if problem := source_url_problem(url):
        return problem
    host = urlsplit(url).hostname or ""
    if _loopback(host) and not allow_loopback:
        return "points at a loopback address, and the tool source is not on this machine"
    try:
        ipaddress.ip_address(host)
        addresses = [host]
    except ValueError:
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(
                host, None, type=socket.SOCK_STREAM
            )
        except OSError:
            return f"names a host ({host!r}) that does not resolve"
        addresses = sorted({str(info[4][0]) for info in infos})
    for address in addresses:
        if problem := _address_problem(address, allow_loopback):
            return problem
    return None


@dataclass
class Fetcher:
    """Bounded, rule-checked HTTP for one OAuth step."""

    allow_loopback: bool
    seconds: float = DEFAULT_SECONDS

    def _client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            timeout=httpx.Timeout(self.seconds),
            follow_redirects=False,
            transport=CountingTransport(limit_bytes=MAX_DOCUMENT_BYTES),
        )

    async def request(
        self, what: str, method: str, url: str, **kwargs: Any
    ) -> tuple[httpx.Response, bytes]:
        if problem := await url_problem(url, allow_loopback=self.allow_loopback):
            raise OAuthProblem(f"{what}: the URL {_shown(url)} is refused ({problem})")
        try:
            async with asyncio.timeout(self.seconds), self._client() as client:
                response = await client.request(method, url, **kwargs)
                body = await response.aread()
        except TimeoutError as exc:
            raise OAuthProblem(f"{what}: no answer from {_shown(url)} in time") from exc
        except BodyTooLarge as exc:
            raise OAuthProblem(
                f"{what}: the answer of {_shown(url)} is larger than {exc.limit_bytes} bytes"
            ) from exc
        except BodyEncoded as exc:
            raise OAuthProblem(f"{what}: {_shown(url)} sent a compressed answer") from exc
        except httpx.HTTPError as exc:
            raise OAuthProblem(
                f"{what}: could not reach {_shown(url)} ({type(exc).__name__})"
            ) from exc
        if response.is_redirect:
            raise OAuthProblem(f"{what}: {_shown(url)} redirects elsewhere; redirects are refused")
        return response, body

    async def document(self, what: str, url: str) -> dict[str, Any] | None:
        """A JSON document, None when the server has none there (404)."""
        response, body = await self.request(
            what, "GET", url, headers={"Accept": "application/json"}
        )
        if response.status_code in (404, 405):
            return None
        if response.status_code != 200:
            raise OAuthProblem(f"{what}: {_shown(url)} answered HTTP {response.status_code}")
        return _json_object(what, body)


def _json_object(what: str, body: bytes) -> dict[str, Any]:
    try:
        value = json.loads(body)
    except ValueError as exc:
        raise OAuthProblem(f"{what}: the answer is not JSON") from exc
    if not isinstance(value, dict):
        raise OAuthProblem(f"{what}: the answer is not a JSON object")
    return value


def _shown(url: str) -> str:
    """The URL without its query (where a code or token could be)."""
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, parts.path, "", ""))


# --- discovery ----------------------------------------------------------------------------------

_RESOURCE_METADATA = re.compile(r'resource_metadata\s*=\s*"([^"]+)"')


@dataclass(frozen=True)
class ServerMetadata:
    """What discovery found: the resource (the MCP server), its authorization server's metadata
    (as the document said it), and the scopes the resource offers."""

    resource: str
    issuer: str
    metadata: dict[str, Any]
    resource_scopes: tuple[str, ...] | None

    @property
    def oauth(self) -> OAuthMetadata:
        return OAuthMetadata.model_validate(self.metadata)

    def to_json(self) -> dict[str, Any]:
        return {
            "resource": self.resource,
            "issuer": self.issuer,
            "metadata": self.metadata,
            "resourceScopes": None if self.resource_scopes is None else list(self.resource_scopes),
        }

    @classmethod
    def from_json(cls, value: dict[str, Any]) -> ServerMetadata:
        scopes = value.get("resourceScopes")
        return cls(
            resource=value["resource"],
            issuer=value["issuer"],
            metadata=value["metadata"],
            resource_scopes=None if scopes is None else tuple(scopes),
        )


def _well_known(base: str, name: str) -> list[str]:
    """RFC 8414 §3.1 / RFC 9728 §3.1: the well-known segment goes between host and path."""
    parts = urlsplit(base)
    path = parts.path.rstrip("/")
    urls = [urlunsplit((parts.scheme, parts.netloc, f"/.well-known/{name}{path}", "", ""))]
    if path:
        urls.append(urlunsplit((parts.scheme, parts.netloc, f"/.well-known/{name}", "", "")))
    return urls


async def discover(source_url: str, *, seconds: float = DEFAULT_SECONDS) -> ServerMetadata:
    """The MCP server's authorization server and its metadata: the 401's `resource_metadata`
    (or the well-known protected resource metadata, RFC 9728), then the authorization server's
    metadata (RFC 8414, falling back to OpenID discovery)."""
    fetcher = Fetcher(
        allow_loopback=_loopback(urlsplit(source_url).hostname or ""), seconds=seconds
    )
    candidates: list[str] = []
    response, _ = await fetcher.request(
        "asking the tool server how to sign in",
        "POST",
        source_url,
        headers={
            "Accept": "application/json, text/event-stream",
            "Content-Type": "application/json",
            "MCP-Protocol-Version": MCP_PROTOCOL_VERSION,
        },
        content=json.dumps(
            {
                "jsonrpc": "2.0",
                "id": 1,
                "method": "initialize",
                "params": {
                    "protocolVersion": MCP_PROTOCOL_VERSION,
                    "capabilities": {},
                    "clientInfo": {"name": CLIENT_NAME, "version": "1"},
                },
            }
        ),
    )
    if response.status_code == 401:
        challenge = response.headers.get("www-authenticate", "")
        if match := _RESOURCE_METADATA.search(challenge):
            candidates.append(match.group(1))
    candidates += _well_known(source_url, "oauth-protected-resource")
    resource_doc: dict[str, Any] | None = None
    for url in candidates:
        resource_doc = await fetcher.document("reading the tool server's resource metadata", url)
        if resource_doc is not None:
            break
    if resource_doc is None:
        raise OAuthProblem(
            "the tool server publishes no protected resource metadata (RFC 9728): it does not"
            " say which authorization server to use"
        )
    try:
        resource = ProtectedResourceMetadata.model_validate(resource_doc)
    except ValidationError as exc:
        raise OAuthProblem(
            f"the tool server's resource metadata is not valid ({_first_error(exc)})"
        ) from exc
    issuer = str(resource.authorization_servers[0])
    metadata = await authorization_server_metadata(issuer, fetcher)
    return ServerMetadata(
        resource=source_url,
        issuer=str(metadata["issuer"]),
        metadata=metadata,
        resource_scopes=None
        if resource.scopes_supported is None
        else tuple(resource.scopes_supported),
    )


async def authorization_server_metadata(issuer: str, fetcher: Fetcher) -> dict[str, Any]:
    urls = _well_known(issuer, "oauth-authorization-server") + _well_known(
        issuer, "openid-configuration"
    )
    parts = urlsplit(issuer)
    if parts.path.strip("/"):  # OpenID Connect Discovery 1.0: the suffix after the issuer path
        urls.append(issuer.rstrip("/") + "/.well-known/openid-configuration")
    for url in dict.fromkeys(urls):
        doc = await fetcher.document("reading the authorization server's metadata", url)
        if doc is None:
            continue
        try:
            parsed = OAuthMetadata.model_validate(doc)
        except ValidationError as exc:
            raise OAuthProblem(
                f"the authorization server's metadata is not valid ({_first_error(exc)})"
            ) from exc
        if str(parsed.issuer).rstrip("/") != issuer.rstrip("/"):
            raise OAuthProblem(
                "the authorization server's metadata names another issuer than the tool server"
                " (RFC 8414 §3.3)"
            )
        methods = parsed.code_challenge_methods_supported
        if methods is not None and "S256" not in methods:
            raise OAuthProblem("the authorization server does not support PKCE with S256")
        for endpoint in ("authorization_endpoint", "token_endpoint"):
            target = str(getattr(parsed, endpoint))
            if problem := await url_problem(target, allow_loopback=fetcher.allow_loopback):
                raise OAuthProblem(f"the authorization server's {endpoint} {problem}")
        return {k: v for k, v in doc.items() if isinstance(k, str)}
    raise OAuthProblem(
        "the authorization server publishes no metadata (RFC 8414 or OpenID discovery)"
    )


def _first_error(exc: ValidationError) -> str:
    error = exc.errors()[0]
    where = ".".join(str(p) for p in error.get("loc", ()))
    return f"{where}: {error.get('msg', 'invalid')}" if where else str(error.get("msg"))


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
        info = OAuthClientInformationFull.model_validate(_json_object("registration", raw))
    except ValidationError as exc:
        raise OAuthProblem(f"the registration answer is not valid ({_first_error(exc)})") from exc
    if not info.client_id:
        raise OAuthProblem("the registration answer has no client_id")
    return Client(info.client_id, info.client_secret)


def _fetcher_for(server: ServerMetadata, seconds: float) -> Fetcher:
    return Fetcher(
        allow_loopback=_loopback(urlsplit(server.resource).hostname or ""), seconds=seconds
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
    document = _json_object(what, raw)
    try:
        token = OAuthToken.model_validate(document)
    except ValidationError as exc:
        raise OAuthProblem(f"{what}: the token answer is not valid ({_first_error(exc)})") from exc
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
