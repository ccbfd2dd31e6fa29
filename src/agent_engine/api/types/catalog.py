"""What admins curate for every owner: the allowed models, the tools (and the MCP sources some
come from) and the platform settings."""

from __future__ import annotations

from datetime import datetime

import strawberry
from strawberry.scalars import JSON

from agent_engine.api.resolvers import Info, described, viewer_is_admin
from agent_engine.api.scalars import DecimalText, decimal_text_or_none
from agent_engine.api.types.connections import ToolSourceAuth
from agent_engine.db.catalog import AgentModelRow, ToolRow
from agent_engine.db.platform import PlatformSettings as PlatformSettingsRow
from agent_engine.db.tool_sources import ToolSourceRow
from agent_engine.domain.mcp import ToolAccess


@strawberry.type
class AgentModel:
    row: strawberry.Private[AgentModelRow]
    id: strawberry.ID
    name: str
    provider: str = strawberry.field(description="openai | builtin")
    model: str = strawberry.field(description="The provider's model name, e.g. gpt-4o-mini.")
    is_default: bool = strawberry.field(description="Preselected for new agents.")
    max_concurrent_runs: int | None = strawberry.field(
        description=(
            "At most this many runs of this model are RUNNING at once across all workers; the"
            " rest wait QUEUED. null = no limit."
        )
    )
    input_price_per_million: DecimalText | None = strawberry.field(
        description=(
            "Price per million prompt (input) tokens, in PlatformSettings.currency; "
            "null = not priced."
        )
    )
    output_price_per_million: DecimalText | None = strawberry.field(
        description="Price per million completion (output) tokens; null = not priced."
    )

    @classmethod
    def from_row(cls, row: AgentModelRow) -> AgentModel:
        return cls(
            row=row,
            id=strawberry.ID(str(row.id)),
            name=row.name,
            provider=row.provider,
            model=row.model,
            is_default=row.is_default,
            max_concurrent_runs=row.max_concurrent_runs,
            input_price_per_million=decimal_text_or_none(row.input_price_per_million),
            output_price_per_million=decimal_text_or_none(row.output_price_per_million),
        )

    @described(
        description=(
            "Answers this model's calls when it is down: rate-limited past the wait, 5xx, timed"
            " out or unreachable — never for a request it refused (4xx). Visible to everyone;"
            " set by admins."
        )
    )
    async def fallback_model(self, info: Info) -> AgentModel | None:
        if self.row.fallback_model_id is None:
            return None
        row = await info.context.loaders.model.load(self.row.fallback_model_id)
        return AgentModel.from_row(row) if row is not None else None

    # Where a model lives and which variable holds its key are the operator's business.
    @described(
        description=(
            "Admins only: null for everyone else. The OpenAI-compatible endpoint; null = the "
            "provider's default."
        )
    )
    def base_url(self, info: Info) -> str | None:
        return self.row.base_url if viewer_is_admin(info) else None

    @described(
        description=(
            "Admins only: null for everyone else. The name of the environment variable that "
            "holds the key (never the key)."
        )
    )
    def api_key_env(self, info: Info) -> str | None:
        return self.row.api_key_env if viewer_is_admin(info) else None


@strawberry.type
class Tool:
    row: strawberry.Private[ToolRow]
    id: strawberry.ID
    name: str = strawberry.field(
        description=(
            "The name the model calls it by. For an MCP tool: <ToolSource.name>__<the server's "
            "tool name>."
        )
    )
    description: str
    agents_allowed: bool
    access: ToolAccess
    input_schema: JSON | None = strawberry.field(
        description=(
            "The JSON Schema of the tool's arguments (MCP inputSchema); null for the engine's own "
            "tools."
        )
    )

    @classmethod
    def from_row(cls, row: ToolRow) -> Tool:
        return cls(
            row=row,
            id=strawberry.ID(str(row.id)),
            name=row.name,
            description=row.description,
            agents_allowed=row.agents_allowed,
            access=ToolAccess(row.access),
            input_schema=row.input_schema,
        )

    @described(description="The MCP source's name; null for the engine's own tools.")
    async def source_name(self, info: Info) -> str | None:
        if self.row.source_id is None:
            return None
        source = await info.context.loaders.tool_source.load(self.row.source_id)
        return None if source is None else source.name

    @described(description="Admins only (null for everyone else).")
    async def source(self, info: Info) -> ToolSource | None:

        if self.row.source_id is None or not viewer_is_admin(info):
            return None
        source = await info.context.loaders.tool_source.load(self.row.source_id)
        return None if source is None else ToolSource.from_row(source)


@strawberry.type
class PlatformSettings:
    weekly_token_cap: int | None
    timezone: str
    platform_prompt: str
    iteration_cap: int
    currency: str = strawberry.field(
        description="ISO 4217 code the model prices are in; default USD."
    )
    budget_alert_percents: list[int] = strawberry.field(
        description=(
            "Thresholds, in percent of the cap, that record a BudgetAlert when crossed; "
            "default [80, 100]."
        )
    )
    run_retention_days: int | None = strawberry.field(
        description=(
            "Finished runs older than this many days are pruned, except the current budget week "
            "and each agent's last run; null = keep forever."
        )
    )

    @classmethod
    def from_value(cls, value: PlatformSettingsRow) -> PlatformSettings:
        return cls(
            weekly_token_cap=value.weekly_token_cap,
            timezone=value.timezone,
            platform_prompt=value.platform_prompt,
            iteration_cap=value.iteration_cap,
            currency=value.currency,
            budget_alert_percents=list(value.budget_alert_percents),
            run_retention_days=value.run_retention_days,
        )


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

    @strawberry.field
    def auth(self) -> ToolSourceAuth:
        return ToolSourceAuth[self.row.auth.upper()]

    @described(
        description="OWNER_OAUTH: the scopes asked for (null: the server's scopes_supported)."
    )
    def oauth_scopes(self) -> list[str] | None:
        return None if self.row.oauth_scopes is None else list(self.row.oauth_scopes)

    @described(description="OWNER_OAUTH: how many owners have a CONNECTED account.")
    async def connected_owners(self, info: Info) -> int:
        if not self.row.owner_oauth:
            return 0
        return await info.context.loaders.connected_owners.load(self.row.id)

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
