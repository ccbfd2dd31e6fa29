"""Syncing an MCP source into the catalog: `tools/list` (every page), then one transaction.

New tools join as `<source>__<tool>` with agents_allowed = false; known ones are updated (their
agents_allowed kept); vanished ones leave the catalog, and the agents that had them keep running
on the rest. What the server sends is data, checked here before it is stored: a tool whose name
holds a control character, whose catalog name is longer than 64 characters or collides with
another, or whose schema is not a JSON Schema object the engine will check arguments against
(larger or deeper than the limits, a `$ref` that is not local, a pattern the non-backtracking
engine refuses, NUL) is left out and named in `lastError`; the rest sync. Descriptions are
cleaned of control characters. A known tool relabelled WRITE -> READ is disallowed until an
admin allows it again; every relabel and every change of description or schema is audited.
A sync that fails (unreachable, too many tools, no answer in time) keeps the tools the source
had and sets `lastError`.
"""

from __future__ import annotations

import json
import logging
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from agent_engine.agents import audit
from agent_engine.agents.credential_guard import CredentialGuard, CredentialRefused
from agent_engine.db import tool_sources as sources_db
from agent_engine.domain.mcp import (
    CATALOG_NAME_MAX_CHARS,
    ToolAccess,
    access_change_note,
    catalog_name,
    cleaned_text,
    escaped,
    name_problem,
    schema_shape_problem,
)
from agent_engine.oauth.access import NotConnected, TokenUnavailable, owner_access_token
from agent_engine.runtime.tools.mcp import SchemaRefused, validator
from agent_engine.tool_sources.client import (
    MAX_SCHEMA_BYTES,
    McpError,
    RemoteTool,
    bearer,
)
from agent_engine.tool_sources.listing import list_tools_isolated

log = logging.getLogger(__name__)

MAX_ERROR_CHARS = 2_000
# A sync's write that lost a catalog name to a concurrent one (another source's sync took it
# between our check and our write) is tried again, and then names it.
WRITE_ATTEMPTS = 2


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
        if problem := name_problem(tool.name):
            problems.append(f"tool {tool.name!r} left out: {problem}")
            continue
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
                description=cleaned_text(tool.description),
                input_schema=tool.input_schema,
                access=str(tool.access),
            )
        )
    return entries, problems


def schema_problem(schema: object) -> str | None:
    """Why a tool's inputSchema is refused at sync, or None. It must compile as the call-time
    check compiles it (offline, linear-time patterns), so no call ever meets a schema that was
    not checked here."""
    if not isinstance(schema, dict) or schema.get("type", "object") != "object":
        return "is not a JSON Schema of an object"
    if problem := schema_shape_problem(schema):
        return problem
    if len(json.dumps(schema).encode()) > MAX_SCHEMA_BYTES:
        return f"is larger than {MAX_SCHEMA_BYTES} bytes"
    try:
        validator(schema)
    except SchemaRefused as exc:
        return f"is not a JSON Schema the engine checks ({exc})"
    return None


async def sync_source(
    engine: AsyncEngine,
    source_id: int,
    *,
    seconds: float,
    allowed_prefixes: Iterable[str] = (),
    actor_id: int | None = None,
) -> SyncResult:
    """List the source's tools and write them into the catalog. The source row is read first, the
    listing happens outside any transaction, the write is one transaction. `allowed_prefixes`:
    the operator's allow-list for `authEnv` (AGENT_ENGINE_CREDENTIAL_ENV_PREFIXES), as at a call.
    `actor_id`: the admin who asked, for the audit of changed tools (None: the clock)."""
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
    token, anonymous_oauth = await _listing_token(engine, source, actor_id)
    try:
        # In a child process: the listing's memory and CPU are not this process's (listing.py).
        remote = await list_tools_isolated(source.url, token, seconds=seconds)
    except McpError as exc:
        error = f"sync failed: {exc}"
        if anonymous_oauth:
            error += (
                " (OWNER_OAUTH: the listing was anonymous, as the syncing admin has no connected"
                " account of their own at this source; connect yours with connectToolSource and"
                " sync again)"
            )
        error = escaped(error)[:MAX_ERROR_CHARS]
        log.warning("MCP source %s: %s", source.name, error)
        async with engine.begin() as conn:
            await sources_db.record_sync_failure(conn, source_id, error)
        return SyncResult(False, 0, error)
    entries, problems = plan(source.name, remote)
    for attempt in range(1, WRITE_ATTEMPTS + 1):
        try:
            async with engine.begin() as conn:
                return await _write(conn, source, entries, problems, actor_id)
        except IntegrityError:
            if attempt == WRITE_ATTEMPTS:
                log.warning("MCP source %s: a catalog name was taken meanwhile", source.name)
    error = "sync failed: a catalog name was taken by another sync meanwhile; sync again"
    async with engine.begin() as conn:
        await sources_db.record_sync_failure(conn, source_id, error)
    return SyncResult(False, 0, error)


async def _listing_token(
    engine: AsyncEngine, source: sources_db.ToolSourceRow, actor_id: int | None
) -> tuple[str | None, bool]:
    """The credential a listing carries, and whether it is an OWNER_OAUTH listing without one.

    SHARED: the variable's credential. OWNER_OAUTH: the syncing admin's own connection when they
    connected one, else none (the server's anonymous listing, when it allows one); a periodic
    sync (no admin) is anonymous. An owner's token is never used to list for anybody else."""
    if not source.owner_oauth:
        return bearer(source.auth_env), False
    if actor_id is not None:
        try:
            found = await owner_access_token(engine, owner_id=actor_id, source_id=source.id)
        except (NotConnected, TokenUnavailable):
            pass
        else:
            return found.access_token, False
    return None, True


async def _write(
    conn: AsyncConnection,
    source: sources_db.ToolSourceRow,
    entries: list[sources_db.CatalogEntry],
    listed_problems: list[str],
    actor_id: int | None,
) -> SyncResult:
    """The sync's transaction: under the source's lock, the tools the catalog takes, what changed
    audited, `lastError` written."""
    locked = await sources_db.lock_source(conn, source.id)
    if locked is None:
        return SyncResult(False, 0, "the source is gone")
    if locked.name != source.name:
        # Renamed while we listed: the next sync writes the new names.
        return SyncResult(False, 0, "the source was renamed during the sync")
    problems = list(listed_problems)
    taken = await sources_db.names_taken_elsewhere(conn, source.id, [e.name for e in entries])
    for name in sorted(taken):
        problems.append(f"{name!r} is already a tool of the catalog; not synced")
    kept = [e for e in entries if e.name not in taken]
    changes = await sources_db.write_sync(conn, source.id, kept)
    # The relabel notes first: a long list of problems must not cut them off.
    notes = [
        note
        for change in changes
        if (
            note := access_change_note(
                change.name, ToolAccess(change.old_access), ToolAccess(change.access)
            )
        )
    ]
    summary = _summary([*notes, *problems])
    await sources_db.record_sync_done(conn, source.id, summary)
    await audit.record_many(conn, actor_id, [_audit_entry(source.id, c) for c in changes])
    return SyncResult(True, len(kept), summary)


def _summary(problems: list[str]) -> str | None:
    return escaped("; ".join(problems))[:MAX_ERROR_CHARS] or None


def _audit_entry(
    source_id: int, change: sources_db.ToolChange
) -> tuple[audit.AuditAction, dict[str, object]]:
    """`tool.access_changed` (from, to, whether agents may still use it) when the label changed,
    else `tool.changed`; both say which of description and inputSchema changed (not their text:
    the catalog shows it)."""
    fields = [
        field
        for field, changed in (
            ("description", change.description_changed),
            ("inputSchema", change.schema_changed),
        )
        if changed
    ]
    details: dict[str, object] = {
        "sourceId": str(source_id),
        "toolId": str(change.id),
        "name": change.name,
        "fields": fields,
    }
    if change.old_access == change.access:
        return audit.AuditAction.TOOL_CHANGED, details
    details.update(
        {"from": change.old_access, "to": change.access, "agentsAllowed": change.agents_allowed}
    )
    return audit.AuditAction.TOOL_ACCESS_CHANGED, details


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
