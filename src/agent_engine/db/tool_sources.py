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
    # 'none' | 'shared' | 'owner_oauth' (e0009).
    auth: str = "none"
    oauth_scopes: tuple[str, ...] | None = None
    oauth_client_id_env: str | None = None
    oauth_client_secret_env: str | None = None

    @classmethod
    def from_row(cls, row: AnyRow) -> ToolSourceRow:
        values = columns(row)
        scopes = values.get("oauth_scopes")
        return cls(
            id=int(values["id"]),
            name=values["name"],
            url=values["url"],
            auth_env=values["auth_env"],
            enabled=bool(values["enabled"]),
            last_synced_at=values["last_synced_at"],
            last_error=values["last_error"],
            created_at=values["created_at"],
            auth=values.get("auth") or ("shared" if values["auth_env"] else "none"),
            oauth_scopes=None if scopes is None else tuple(scopes),
            oauth_client_id_env=values.get("oauth_client_id_env"),
            oauth_client_secret_env=values.get("oauth_client_secret_env"),
        )

    @property
    def owner_oauth(self) -> bool:
        return self.auth == "owner_oauth"


@dataclass(frozen=True, slots=True)
class CatalogEntry:
    """One MCP tool as a sync writes it."""

    name: str
    remote_name: str
    description: str
    input_schema: Any
    access: str


@dataclass(frozen=True, slots=True)
class ToolChange:
    """A known tool a sync changed: its label (old and new), description or schema."""

    id: int
    name: str
    old_access: str
    access: str
    agents_allowed: bool
    description_changed: bool
    schema_changed: bool

    @classmethod
    def from_row(cls, row: AnyRow) -> ToolChange:
        values = columns(row)
        return cls(
            id=int(values["id"]),
            name=values["name"],
            old_access=values["old_access"],
            access=values["access"],
            agents_allowed=bool(values["agents_allowed"]),
            description_changed=bool(values["description_changed"]),
            schema_changed=bool(values["schema_changed"]),
        )


SELECT_SOURCE = text("SELECT * FROM tool_sources WHERE id = :id")
SELECT_SOURCE_BY_NAME = text("SELECT * FROM tool_sources WHERE name = :name")
ALL_SOURCES = text("SELECT * FROM tool_sources ORDER BY name")
ENABLED_SOURCE_IDS = text("SELECT id FROM tool_sources WHERE enabled ORDER BY id")
SOURCES_BY_ID = text("SELECT * FROM tool_sources WHERE id = ANY(CAST(:ids AS bigint[]))")
INSERT_SOURCE = text(
    "INSERT INTO tool_sources (name, url, auth_env, enabled, auth, oauth_scopes,"
    " oauth_client_id_env, oauth_client_secret_env)"
    " VALUES (:name, :url, :auth_env, :enabled, :auth, CAST(:oauth_scopes AS text[]),"
    " :oauth_client_id_env, :oauth_client_secret_env) RETURNING id"
)
UPDATE_SOURCE = text(
    "UPDATE tool_sources SET name = :name, url = :url, auth_env = :auth_env,"
    " enabled = :enabled, auth = :auth, oauth_scopes = CAST(:oauth_scopes AS text[]),"
    " oauth_client_id_env = :oauth_client_id_env,"
    " oauth_client_secret_env = :oauth_client_secret_env,"
    " updated_at = now() WHERE id = :id RETURNING id"
)
DELETE_SOURCE = text("DELETE FROM tool_sources WHERE id = :id RETURNING id")
SYNC_FAILED = text("UPDATE tool_sources SET last_error = :error WHERE id = :id")
SYNC_DONE = text(
    "UPDATE tool_sources SET last_error = :error, last_synced_at = now() WHERE id = :id"
)
# A sync writes the source's tools in four statements, whatever their number. The vanished go
# first and the tools whose catalog name changes (the source was renamed) step aside to a name no
# tool can have ('#<id>'): a new tool may take a name a vanished one had, and no two rows of one
# sync ever want one name at once, in whatever order the rows are written.
DELETE_VANISHED = text(
    "DELETE FROM tools WHERE source_id = :source_id"
    " AND NOT (remote_name = ANY(CAST(:keep AS text[])))"
)
PARK_RENAMED = text(
    """
    UPDATE tools t SET name = '#' || t.id
      FROM unnest(CAST(:remote_names AS text[]), CAST(:names AS text[])) AS i(remote_name, name)
     WHERE t.source_id = :source_id AND t.remote_name = i.remote_name AND t.name <> i.name
    """
)
# New tools join not allowed; a known one keeps its agents_allowed -- unless its label went from
# WRITE to READ: a server's word that a tool became harmless is not taken by itself, an admin
# allows it again. The old values are read in the same statement (one snapshot), and only the
# known tools that changed come back, with what changed.
UPSERT_SOURCE_TOOLS = text(
    """
    WITH incoming AS (
        SELECT * FROM unnest(
            CAST(:names AS text[]), CAST(:remote_names AS text[]),
            CAST(:descriptions AS text[]), CAST(:schemas AS text[]), CAST(:accesses AS text[])
        ) AS i(name, remote_name, description, input_schema, access)
    ),
    known AS (
        SELECT t.remote_name, t.access,
               t.description IS DISTINCT FROM i.description AS description_changed,
               t.input_schema IS DISTINCT FROM CAST(i.input_schema AS jsonb) AS schema_changed
          FROM tools t JOIN incoming i ON i.remote_name = t.remote_name
         WHERE t.source_id = :source_id
    ),
    written AS (
        INSERT INTO tools (name, description, source_id, remote_name, input_schema, access)
        SELECT name, description, CAST(:source_id AS bigint), remote_name,
               CAST(input_schema AS jsonb), access
          FROM incoming
        ON CONFLICT (source_id, remote_name) DO UPDATE SET
            name = EXCLUDED.name, description = EXCLUDED.description,
            input_schema = EXCLUDED.input_schema, access = EXCLUDED.access,
            agents_allowed = tools.agents_allowed
                AND NOT (tools.access = 'write' AND EXCLUDED.access = 'read')
        RETURNING id, name, remote_name, access, agents_allowed
    )
    SELECT w.id, w.name, k.access AS old_access, w.access, w.agents_allowed,
           k.description_changed, k.schema_changed
      FROM written w JOIN known k ON k.remote_name = w.remote_name
     WHERE k.access <> w.access OR k.description_changed OR k.schema_changed
     ORDER BY w.name
    """
)
# An owner's auto-approval was given to a WRITE tool: a tool whose label changed either way starts
# over (a READ tool has none; a tool that becomes WRITE again asks first).
RESET_AUTO_APPROVED = text(
    "UPDATE agent_tools SET auto_approved = false"
    " WHERE tool_id = ANY(CAST(:ids AS bigint[])) AND auto_approved"
)
TAKEN_NAMES = text(
    "SELECT name FROM tools WHERE name = ANY(CAST(:names AS text[]))"
    " AND (source_id IS DISTINCT FROM :source_id)"
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


@dataclass(frozen=True, slots=True)
class SourceAuth:
    """How a source authenticates, as an upsert writes it."""

    auth: str = "none"
    oauth_scopes: Sequence[str] | None = None
    oauth_client_id_env: str | None = None
    oauth_client_secret_env: str | None = None

    def params(self) -> dict[str, Any]:
        return {
            "auth": self.auth,
            "oauth_scopes": None if self.oauth_scopes is None else list(self.oauth_scopes),
            "oauth_client_id_env": self.oauth_client_id_env,
            "oauth_client_secret_env": self.oauth_client_secret_env,
        }


def _auth_of(auth: SourceAuth | None, auth_env: str | None) -> SourceAuth:
    return auth if auth is not None else SourceAuth("shared" if auth_env else "none")


async def insert_source(
    conn: AsyncConnection,
    *,
    name: str,
    url: str,
    auth_env: str | None,
    enabled: bool,
    auth: SourceAuth | None = None,
) -> int:
    params = {"name": name, "url": url, "auth_env": auth_env, "enabled": enabled}
    params |= _auth_of(auth, auth_env).params()
    return int((await conn.execute(INSERT_SOURCE, params)).scalar_one())


async def update_source(
    conn: AsyncConnection,
    source_id: int,
    *,
    name: str,
    url: str,
    auth_env: str | None,
    enabled: bool,
    auth: SourceAuth | None = None,
) -> bool:
    params = {"id": source_id, "name": name, "url": url, "auth_env": auth_env, "enabled": enabled}
    params |= _auth_of(auth, auth_env).params()
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
    conn: AsyncConnection, source_id: int, entries: Sequence[CatalogEntry]
) -> list[ToolChange]:
    """The source's tools become `entries`: vanished ones leave the catalog (their agents' links
    cascade), new ones join (not allowed), known ones are updated (keeping agents_allowed, but
    for WRITE -> READ). Returns what changed in the known ones. Four statements, whatever the
    number of tools; call it under `lock_source`, then `record_sync_done`."""
    remote_names = [e.remote_name for e in entries]
    names = [e.name for e in entries]
    await conn.execute(DELETE_VANISHED, {"source_id": source_id, "keep": remote_names})
    changes: list[ToolChange] = []
    if entries:
        await conn.execute(
            PARK_RENAMED, {"source_id": source_id, "remote_names": remote_names, "names": names}
        )
        rows = await conn.execute(
            UPSERT_SOURCE_TOOLS,
            {
                "source_id": source_id,
                "names": names,
                "remote_names": remote_names,
                "descriptions": [e.description for e in entries],
                "schemas": [json.dumps(e.input_schema) for e in entries],
                "accesses": [e.access for e in entries],
            },
        )
        changes = [ToolChange.from_row(row) for row in rows.mappings()]
    relabelled = [c.id for c in changes if c.old_access != c.access]
    if relabelled:
        await conn.execute(RESET_AUTO_APPROVED, {"ids": relabelled})
    return changes


async def record_sync_done(conn: AsyncConnection, source_id: int, error: str | None) -> None:
    await conn.execute(SYNC_DONE, {"id": source_id, "error": error})
