"""Discovery of a source's authorization server under the outbound rules: a metadata document
pointing at a private or metadata address, one that redirects elsewhere, a 10 MB one, and an
authorization server that never answers are each a clear error of connectToolSource that changes
nothing (no pending sign-in, no registration)."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Route

from agent_engine.oauth import protocol
from agent_engine.oauth.keys import ENV as KEYS_ENV
from agent_engine.server_thread import ServerThread
from agent_engine.settings import Settings
from tests.integration.api.subscriptions.support import Server
from tests.integration.runs.support import fetch
from tests.integration.runs.transcript.support import Gql
from tests.integration.tool_sources.conftest import Admin
from tests.integration.tool_sources.oauth_support import OAUTH_SOURCE
from tests.support.factories import Factories

KEY = "QUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUE="  # base64 of 32 x "A"


class HostileAuth(ServerThread):
    """MCP endpoints whose 401 leads to bad metadata: /<case>/mcp."""

    thread_name = "hostile-auth"
    description = "the hostile metadata server"

    def __init__(self, silent_port: int) -> None:
        super().__init__()
        self.silent_port = silent_port

    def app(self) -> Starlette:
        base = lambda: f"http://127.0.0.1:{self.port}"  # noqa: E731

        async def mcp(request: Request) -> Response:
            case = request.path_params["case"]
            return Response(
                status_code=401,
                headers={"WWW-Authenticate": f'Bearer resource_metadata="{base()}/{case}/prm"'},
            )

        def prm(servers: list[str]) -> dict[str, Any]:
            return {"resource": base(), "authorization_servers": servers}

        async def metadata(request: Request) -> Response:
            case = request.path_params["case"]
            if case == "private":
                return JSONResponse(prm(["https://10.0.0.7"]))
            if case == "cloud":
                return JSONResponse(prm(["https://169.254.169.254"]))
            if case == "redirect":
                return RedirectResponse("https://example.com/prm", status_code=302)
            if case == "huge":
                return Response(
                    b'{"x": "' + b"a" * 10_000_000 + b'"}', media_type="application/json"
                )
            if case == "silent":
                return JSONResponse(prm([f"http://127.0.0.1:{self.silent_port}"]))
            return Response(status_code=404)

        return Starlette(
            routes=[
                Route("/{case}/mcp", mcp, methods=["POST", "GET"]),
                Route("/{case}/prm", metadata),
            ]
        )


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port that takes connections and never answers."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        yield sock.getsockname()[1]


@pytest.fixture
def hostile(silent_port: int) -> Iterator[HostileAuth]:
    with HostileAuth(silent_port) as server:
        yield server


@pytest.mark.parametrize(
    ("case", "says"),
    [
        ("private", "points at a private address"),
        ("cloud", "link-local address (such as a cloud metadata service)"),
        ("redirect", "redirects elsewhere; redirects are refused"),
        ("huge", f"larger than {protocol.MAX_DOCUMENT_BYTES} bytes"),
        ("silent", "in time"),
    ],
)
async def test_bad_discovery_is_a_clear_error_that_changes_nothing(
    case: str,
    says: str,
    hostile: HostileAuth,
    admin: Admin,
    gql: Gql,
    factories: Factories,
    engine: AsyncEngine,
    settings: Settings,
    server: Server,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    settings.public_url = server.url
    settings.token_keys = KEY
    settings.oauth_timeout_seconds = 1.0
    monkeypatch.setenv(KEYS_ENV, KEY)
    url = f"http://127.0.0.1:{hostile.port}/{case}/mcp"
    source = (
        await admin.gql.data(
            OAUTH_SOURCE,
            {"input": {"name": case, "url": url, "auth": "OWNER_OAUTH"}},
            as_user=admin.id,
            admin=True,
        )
    )["upsertToolSource"]
    owner = (await factories.user())["id"]

    started = asyncio.get_running_loop().time()
    body = await gql.body(
        "mutation($id: ID!) { connectToolSource(sourceId: $id) { authorizationUrl } }",
        {"id": source["id"]},
        as_user=owner,
    )
    elapsed = asyncio.get_running_loop().time() - started

    message = body["errors"][0]["message"]
    assert f"cannot connect to the tool source {case!r}" in message and says in message, message
    assert body["errors"][0]["extensions"]["code"] == "CONFLICT"
    assert elapsed < 5
    assert await fetch(engine, "SELECT * FROM oauth_states") == []
    assert await fetch(engine, "SELECT * FROM tool_source_oauth_clients") == []


async def test_a_name_that_resolves_to_a_private_address_is_refused_like_the_address() -> None:
    assert await protocol.url_problem("https://localhost/x", allow_loopback=False) is not None
    assert await protocol.url_problem("https://10.1.2.3/x", allow_loopback=True) == (
        "points at a private address"
    )
    assert await protocol.url_problem("http://example.com/x", allow_loopback=True) == (
        "plain http:// is allowed only to a loopback address (127.0.0.1, ::1, localhost)"
    )
