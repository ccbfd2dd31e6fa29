"""Statements on the admin's catalog: the allowed model list (`agent_models`) and `tools`.

The locking choices are the callers' reasons, kept beside the statement they shape: KEY SHARE on a
referenced row holds it until commit, so a concurrent removal waits and then cascades (or sets
NULL) instead of the writer failing on the foreign key after its check.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from agent_engine.db import direct
from agent_engine.db.rows import AnyRow, columns, read_keyed_rows, read_rows


@dataclass(frozen=True, slots=True)
class AgentModelRow:
    """One `agent_models` row."""

    id: int
    name: str
    provider: str
    model: str
    base_url: str | None
    api_key_env: str | None
    is_default: bool
    created_at: datetime
    max_concurrent_runs: int | None
    input_price_per_million: Decimal | None
    output_price_per_million: Decimal | None
    # The model that answers while this one is down (p0005_model_fallback); None = none.
    fallback_model_id: int | None = None

    @classmethod
    def from_row(cls, row: AnyRow) -> AgentModelRow:
        values = columns(row)
        return cls(
            id=int(values["id"]),
            name=values["name"],
            provider=values["provider"],
            model=values["model"],
            base_url=values["base_url"],
            api_key_env=values["api_key_env"],
            is_default=bool(values["is_default"]),
            created_at=values["created_at"],
            max_concurrent_runs=values["max_concurrent_runs"],
            input_price_per_million=values["input_price_per_million"],
            output_price_per_million=values["output_price_per_million"],
            fallback_model_id=values.get("fallback_model_id"),
        )


@dataclass(frozen=True, slots=True)
class ToolRow:
    """One `tools` row."""

    id: int
    name: str
    description: str
    agents_allowed: bool
    created_at: datetime
    # MCP tools: their source, the server's name, the arguments' schema; READ or WRITE.
    source_id: int | None = None
    remote_name: str | None = None
    input_schema: Any = None
    access: str = "read"

    @classmethod
    def from_row(cls, row: AnyRow) -> ToolRow:
        values = columns(row)
        source_id = values.get("source_id")
        return cls(
            id=int(values["id"]),
            name=values["name"],
            description=values["description"],
            agents_allowed=bool(values["agents_allowed"]),
            created_at=values["created_at"],
            source_id=None if source_id is None else int(source_id),
            remote_name=values.get("remote_name"),
            input_schema=values.get("input_schema"),
            access=values.get("access") or "read",
        )


@dataclass(frozen=True, slots=True)
class ModelLimit:
    """A saved model's id and its concurrency limit before and after the write."""

    id: int
    previous: int | None
    limit: int | None


# --- models -----------------------------------------------------------------------------------

SHARE_DEFAULT_MODEL = text("SELECT id FROM agent_models WHERE is_default FOR KEY SHARE")
SHARE_MODEL = text("SELECT 1 FROM agent_models WHERE id = :id FOR KEY SHARE")
LOCK_MODEL = text("SELECT * FROM agent_models WHERE id = :id FOR UPDATE")
CLEAR_OTHER_DEFAULT = text(
    "UPDATE agent_models SET is_default = false WHERE is_default AND id IS DISTINCT FROM :id"
)
INSERT_MODEL = text(
    "INSERT INTO agent_models (name, provider, model, base_url, api_key_env,"
    " is_default, max_concurrent_runs)"
    " VALUES (:name, :provider, :model, :base_url, :api_key_env,"
    " :is_default, :max_concurrent_runs) RETURNING id, max_concurrent_runs"
)
# The previous limit comes from the old row (a self-join sees it before the update).
UPDATE_MODEL = text(
    "UPDATE agent_models AS m SET name = :name, provider = :provider,"
    " model = :model, base_url = :base_url, api_key_env = :api_key_env,"
    " is_default = :is_default,"
    " max_concurrent_runs = CASE WHEN :keep_limit THEN m.max_concurrent_runs"
    " ELSE CAST(:max_concurrent_runs AS integer) END"
    " FROM agent_models AS old WHERE m.id = :id AND old.id = m.id"
    " RETURNING m.id, old.max_concurrent_runs AS previous, m.max_concurrent_runs"
)
DELETE_MODEL = text("DELETE FROM agent_models WHERE id = :id RETURNING *")
# The model's agents, locked in id order before the delete's SET NULL reaches them: the cascade
# would lock them in whatever order its scan finds them, and another multi-row write of agents
# (locking in id order) could then hold one it waits for while waiting for one it holds.
LOCK_MODEL_AGENTS = text("SELECT id FROM agents WHERE model_id = :id ORDER BY id FOR NO KEY UPDATE")
FIRST_BUILTIN_MODEL = text(
    "SELECT id FROM agent_models WHERE provider = 'builtin' ORDER BY id LIMIT 1"
)
MODEL_BY_NAME = text("SELECT id FROM agent_models WHERE name = :name")
ANY_DEFAULT_MODEL = text("SELECT 1 FROM agent_models WHERE is_default")

# The price columns `set_model_prices` may write: its statement is built from these names only.
PRICE_COLUMNS = {
    "input_price_per_million": "input_price_per_million",
    "output_price_per_million": "output_price_per_million",
}


async def model_id_by_name(conn: AsyncConnection, name: str) -> int | None:
    """The id of the model named `name`, None when there is none."""
    found = (await conn.execute(MODEL_BY_NAME, {"name": name})).first()
    return None if found is None else int(found[0])


async def share_default_model(conn: AsyncConnection) -> int | None:
    """The default model's id, key-share locked until commit; None when there is none."""
    found = (await conn.execute(SHARE_DEFAULT_MODEL)).scalar_one_or_none()
    return None if found is None else int(found)


async def share_model(conn: AsyncConnection, model_id: int) -> bool:
    """Key-share lock the model until commit; False when it is not on the list."""
    return (await conn.execute(SHARE_MODEL, {"id": model_id})).first() is not None


async def lock_model(conn: AsyncConnection, model_id: int) -> AgentModelRow | None:
    row = (await conn.execute(LOCK_MODEL, {"id": model_id})).mappings().one_or_none()
    return None if row is None else AgentModelRow.from_row(row)


async def clear_other_default(conn: AsyncConnection, model_id: int | None) -> None:
    """Take the default flag from every model but `model_id` (one default: a unique index)."""
    await conn.execute(CLEAR_OTHER_DEFAULT, {"id": model_id})


@dataclass(frozen=True, slots=True)
class ModelFields:
    """What an admin writes of a model (prices and the catalog's flags aside)."""

    name: str
    provider: str
    model: str
    base_url: str | None = None
    api_key_env: str | None = None
    is_default: bool = False
    max_concurrent_runs: int | None = None


def _model_params(fields: ModelFields) -> dict[str, Any]:
    return {
        "name": fields.name,
        "provider": fields.provider,
        "model": fields.model,
        "base_url": fields.base_url,
        "api_key_env": fields.api_key_env,
        "is_default": fields.is_default,
        "max_concurrent_runs": fields.max_concurrent_runs,
    }


async def insert_model(conn: AsyncConnection, fields: ModelFields) -> ModelLimit:
    created = (await conn.execute(INSERT_MODEL, _model_params(fields))).one()
    return ModelLimit(int(created.id), None, created.max_concurrent_runs)


async def update_model(
    conn: AsyncConnection, model_id: int, fields: ModelFields, *, keep_limit: bool
) -> ModelLimit | None:
    """Replace the model's fields; `keep_limit` leaves its concurrency limit as stored."""
    params = {**_model_params(fields), "id": model_id, "keep_limit": keep_limit}
    updated = (await conn.execute(UPDATE_MODEL, params)).one_or_none()
    if updated is None:
        return None
    return ModelLimit(int(updated.id), updated.previous, updated.max_concurrent_runs)


# The database refuses a chain that comes back (trigger `agent_models_fallback_acyclic`).
FALLBACK_CYCLE_CONSTRAINT = "ck_agent_models_fallback_acyclic"
SET_MODEL_FALLBACK = text(
    "UPDATE agent_models SET fallback_model_id = :fallback WHERE id = :id RETURNING id"
)


async def set_model_fallback(conn: AsyncConnection, model_id: int, fallback_id: int | None) -> bool:
    """Write the model's fallback (None: none); False when the model is gone. A cycle raises
    the database's IntegrityError (constraint `FALLBACK_CYCLE_CONSTRAINT`)."""
    updated = (
        await conn.execute(SET_MODEL_FALLBACK, {"id": model_id, "fallback": fallback_id})
    ).scalar_one_or_none()
    return updated is not None


async def set_model_prices(
    conn: AsyncConnection, model_id: int, prices: Mapping[str, Decimal | None]
) -> bool:
    """Write the given prices (keys of `PRICE_COLUMNS`); False when the model is gone."""
    assignments = ", ".join(f"{PRICE_COLUMNS[name]} = :{name}" for name in prices)
    updated = (
        await conn.execute(
            text(f"UPDATE agent_models SET {assignments} WHERE id = :id RETURNING id"),
            {**prices, "id": model_id},
        )
    ).scalar_one_or_none()
    return updated is not None


async def delete_model(conn: AsyncConnection, model_id: int) -> AgentModelRow | None:
    """Remove the model; its agents' `model_id` goes NULL (the foreign key's SET NULL).

    Lock order: the model row first (as a pick of the model does: KEY SHARE on the model, then
    the agent), then its agents in id order, then the delete."""
    if await lock_model(conn, model_id) is None:
        return None
    await conn.execute(LOCK_MODEL_AGENTS, {"id": model_id})
    row = (await conn.execute(DELETE_MODEL, {"id": model_id})).mappings().one_or_none()
    return None if row is None else AgentModelRow.from_row(row)


async def first_builtin_model(conn: AsyncConnection) -> int | None:
    found = (await conn.execute(FIRST_BUILTIN_MODEL)).scalar()
    return None if found is None else int(found)


async def has_default_model(conn: AsyncConnection) -> bool:
    return (await conn.execute(ANY_DEFAULT_MODEL)).scalar() is not None


# --- tools ------------------------------------------------------------------------------------

# KEY SHARE: a concurrent delete waits; the link then cascades away.
SHARE_ALLOWED_TOOLS = text(
    "SELECT id FROM tools WHERE id = ANY(CAST(:ids AS bigint[])) AND agents_allowed FOR KEY SHARE"
)
LOCK_TOOL = text("SELECT * FROM tools WHERE id = :id FOR UPDATE")
SET_TOOL_ALLOWED = text("UPDATE tools SET agents_allowed = :allowed WHERE id = :id")
ALLOW_ALL_TOOLS = text("UPDATE tools SET agents_allowed = true")


async def share_allowed_tools(conn: AsyncConnection, tool_ids: Sequence[int]) -> set[int]:
    """Those of the tools that exist and are allowed for agents, key-share locked."""
    rows = await conn.execute(SHARE_ALLOWED_TOOLS, {"ids": list(tool_ids)})
    return {int(tool_id) for tool_id in rows.scalars()}


async def lock_tool(conn: AsyncConnection, tool_id: int) -> ToolRow | None:
    row = (await conn.execute(LOCK_TOOL, {"id": tool_id})).mappings().one_or_none()
    return None if row is None else ToolRow.from_row(row)


async def set_tool_allowed(conn: AsyncConnection, tool_id: int, allowed: bool) -> None:
    await conn.execute(SET_TOOL_ALLOWED, {"id": tool_id, "allowed": allowed})


async def allow_all_tools(conn: AsyncConnection) -> None:
    await conn.execute(ALLOW_ALL_TOOLS)


UPSERT_TOOL_DESCRIPTIONS = text(
    """
    INSERT INTO tools (name, description)
    SELECT * FROM unnest(CAST(:names AS text[]), CAST(:descriptions AS text[]))
    ON CONFLICT (name) DO UPDATE SET description = EXCLUDED.description
    WHERE tools.description IS DISTINCT FROM EXCLUDED.description
    """
)


async def upsert_tool_descriptions(conn: AsyncConnection, tools: Sequence[tuple[str, str]]) -> None:
    """New tools start with agents_allowed = false; a known tool's description is refreshed."""
    await conn.execute(
        UPSERT_TOOL_DESCRIPTIONS,
        {"names": [name for name, _ in tools], "descriptions": [desc for _, desc in tools]},
    )


# --- reads for the API ------------------------------------------------------------------------

MODELS_BY_ID = text("SELECT * FROM agent_models WHERE id = ANY(CAST(:ids AS bigint[]))")
ALL_MODELS = text("SELECT * FROM agent_models ORDER BY id")
SELECT_MODEL = text("SELECT * FROM agent_models WHERE id = :id")
ALL_TOOLS = text("SELECT * FROM tools ORDER BY name")
ALLOWED_TOOL_LIST = text("SELECT * FROM tools WHERE agents_allowed ORDER BY name")
SELECT_TOOL = text("SELECT * FROM tools WHERE id = :id")
# Each tool once, with the agents (of those asked for) that selected it: a page's hundred agents
# share a few tools, and a tool's row (its description, its arguments' schema) is read once.
TOOLS_OF_AGENTS = text(
    "SELECT array_agg(at.agent_id) AS agent_ids, t.* FROM agent_tools at"
    " JOIN tools t ON t.id = at.tool_id WHERE at.agent_id = ANY(CAST(:ids AS bigint[]))"
    " GROUP BY t.id ORDER BY t.name"
)


TOOLS_BY_ID = text("SELECT * FROM tools WHERE id = ANY(CAST(:ids AS bigint[]))")
TOOLS_OF_SOURCES = text(
    "SELECT * FROM tools WHERE source_id = ANY(CAST(:ids AS bigint[])) ORDER BY name"
)


async def tools_by_id(conn: AsyncConnection, tool_ids: Sequence[int]) -> list[ToolRow]:
    rows = await conn.execute(TOOLS_BY_ID, {"ids": list(tool_ids)})
    return read_rows(rows, ToolRow)


AUTO_APPROVED_OF_AGENTS = text(
    "SELECT at.agent_id, t.* FROM agent_tools at JOIN tools t ON t.id = at.tool_id"
    " WHERE at.agent_id = ANY(CAST(:ids AS bigint[])) AND at.auto_approved ORDER BY t.name"
)


async def auto_approved_of_agents(
    conn: AsyncConnection, agent_ids: Sequence[int]
) -> list[tuple[int, ToolRow]]:
    rows = await conn.execute(AUTO_APPROVED_OF_AGENTS, {"ids": list(agent_ids)})
    return read_keyed_rows(rows, "agent_id", ToolRow, same_by="id")


async def tools_of_sources(conn: AsyncConnection, source_ids: Sequence[int]) -> list[ToolRow]:
    rows = await conn.execute(TOOLS_OF_SOURCES, {"ids": list(source_ids)})
    return read_rows(rows, ToolRow)


async def models_by_id(conn: AsyncConnection, model_ids: Sequence[int]) -> list[AgentModelRow]:
    rows = await direct.fetch(conn, MODELS_BY_ID, {"ids": list(model_ids)})
    return read_rows(rows, AgentModelRow)


async def all_models(conn: AsyncConnection) -> list[AgentModelRow]:
    return read_rows(await conn.execute(ALL_MODELS), AgentModelRow)


async def fetch_model(conn: AsyncConnection, model_id: int) -> AgentModelRow | None:
    row = (await conn.execute(SELECT_MODEL, {"id": model_id})).mappings().one_or_none()
    return None if row is None else AgentModelRow.from_row(row)


async def list_tools(conn: AsyncConnection, *, allowed_only: bool) -> list[ToolRow]:
    """The catalog by name: every tool, or those agents may use now."""
    rows = await conn.execute(ALLOWED_TOOL_LIST if allowed_only else ALL_TOOLS)
    return read_rows(rows, ToolRow)


async def fetch_tool(conn: AsyncConnection, tool_id: int) -> ToolRow | None:
    row = (await conn.execute(SELECT_TOOL, {"id": tool_id})).mappings().one_or_none()
    return None if row is None else ToolRow.from_row(row)


async def tools_of_agents(
    conn: AsyncConnection, agent_ids: Sequence[int]
) -> list[tuple[int, ToolRow]]:
    """(agent id, tool) for each agent's selection, by tool name."""
    rows = await direct.fetch(conn, TOOLS_OF_AGENTS, {"ids": list(agent_ids)})
    return [
        (agent_id, tool)
        for selected_by, tool in read_keyed_rows(rows, "agent_ids", ToolRow, same_by="id")
        for agent_id in selected_by
    ]
