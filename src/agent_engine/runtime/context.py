"""What one run needs, read once at its start: the agent, its owner, its model and tools.

The optional-tool selection is filtered here, at the run's start: a tool the admin disallowed
(`tools.agents_allowed = false`) or the code no longer has is simply not offered.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from agent_engine.db.platform import PlatformSettings
from agent_engine.runtime.tools.registry import optional_tools


@dataclass(frozen=True)
class ModelSpec:
    provider: str  # "openai" | "builtin"
    model: str
    base_url: str | None
    api_key_env: str | None


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


# One statement: run → agent → owner, model, allowed tool selection and the platform settings.
# The worker's claim selects the same columns (`CONTEXT_COLUMNS`, over `CONTEXT_FROM`'s aliases) in
# its own locking read and builds the context with `run_context_from_row`: no second statement.
CONTEXT_COLUMNS = """
    r.id AS run_id, a.id AS agent_id, a.user_id AS owner_id, a.prompt,
    u.timezone AS owner_timezone,
    m.provider, m.model, m.base_url, m.api_key_env,
    ARRAY(
        SELECT t.name FROM agent_tools at JOIN tools t ON t.id = at.tool_id
        WHERE at.agent_id = a.id AND t.agents_allowed
        ORDER BY t.name
    ) AS tool_names,
    (SELECT coalesce(jsonb_object_agg(p.key, p.value), '{}'::jsonb)
     FROM platform_settings p) AS platform
"""
CONTEXT_FROM = """
    FROM agent_runs r
    JOIN agents a ON a.id = r.agent_id
    LEFT JOIN users u ON u.id = a.user_id
    LEFT JOIN agent_models m ON m.id = a.model_id
    WHERE r.id = :run_id
"""
_LOAD = text("SELECT" + CONTEXT_COLUMNS + CONTEXT_FROM)


async def load_run_context(conn: AsyncConnection, run_id: int) -> RunContext | None:
    """The run's context, or None when the run or its agent is gone or the agent has no model."""
    row = (await conn.execute(_LOAD, {"run_id": run_id})).first()
    if row is None:
        return None
    return run_context_from_row(row, platform=PlatformSettings.from_rows(row.platform or {}))


def run_context_from_row(row: Any, *, platform: PlatformSettings) -> RunContext | None:
    """The context from a row with `CONTEXT_COLUMNS`; None when the agent has no model."""
    if row.provider is None:
        return None
    registered = optional_tools()
    return RunContext(
        run_id=row.run_id,
        agent_id=row.agent_id,
        owner_id=row.owner_id,
        owner_timezone=row.owner_timezone or platform.timezone,
        prompt=row.prompt,
        model=ModelSpec(
            provider=row.provider,
            model=row.model,
            base_url=row.base_url,
            api_key_env=row.api_key_env,
        ),
        optional_tools=tuple(name for name in row.tool_names if name in registered),
        platform_prompt=platform.platform_prompt,
        iteration_cap=platform.iteration_cap,
    )
