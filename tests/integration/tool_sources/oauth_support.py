"""The OAuth test servers (agent_engine.testing.oauth_servers) as processes, a browser that signs
in at them, and the GraphQL steps of connecting an account."""

from __future__ import annotations

import secrets
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import httpx

from tests.integration.runs.transcript.support import Gql

CONNECT = """
mutation($id: ID!) { connectToolSource(sourceId: $id) { authorizationUrl expiresAt } }
"""
DISCONNECT = """
mutation($id: ID!) {
  disconnectToolSource(sourceId: $id) { sourceId sourceName status account scopes }
}
"""
CONNECTIONS = """
{ toolConnections { sourceId sourceName status account scopes connectedAt lastUsedAt } }
"""
OAUTH_SOURCE = """
mutation($input: ToolSourceInput!) {
  upsertToolSource(input: $input) {
    id name url authEnv auth oauthScopes connectedOwners enabled lastError tools { name }
  }
}
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class OAuthServers:
    issuer: str
    resource: str
    processes: list[subprocess.Popen[bytes]]

    def state(self) -> dict[str, Any]:
        body: dict[str, Any] = httpx.get(f"{self.issuer}/test/state", timeout=5).json()
        return body

    def resource_state(self) -> dict[str, Any]:
        base = self.resource.removesuffix("/mcp")
        body: dict[str, Any] = httpx.get(f"{base}/test/state", timeout=5).json()
        return body

    def configure(self, **values: Any) -> None:
        httpx.post(f"{self.issuer}/test/config", json=values, timeout=5).raise_for_status()


def _wait_listening(port: int, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError("an OAuth test server exited at start")
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError("an OAuth test server did not start")


@contextmanager
def oauth_servers() -> Iterator[OAuthServers]:
    secret = secrets.token_hex(16)
    as_port, rs_port = free_port(), free_port()
    issuer = f"http://127.0.0.1:{as_port}"
    module = "agent_engine.testing.oauth_servers"
    common = ["--secret", secret]
    processes = [
        subprocess.Popen(
            [sys.executable, "-m", module, "--role", "as", "--port", str(as_port), *common]
        ),
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                module,
                "--role",
                "rs",
                "--port",
                str(rs_port),
                "--issuer",
                issuer,
                *common,
            ]
        ),
    ]
    try:
        _wait_listening(as_port, processes[0])
        _wait_listening(rs_port, processes[1])
        yield OAuthServers(issuer, f"http://127.0.0.1:{rs_port}/mcp", processes)
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            process.wait(10)


async def connect_start(gql: Gql, source_id: str, user: int) -> str:
    data = await gql.data(CONNECT, {"id": source_id}, as_user=user)
    url: str = data["connectToolSource"]["authorizationUrl"]
    return url


async def sign_in(
    url: str, user: str, *, deny: bool = False, stop_at_callback: bool = False
) -> httpx.Response:
    """A browser: opens the authorization URL with the test server's sign-in cookie, follows the
    redirects to the engine's callback (or stops before it, answering the redirect to it)."""
    cookies = {"test_user": user}
    if deny:
        cookies["test_deny"] = "1"
    async with httpx.AsyncClient(cookies=cookies, timeout=30) as browser:
        response = await browser.get(url)
        while response.is_redirect:
            target = response.headers["location"]
            if stop_at_callback and "/oauth/callback" in target:
                return response
            response = await browser.get(target)
        return response


async def connected(gql: Gql, source_id: str, user: int, account: str) -> httpx.Response:
    """The whole flow for `user` signing in as `account`; the callback's page."""
    return await sign_in(await connect_start(gql, source_id, user), account)


async def connections(gql: Gql, user: int) -> list[dict[str, Any]]:
    data = await gql.data(CONNECTIONS, as_user=user)
    found: list[dict[str, Any]] = data["toolConnections"]
    return found
