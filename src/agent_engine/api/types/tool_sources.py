"""MCP tool sources (admins only)."""

from __future__ import annotations

from datetime import datetime

import strawberry

from agent_engine.api.resolvers import Info, described
from agent_engine.api.types.catalog import Tool
from agent_engine.db.tool_sources import ToolSourceRow


@strawberry.type(
    description=(
        "An MCP server (Streamable HTTP transport) whose tools join the catalog. Admins only."
    )
)
class ToolSource:
    row: strawberry.Private[ToolSourceRow]
    id: strawberry.ID
    name: str = strawberry.field(
        description=(
            "Lowercase letters, digits and _ (^[a-z][a-z0-9_]{0,31}$); prefixes its tools' names."
        )
    )
    url: str
    auth_env: str | None = strawberry.field(
        description=(
            "Name of the environment variable (on the workers and api) holding the bearer "
            "credential sent to the server; null = none."
        )
    )
    enabled: bool
    last_synced_at: datetime | None
    last_error: str | None = strawberry.field(
        description="Why the last sync failed; null after a successful one."
    )

    @classmethod
    def from_row(cls, row: ToolSourceRow) -> ToolSource:
        return cls(
            row=row,
            id=strawberry.ID(str(row.id)),
            name=row.name,
            url=row.url,
            auth_env=row.auth_env,
            enabled=row.enabled,
            last_synced_at=row.last_synced_at,
            last_error=row.last_error,
        )

    @described(description="Its tools in the catalog, allowed or not.")
    async def tools(self, info: Info) -> list[Tool]:
        rows = await info.context.loaders.tools_of_source.load(self.row.id)
        return [Tool.from_row(row) for row in rows]
