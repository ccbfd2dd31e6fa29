"""Syncing an MCP source into the catalog: `tools/list` (every page), then one transaction.

New tools join as `<source>__<tool>` with agents_allowed = false; known ones are updated (their
agents_allowed kept); vanished ones leave the catalog, and the agents that had them keep running
on the rest. A tool whose catalog name is longer than 64 characters, whose schema is not a JSON
Schema object, or whose name collides with another after slugging is left out and named in
`lastError`; the rest sync. A sync that fails (unreachable, too many tools, no answer in time)
keeps the tools the source had and sets `lastError`.
"""

from __future__ import annotations

import json
import logging
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import jsonschema
from sqlalchemy.ext.asyncio import AsyncEngine

from agent_engine.db import tool_sources as sources_db
from agent_engine.domain.mcp import CATALOG_NAME_MAX_CHARS, catalog_name
from agent_engine.runtime.credentials import CredentialGuard, CredentialRefused
from agent_engine.tool_sources.client import (
    MAX_SCHEMA_BYTES,
    McpError,
    RemoteTool,
    bearer,
)
from agent_engine.tool_sources.listing import list_tools_isolated

log = logging.getLogger(__name__)

MAX_ERROR_CHARS = 2_000


@dataclass(frozen=True)
class SyncResult:
    ok: bool
    tools: int
    error: str | None


def plan(
    source: str, remote: Sequence[RemoteTool]
) -> tuple[list[sources_db.CatalogEntry], list[str]]:
    """The catalog entries a listing gives, and why any tool was left out."""
    problems: list[str] = []
    by_name: dict[str, list[RemoteTool]] = defaultdict(list)
    for tool in remote:
        by_name[catalog_name(source, tool.name)].append(tool)
    entries: list[sources_db.CatalogEntry] = []
    for name, tools in by_name.items():
        if len(tools) > 1:
            listed = " and ".join(repr(t.name) for t in tools)
            problems.append(f"tools {listed} both become {name!r}; neither was synced")
            continue
        tool = tools[0]
        if len(name) > CATALOG_NAME_MAX_CHARS:
            problems.append(
                f"tool {tool.name!r} left out: {name!r} is longer than "
                f"{CATALOG_NAME_MAX_CHARS} characters"
            )
            continue
        if problem := schema_problem(tool.input_schema):
            problems.append(f"tool {tool.name!r} left out: its inputSchema {problem}")
            continue
        entries.append(
            sources_db.CatalogEntry(
                name=name,
                remote_name=tool.name,
                description=tool.description,
                input_schema=tool.input_schema,
                access=str(tool.access),
            )
        )
    return entries, problems


def schema_problem(schema: object) -> str | None:
    if not isinstance(schema, dict) or schema.get("type", "object") != "object":
        return "is not a JSON Schema of an object"
    if len(json.dumps(schema)) > MAX_SCHEMA_BYTES:
        return f"is larger than {MAX_SCHEMA_BYTES} bytes"
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as exc:
        return f"is not a valid JSON Schema ({exc.message[:200]})"
    return None


async def sync_source(
    engine: AsyncEngine,
    source_id: int,
    *,
    seconds: float,
    allowed_prefixes: Iterable[str] = (),
) -> SyncResult:
    """List the source's tools and write them into the catalog. The source row is read first, the
    listing happens outside any transaction, the write is one transaction. `allowed_prefixes`:
    the operator's allow-list for `authEnv` (AGENT_ENGINE_CREDENTIAL_ENV_PREFIXES), as at a call."""
    async with engine.connect() as conn:
        source = await sources_db.fetch_source(conn, source_id)
    if source is None:
        return SyncResult(False, 0, "the source is gone")
    # Checked again before each send, as for a call (the guard logs why): a row written before the
    # rule, or straight in SQL, sends nothing.
    guard = CredentialGuard(engine, allowed_prefixes=allowed_prefixes)
    try:
        await guard.check(source.auth_env, what=f"tool source {source.name!r}")
    except CredentialRefused:
        error = "sync refused: the variable named by authEnv may not hold a credential"
        async with engine.begin() as conn:
            await sources_db.record_sync_failure(conn, source_id, error)
        return SyncResult(False, 0, error)
    try:
        # In a child process: the listing's memory and CPU are not this process's (listing.py).
        remote = await list_tools_isolated(source.url, bearer(source.auth_env), seconds=seconds)
    except McpError as exc:
        error = f"sync failed: {exc}"[:MAX_ERROR_CHARS]
        log.warning("MCP source %s: %s", source.name, error)
        async with engine.begin() as conn:
            await sources_db.record_sync_failure(conn, source_id, error)
        return SyncResult(False, 0, error)
    entries, problems = plan(source.name, remote)
    async with engine.begin() as conn:
        locked = await sources_db.lock_source(conn, source_id)
        if locked is None:
            return SyncResult(False, 0, "the source is gone")
        if locked.name != source.name:
            # Renamed while we listed: the next sync writes the new names.
            return SyncResult(False, 0, "the source was renamed during the sync")
        taken = await sources_db.names_taken_elsewhere(conn, source_id, [e.name for e in entries])
        for name in sorted(taken):
            problems.append(f"{name!r} is already a tool of the catalog; not synced")
        kept = [e for e in entries if e.name not in taken]
        summary = "; ".join(problems)[:MAX_ERROR_CHARS] or None
        await sources_db.write_sync(conn, source_id, kept, summary)
    return SyncResult(True, len(kept), summary)


async def sync_enabled_sources(
    engine: AsyncEngine, *, seconds: float, allowed_prefixes: Iterable[str] = ()
) -> int:
    """The clock's periodic re-sync: every enabled source, one after another. Returns how many
    synced without a failure."""
    async with engine.connect() as conn:
        ids = await sources_db.enabled_source_ids(conn)
    synced = 0
    for source_id in ids:
        try:
            result = await sync_source(
                engine, source_id, seconds=seconds, allowed_prefixes=allowed_prefixes
            )
        except Exception:
            log.exception("MCP source %s: the periodic sync raised", source_id)
            continue
        synced += int(result.ok)
    return synced
