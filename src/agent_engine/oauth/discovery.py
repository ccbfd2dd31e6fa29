"""Discovery of a tool source's authorization server (MCP authorization, 2025-06-18): the
protected resource's metadata (from the server's `WWW-Authenticate` challenge or its well-known
URL), then the authorization server's metadata (OAuth, then OpenID Connect well-known URLs).

Every document is fetched by `oauth/fetch.py`'s `Fetcher` under the outbound rules; the client
steps that follow are `oauth/protocol.py`, which re-exports these names.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from mcp.shared.auth import OAuthMetadata, ProtectedResourceMetadata
from pydantic import ValidationError

from agent_engine.oauth.fetch import (
    CLIENT_NAME,
    DEFAULT_SECONDS,
    MCP_PROTOCOL_VERSION,
    Fetcher,
    OAuthProblem,
    first_error,
    loopback,
    url_problem,
)

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
    fetcher = Fetcher(allow_loopback=loopback(urlsplit(source_url).hostname or ""), seconds=seconds)
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
            f"the tool server's resource metadata is not valid ({first_error(exc)})"
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
                f"the authorization server's metadata is not valid ({first_error(exc)})"
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
