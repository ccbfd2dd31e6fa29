"""Statements on `tool_sources` and the MCP tools of the catalog (`tools.source_id`)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from agent_engine.db.rows import AnyRow, columns


@dataclass(frozen=True, slots=True)
class ToolSourceRow:
    id: int
    name: str
    url: str
    auth_env: str | None
    enabled: bool
    last_synced_at: datetime | None
    last_error: str | None
    created_at: datetime

    @classmethod
    def from_row(cls, row: AnyRow) -> ToolSourceRow:
        values = columns(row)
        return cls(
            id=int(values["id"]),
            name=values["name"],
            url=values["url"],
            auth_env=values["auth_env"],
            enabled=bool(values["enabled"]),
            last_synced_at=values["last_synced_at"],
            last_error=values["last_error"],
            created_at=values["created_at"],
        )


@dataclass(frozen=True, slots=True)
class CatalogEntry:
    """One MCP tool as a sync writes it."""

    name: str
    remote_name: str
    description: str
    input_schema: Any
    access: str


SELECT_SOURCE = text("SELECT * FROM tool_sources WHERE id = :id")
SELECT_SOURCE_BY_NAME = text("SELECT * FROM tool_sources WHERE name = :name")
ALL_SOURCES = text("SELECT * FROM tool_sources ORDER BY name")
ENABLED_SOURCE_IDS = text("SELECT id FROM tool_sources WHERE enabled ORDER BY id")
SOURCES_BY_ID = text("SELECT * FROM tool_sources WHERE id = ANY(CAST(:ids AS bigint[]))")
INSERT_SOURCE = text(
    "INSERT INTO tool_sources (name, url, auth_env, enabled)"
    " VALUES (:name, :url, :auth_env, :enabled) RETURNING id"
)
UPDATE_SOURCE = text(
    "UPDATE tool_sources SET name = :name, url = :url, auth_env = :auth_env,"
    " enabled = :enabled, updated_at = now() WHERE id = :id RETURNING id"
)
DELETE_SOURCE = text("DELETE FROM tool_sources WHERE id = :id RETURNING id")
SYNC_FAILED = text("UPDATE tool_sources SET last_error = :error WHERE id = :id")
SYNC_DONE = text(
    "UPDATE tool_sources SET last_error = :error, last_synced_at = now() WHERE id = :id"
)
# A sync keeps each tool's agents_allowed; a tool that changed name on our side (the source was
# renamed) keeps its row, and with it the agents' selections.
UPSERT_SOURCE_TOOL = text(
    """
    INSERT INTO tools (name, description, source_id, remote_name, input_schema, access)
    VALUES (:name, :description, :source_id, :remote_name, CAST(:input_schema AS jsonb), :access)
    ON CONFLICT (source_id, remote_name) DO UPDATE SET
        name = EXCLUDED.name, description = EXCLUDED.description,
        input_schema = EXCLUDED.input_schema, access = EXCLUDED.access
    """
)
TAKEN_NAMES = text(
    "SELECT name FROM tools WHERE name = ANY(CAST(:names AS text[]))"
    " AND (source_id IS DISTINCT FROM :source_id)"
)
DELETE_VANISHED = text(
    "DELETE FROM tools WHERE source_id = :source_id"
    " AND NOT (remote_name = ANY(CAST(:keep AS text[])))"
)
LOCK_SOURCE = text("SELECT * FROM tool_sources WHERE id = :id FOR UPDATE")


async def fetch_source(conn: AsyncConnection, source_id: int) -> ToolSourceRow | None:
    row = (await conn.execute(SELECT_SOURCE, {"id": source_id})).mappings().one_or_none()
    return None if row is None else ToolSourceRow.from_row(row)


async def lock_source(conn: AsyncConnection, source_id: int) -> ToolSourceRow | None:
    """The source, locked until commit: two syncs of one source take turns."""
    row = (await conn.execute(LOCK_SOURCE, {"id": source_id})).mappings().one_or_none()
    return None if row is None else ToolSourceRow.from_row(row)


async def source_by_name(conn: AsyncConnection, name: str) -> ToolSourceRow | None:
    row = (await conn.execute(SELECT_SOURCE_BY_NAME, {"name": name})).mappings().one_or_none()
    return None if row is None else ToolSourceRow.from_row(row)


async def all_sources(conn: AsyncConnection) -> list[ToolSourceRow]:
    return [ToolSourceRow.from_row(r) for r in (await conn.execute(ALL_SOURCES)).mappings()]


async def sources_by_id(conn: AsyncConnection, ids: Sequence[int]) -> list[ToolSourceRow]:
    rows = await conn.execute(SOURCES_BY_ID, {"ids": list(ids)})
    return [ToolSourceRow.from_row(r) for r in rows.mappings()]


async def enabled_source_ids(conn: AsyncConnection) -> list[int]:
    return [int(i) for i in (await conn.execute(ENABLED_SOURCE_IDS)).scalars()]


async def insert_source(
    conn: AsyncConnection, *, name: str, url: str, auth_env: str | None, enabled: bool
) -> int:
    params = {"name": name, "url": url, "auth_env": auth_env, "enabled": enabled}
    return int((await conn.execute(INSERT_SOURCE, params)).scalar_one())


async def update_source(
    conn: AsyncConnection,
    source_id: int,
    *,
    name: str,
    url: str,
    auth_env: str | None,
    enabled: bool,
) -> bool:
    params = {"id": source_id, "name": name, "url": url, "auth_env": auth_env, "enabled": enabled}
    return (await conn.execute(UPDATE_SOURCE, params)).first() is not None


async def delete_source(conn: AsyncConnection, source_id: int) -> bool:
    return (await conn.execute(DELETE_SOURCE, {"id": source_id})).first() is not None


async def record_sync_failure(conn: AsyncConnection, source_id: int, error: str) -> None:
    await conn.execute(SYNC_FAILED, {"id": source_id, "error": error})


async def names_taken_elsewhere(
    conn: AsyncConnection, source_id: int, names: Sequence[str]
) -> set[str]:
    """Those of `names` the catalog already has for another source or the engine itself."""
    rows = await conn.execute(TAKEN_NAMES, {"names": list(names), "source_id": source_id})
    return {str(name) for name in rows.scalars()}


async def write_sync(
    conn: AsyncConnection, source_id: int, entries: Sequence[CatalogEntry], error: str | None
) -> None:
    """The source's tools become `entries`: new ones join (not allowed), known ones are updated
    (keeping agents_allowed), vanished ones leave the catalog (their agents' links cascade).
    The upserts go as one batch (executemany), not a round trip per tool."""
    if entries:
        await conn.execute(
            UPSERT_SOURCE_TOOL,
            [
                {
                    "name": entry.name,
                    "description": entry.description,
                    "source_id": source_id,
                    "remote_name": entry.remote_name,
                    "input_schema": json.dumps(entry.input_schema),
                    "access": entry.access,
                }
                for entry in entries
            ],
        )
    await conn.execute(
        DELETE_VANISHED, {"source_id": source_id, "keep": [e.remote_name for e in entries]}
    )
    await conn.execute(SYNC_DONE, {"id": source_id, "error": error})
