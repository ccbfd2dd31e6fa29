"""Fetching from an OAuth server under the outbound rules of a tool source's URL.

`url_problem` says why a URL may not be fetched (https only, http and loopback only beside a
loopback source, no credentials, no private, link-local, multicast or reserved address);
`Fetcher` gets one document at a time, never following a redirect, at most
`MAX_DOCUMENT_BYTES` within its seconds. The discovery (`oauth/discovery.py`) and the client
steps (`oauth/protocol.py`, which re-exports these names) fetch through it.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import socket
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
from pydantic import ValidationError

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


def loopback(host: str) -> bool:
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
    if loopback(host) and not allow_loopback:
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
            raise OAuthProblem(f"{what}: the URL {shown(url)} is refused ({problem})")
        try:
            async with asyncio.timeout(self.seconds), self._client() as client:
                response = await client.request(method, url, **kwargs)
                body = await response.aread()
        except TimeoutError as exc:
            raise OAuthProblem(f"{what}: no answer from {shown(url)} in time") from exc
        except BodyTooLarge as exc:
            raise OAuthProblem(
                f"{what}: the answer of {shown(url)} is larger than {exc.limit_bytes} bytes"
            ) from exc
        except BodyEncoded as exc:
            raise OAuthProblem(f"{what}: {shown(url)} sent a compressed answer") from exc
        except httpx.HTTPError as exc:
            raise OAuthProblem(
                f"{what}: could not reach {shown(url)} ({type(exc).__name__})"
            ) from exc
        if response.is_redirect:
            raise OAuthProblem(f"{what}: {shown(url)} redirects elsewhere; redirects are refused")
        return response, body

    async def document(self, what: str, url: str) -> dict[str, Any] | None:
        """A JSON document, None when the server has none there (404)."""
        response, body = await self.request(
            what, "GET", url, headers={"Accept": "application/json"}
        )
        if response.status_code in (404, 405):
            return None
        if response.status_code != 200:
            raise OAuthProblem(f"{what}: {shown(url)} answered HTTP {response.status_code}")
        return json_object(what, body)


def json_object(what: str, body: bytes) -> dict[str, Any]:
    try:
        value = json.loads(body)
    except ValueError as exc:
        raise OAuthProblem(f"{what}: the answer is not JSON") from exc
    if not isinstance(value, dict):
        raise OAuthProblem(f"{what}: the answer is not a JSON object")
    return value


def shown(url: str) -> str:
    """The URL without its query (where a code or token could be)."""
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, parts.path, "", ""))


def first_error(exc: ValidationError) -> str:
    error = exc.errors()[0]
    where = ".".join(str(p) for p in error.get("loc", ()))
    return f"{where}: {error.get('msg', 'invalid')}" if where else str(error.get("msg"))
