"""Fixtures: a real MCP server (the ticket server, the `mcp` SDK over Streamable HTTP) and helpers
to register it as an admin."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import dramatiq
import pytest

from agent_engine.testing.fake_openai import FakeOpenAIServer, text_reply
from agent_engine.testing.mcp_tickets import TicketServer
from tests.integration.runs.support import FakeAgent
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


@dataclass
class McpAgent:
    """An agent of `Scene.agent`: its row, its owner's id and the ticket tools' ids by name."""

    row: dict[str, Any]
    tools: dict[str, str]

    @property
    def id(self) -> str:
        return str(self.row["id"])

    @property
    def owner(self) -> int:
        return int(self.row["user_id"])


@dataclass
class Scene:
    """One test's world of MCP runs: the admin, the API, the ticket server, the fake model, and
    the worker running (the `mcp` fixture starts it)."""

    admin: Admin
    gql: Gql
    tickets: TicketServer
    fake_openai: FakeOpenAIServer
    fake_agent: FakeAgent

    async def agent(self, **values: Any) -> McpAgent:
        """A new agent on the fake model with both ticket tools allowed and attached."""
        row, tools = await mcp_agent(self.admin, self.gql, self.tickets, self.fake_agent, **values)
        return McpAgent(row, tools)

    async def start(self, agent: McpAgent) -> str:
        return await self.gql.start(agent.id, as_user=agent.owner)

    async def finished(self, agent: McpAgent) -> dict[str, Any]:
        """A new run of the agent, once it has ended (with its steps)."""
        return await self.gql.finished_run(await self.start(agent), as_user=agent.owner)

    def tool_messages(self, request: int = 1) -> list[str]:
        """What the model heard as tool results in its `request`-th call (counting from 0)."""
        messages = self.fake_openai.requests[request]["messages"]
        return [m["content"] for m in messages if m["role"] == "tool"]

    async def barrier(self) -> None:
        """A run of another agent, ended: the messages queued before it have been handled."""
        self.fake_openai.enqueue(text_reply("barrier"))
        other = await self.fake_agent()
        owner = int(other["user_id"])
        await self.gql.finished_run(await self.gql.start(other["id"], as_user=owner), as_user=owner)


@pytest.fixture
def mcp(
    admin: Admin,
    gql: Gql,
    tickets: TicketServer,
    fake_openai: FakeOpenAIServer,
    fake_agent: FakeAgent,
    worker: dramatiq.Worker,
) -> Scene:
    return Scene(admin, gql, tickets, fake_openai, fake_agent)
