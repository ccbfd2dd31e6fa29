"""What a tool is: its spec (name, description, JSON schema of its arguments, handler), what it
may know of the run calling it, and the refusal it may answer with. The core tools, the built-ins
and the plugins all build on this; the registry (`registry.py`) collects them.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy.ext.asyncio import AsyncEngine

if TYPE_CHECKING:
    from agent_engine.knowledge.store import KnowledgeStore


OWNER_OAUTH = "owner_oauth"


class ToolError(Exception):
    """A tool's own refusal (bad arguments, nothing found): the message goes back to the model,
    which may correct the call. Anything else a tool raises is an infrastructure failure, which
    ends the run failed/error naming the tool (`ToolFailed`)."""


class ToolFailed(Exception):
    """A tool could not answer for reasons outside the model's control; the run ends failed."""

    def __init__(self, tool: str, detail: str) -> None:
        super().__init__(f"tool {tool} failed: {detail}")
        self.tool = tool


@dataclass(frozen=True)
class ToolCallContext:
    """What a tool may know about the run calling it. Knowledge reads go through `knowledge`
    as `owner_id`; `now` is the run's clock reading (passed in, never read by tools)."""

    run_id: int
    agent_id: int
    owner_id: int
    owner_timezone: str
    now: datetime
    knowledge: KnowledgeStore
    engine: AsyncEngine


ToolHandler = Callable[[ToolCallContext, dict[str, Any]], Awaitable[str]]


@dataclass(frozen=True)
class ToolSpec:
    name: str
    description: str
    parameters: dict[str, Any]  # JSON schema of the arguments object
    handler: ToolHandler
    # An MCP tool (`McpTool` below): called on its server, arguments checked against
    # its full JSON Schema; None for the engine's own tools.
    mcp: McpTool | None = None

    def openai_schema(self) -> dict[str, Any]:
        """The tool as offered in a Chat Completions request."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters,
            },
        }


@dataclass(frozen=True)
class McpTool:
    """An allowed MCP tool of the agent's selection, with where and how to call it."""

    id: int
    name: str  # the catalog name the model calls: <source>__<tool>
    description: str
    input_schema: dict[str, Any]
    access: str  # "read" | "write"
    remote_name: str
    source: str
    url: str
    auth_env: str | None
    auto_approved: bool
    # Whose authority a call carries: its source's `auth` ("none" | "shared" | "owner_oauth").
    auth: str = "none"
    source_id: int | None = None

    @classmethod
    def from_json(cls, value: dict[str, Any]) -> McpTool:
        schema = value.get("input_schema")
        return cls(
            id=int(value["id"]),
            name=str(value["name"]),
            description=str(value.get("description") or ""),
            input_schema=schema if isinstance(schema, dict) else {"type": "object"},
            access=str(value.get("access") or "write"),
            remote_name=str(value["remote_name"]),
            source=str(value["source"]),
            url=str(value["url"]),
            auth_env=value.get("auth_env"),
            auto_approved=bool(value.get("auto_approved")),
            auth=str(value.get("auth") or ("shared" if value.get("auth_env") else "none")),
            source_id=None if value.get("source_id") is None else int(value["source_id"]),
        )

    @property
    def owner_oauth(self) -> bool:
        return self.auth == OWNER_OAUTH

    @property
    def needs_approval(self) -> bool:
        return self.access != "read" and not self.auto_approved
