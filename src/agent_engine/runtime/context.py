"""What one run needs, read once at its start: the agent, its owner, its model and tools.

The optional-tool selection is filtered here, at the run's start: a tool the admin disallowed
(`tools.agents_allowed = false`) or the code no longer has is simply not offered.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection

from agent_engine.db import runs as runs_sql
from agent_engine.db.platform import PlatformSettings
from agent_engine.domain.zones import user_zone_name
from agent_engine.runtime.tools.registry import optional_tools
from agent_engine.runtime.tools.spec import McpTool


@dataclass(frozen=True)
class ModelSpec:
    provider: str  # "openai" | "builtin"
    model: str
    base_url: str | None
    api_key_env: str | None
    # The admin's name for it (`agent_models.name`): what owners read in errors, never the URL.
    name: str | None = None
    # Its `agent_models` row (set on the models of a fallback chain; None when not known).
    id: int | None = None

    @property
    def label(self) -> str:
        return f"model {(self.name or self.model)!r}"


@dataclass(frozen=True)
class RunContext:
    run_id: int
    agent_id: int
    owner_id: int
    owner_timezone: str
    prompt: str
    model: ModelSpec
    optional_tools: tuple[str, ...]
    platform_prompt: str
    iteration_cap: int
    # Allowed MCP tools of the selection whose source is enabled (with where to call them).
    mcp_tools: tuple[McpTool, ...] = ()
    # The owner's cap on one run's tokens (None: none): passed, the run stops FAILED / TOKEN_CAP.
    max_tokens_per_run: int | None = None
    # A retry run: the failed run it continues (its transcript was carried over as reused steps).
    retry_of: int | None = None
    # The agent's name (what the run's trace span is named after).
    agent_name: str = ""


async def load_run_context(conn: AsyncConnection, run_id: int) -> RunContext | None:
    """The run's context, or None when the run or its agent is gone or the agent has no model."""
    row = (await conn.execute(runs_sql.LOAD_CONTEXT, {"run_id": run_id})).first()
    if row is None:
        return None
    return run_context_from_row(row, platform=PlatformSettings.from_rows(row.platform or {}))


def run_context_from_row(row: Any, *, platform: PlatformSettings) -> RunContext | None:
    """The context from a row with `db.runs.CONTEXT_COLUMNS` (one statement: run → agent → owner,
    model, allowed tool selection and the platform settings); None when the agent has no model."""
    if row.provider is None:
        return None
    registered = optional_tools()
    return RunContext(
        run_id=row.run_id,
        agent_id=row.agent_id,
        owner_id=row.owner_id,
        owner_timezone=user_zone_name(row.owner_timezone, platform.timezone),
        prompt=row.prompt,
        model=ModelSpec(
            provider=row.provider,
            model=row.model,
            base_url=row.base_url,
            api_key_env=row.api_key_env,
            name=row.model_name,
        ),
        optional_tools=tuple(name for name in row.tool_names if name in registered),
        platform_prompt=platform.platform_prompt,
        iteration_cap=platform.iteration_cap,
        mcp_tools=tuple(McpTool.from_json(value) for value in (row.mcp_tools or ())),
        max_tokens_per_run=row.max_tokens_per_run,
        retry_of=row.retry_of,
        agent_name=row.agent_name,
    )
