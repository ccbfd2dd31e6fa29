"""Fixtures: a real MCP server (the ticket server, the `mcp` SDK over Streamable HTTP) and helpers
to register it as an admin."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from agent_engine.testing.mcp_tickets import TicketServer
from tests.integration.runs.transcript.support import Gql
from tests.support.factories import Factories

TOKEN_ENV = "TICKETS_TOKEN"
TOKEN = "tickets-secret-token"

UPSERT_SOURCE = """
mutation($input: ToolSourceInput!) {
  upsertToolSource(input: $input) {
    id name url authEnv enabled lastSyncedAt lastError
    tools { id name description agentsAllowed access inputSchema sourceName }
  }
}
"""
SYNC_SOURCE = """
mutation($id: ID!) {
  syncToolSource(id: $id) {
    id lastError lastSyncedAt tools { id name description agentsAllowed access inputSchema }
  }
}
"""
REMOVE_SOURCE = "mutation($id: ID!) { removeToolSource(id: $id) }"
SOURCES = "{ toolSources { id name url authEnv enabled lastError tools { name } } }"
ALLOW = "mutation($id: ID!) { setToolAllowed(toolId: $id, allowed: true) { id agentsAllowed } }"


@pytest.fixture
def tickets(monkeypatch: pytest.MonkeyPatch) -> Iterator[TicketServer]:
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    with TicketServer() as server:
        yield server


class Admin:
    """The admin's side of a test: register, sync and allow MCP tools through the API."""

    def __init__(self, gql: Gql, user_id: int) -> None:
        self.gql = gql
        self.id = user_id

    async def upsert(self, **values: Any) -> dict[str, Any]:
        data = await self.gql.data(UPSERT_SOURCE, {"input": values}, as_user=self.id, admin=True)
        source: dict[str, Any] = data["upsertToolSource"]
        return source

    async def register(self, server: TicketServer, name: str = "tickets") -> dict[str, Any]:
        return await self.upsert(name=name, url=server.url, authEnv=TOKEN_ENV)

    async def sync(self, source_id: str) -> dict[str, Any]:
        data = await self.gql.data(SYNC_SOURCE, {"id": source_id}, as_user=self.id, admin=True)
        source: dict[str, Any] = data["syncToolSource"]
        return source

    async def allow(self, tool_id: str) -> None:
        await self.gql.data(ALLOW, {"id": tool_id}, as_user=self.id, admin=True)


@pytest.fixture
async def admin(gql: Gql, factories: Factories) -> Admin:
    return Admin(gql, (await factories.user())["id"])


ATTACH = """
mutation($agent: ID!, $tool: ID!) { attachTool(agentId: $agent, toolId: $tool) { id } }
"""


async def mcp_agent(
    admin: Admin, gql: Gql, tickets: TicketServer, fake_agent: Any, **values: Any
) -> tuple[dict[str, Any], dict[str, str]]:
    """An agent on the fake model with both ticket tools allowed and attached; (agent, tool ids
    by catalog name)."""
    source = await admin.register(tickets)
    tool_ids = {tool["name"]: tool["id"] for tool in source["tools"]}
    agent = await fake_agent(**values)
    for tool_id in tool_ids.values():
        await admin.allow(tool_id)
        await gql.data(
            ATTACH, {"agent": str(agent["id"]), "tool": tool_id}, as_user=int(agent["user_id"])
        )
    return agent, tool_ids
