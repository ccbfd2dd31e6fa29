"""MCP tool sources: the admin registers, syncs and removes them (FORBIDDEN to owners). Every
action is in the audit log; the credential itself is never stored, only its variable's name."""

from __future__ import annotations

import re

import strawberry
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection

from agent_engine.agents import audit
from agent_engine.agents import credentials as credential_rules
from agent_engine.agents.errors import Missing
from agent_engine.api.errors import BadUserInput, NotFound
from agent_engine.api.guards import BASE_URL_MAX_CHARS, checked_text
from agent_engine.api.ids import parse_id
from agent_engine.api.inputs import ToolSourceInput
from agent_engine.api.mutations.common import transaction
from agent_engine.api.resolvers import Info, described_mutation
from agent_engine.api.state import services
from agent_engine.api.types.catalog import ToolSource
from agent_engine.db import tool_sources as sources_db
from agent_engine.domain.mcp import source_name_problem, source_url_problem
from agent_engine.tool_sources.sync import sync_source


async def _fresh(info: Info, source_id: int) -> ToolSource:
    async with services(info)["engine"].connect() as conn:
        row = await sources_db.fetch_source(conn, source_id)
    if row is None:  # never existed, or removed by a concurrent request meanwhile
        raise NotFound("tool source", source_id)
    return ToolSource.from_row(row)


SCOPE = re.compile(r"^[\x21\x23-\x5b\x5d-\x7e]{1,200}$")  # RFC 6749 §3.3 scope-token
MAX_SCOPES = 50


async def _checked_auth(
    conn: AsyncConnection, info: Info, input: ToolSourceInput
) -> sources_db.SourceAuth:
    """How the source authenticates, checked: OWNER_OAUTH takes no authEnv; the client
    variables follow the credential rules of authEnv (no engine settings, no delivery secrets)."""
    auth = (
        input.auth.name.lower()
        if input.auth is not None
        else ("shared" if input.auth_env else "none")
    )
    if auth == "owner_oauth" and input.auth_env:
        raise BadUserInput(
            "input.authEnv",
            "an OWNER_OAUTH source sends each owner's own token, never a shared credential:"
            " leave authEnv out",
        )
    if auth == "shared" and not input.auth_env:
        raise BadUserInput("input.authEnv", "a SHARED source needs authEnv (the credential)")
    oauth_fields = {
        "input.oauthScopes": input.oauth_scopes,
        "input.oauthClientIdEnv": input.oauth_client_id_env,
        "input.oauthClientSecretEnv": input.oauth_client_secret_env,
    }
    if auth != "owner_oauth":
        for field, value in oauth_fields.items():
            if value is not None:
                raise BadUserInput(field, "only an OWNER_OAUTH source takes it")
        return sources_db.SourceAuth(auth)
    scopes = input.oauth_scopes
    if scopes is not None:
        if len(scopes) > MAX_SCOPES:
            raise BadUserInput("input.oauthScopes", f"at most {MAX_SCOPES} scopes")
        for scope in scopes:
            if not SCOPE.match(scope):
                raise BadUserInput(
                    "input.oauthScopes",
                    f"{scope[:50]!r} is not an OAuth scope (printable ASCII, no space, quote or"
                    " backslash, at most 200 characters)",
                )
    if input.oauth_client_secret_env and not input.oauth_client_id_env:
        raise BadUserInput(
            "input.oauthClientIdEnv", "a client secret needs its client id (oauthClientIdEnv)"
        )
    prefixes = services(info)["settings"].credential_prefixes
    for field, name in (
        ("input.oauthClientIdEnv", input.oauth_client_id_env),
        ("input.oauthClientSecretEnv", input.oauth_client_secret_env),
    ):
        if problem := await credential_rules.credential_key_problem(
            conn, name, allowed_prefixes=prefixes
        ):
            raise BadUserInput(field, problem)
    return sources_db.SourceAuth(
        "owner_oauth",
        None if scopes is None else list(dict.fromkeys(scopes)),
        input.oauth_client_id_env,
        input.oauth_client_secret_env,
    )


@strawberry.type
class ToolSourceMutation:
    @described_mutation(
        description=(
            "Creates or updates an MCP source and syncs it at once: its tools join the catalog "
            "with agentsAllowed = false. An unreachable server is saved with lastError set."
        )
    )
    async def upsert_tool_source(self, info: Info, input: ToolSourceInput) -> ToolSource:
        viewer = info.context.require_admin()
        source_id = parse_id(input.id, "input.id") if input.id is not None else None
        if problem := source_name_problem(input.name):
            raise BadUserInput("input.name", problem)
        checked_text("input.url", input.url, BASE_URL_MAX_CHARS)
        if problem := source_url_problem(input.url):
            raise BadUserInput("input.url", problem)
        async with transaction(info) as conn:
            # Under the credential-names lock: a delivery target saved meanwhile is seen.
            if problem := await credential_rules.credential_key_problem(
                conn,
                input.auth_env,
                allowed_prefixes=services(info)["settings"].credential_prefixes,
            ):
                raise BadUserInput("input.authEnv", problem)
            source_auth = await _checked_auth(conn, info, input)
            same_name = await sources_db.source_by_name(conn, input.name)
            if same_name is not None and same_name.id != source_id:
                raise BadUserInput("input.name", f"a tool source named {input.name!r} exists")
            name, url, auth_env, enabled = input.name, input.url, input.auth_env, input.enabled
            try:
                if source_id is None:
                    saved = await sources_db.insert_source(
                        conn,
                        name=name,
                        url=url,
                        auth_env=auth_env,
                        enabled=enabled,
                        auth=source_auth,
                    )
                elif await sources_db.update_source(
                    conn,
                    source_id,
                    name=name,
                    url=url,
                    auth_env=auth_env,
                    enabled=enabled,
                    auth=source_auth,
                ):
                    saved = source_id
                else:
                    raise Missing("tool source", source_id)
            except IntegrityError as exc:  # a concurrent upsert took the name
                raise BadUserInput(
                    "input.name", f"a tool source named {input.name!r} exists"
                ) from exc
            await audit.record(
                conn,
                viewer.user_id,
                audit.AuditAction.TOOL_SOURCE_UPSERTED,
                details={
                    "sourceId": str(saved),
                    "created": source_id is None,
                    "name": input.name,
                    "url": audit.redacted_url(input.url),
                    "authEnv": input.auth_env,
                    "auth": source_auth.auth.upper(),
                    "oauthScopes": source_auth.oauth_scopes,
                    "oauthClientIdEnv": source_auth.oauth_client_id_env,
                    "oauthClientSecretEnv": source_auth.oauth_client_secret_env,
                    "enabled": input.enabled,
                },
            )
        settings = services(info)["settings"]
        await sync_source(
            services(info)["engine"],
            saved,
            seconds=settings.tool_timeout_seconds,
            allowed_prefixes=settings.credential_prefixes,
            actor_id=viewer.user_id,
        )
        return await _fresh(info, saved)

    @described_mutation(
        description=(
            "Lists the server's tools again: new ones join (not allowed), changed ones are "
            "updated, vanished ones leave the catalog (agents keep running on the rest)."
        )
    )
    async def sync_tool_source(self, info: Info, id: strawberry.ID) -> ToolSource:
        viewer = info.context.require_admin()
        source_id = parse_id(id, "id")
        await _fresh(info, source_id)
        settings = services(info)["settings"]
        result = await sync_source(
            services(info)["engine"],
            source_id,
            seconds=settings.tool_timeout_seconds,
            allowed_prefixes=settings.credential_prefixes,
            actor_id=viewer.user_id,
        )
        async with transaction(info) as conn:
            await audit.record(
                conn,
                viewer.user_id,
                audit.AuditAction.TOOL_SOURCE_SYNCED,
                details={
                    "sourceId": str(source_id),
                    "ok": result.ok,
                    "tools": result.tools,
                    "error": result.error,
                },
            )
        return await _fresh(info, source_id)

    @described_mutation(description="Its tools leave the catalog; agents keep running on the rest.")
    async def remove_tool_source(self, info: Info, id: strawberry.ID) -> strawberry.ID:
        viewer = info.context.require_admin()
        source_id = parse_id(id, "id")
        async with transaction(info) as conn:
            row = await sources_db.fetch_source(conn, source_id)
            if row is None or not await sources_db.delete_source(conn, source_id):
                raise Missing("tool source", source_id)
            await audit.record(
                conn,
                viewer.user_id,
                audit.AuditAction.TOOL_SOURCE_REMOVED,
                details={"sourceId": str(source_id), "name": row.name},
            )
        return strawberry.ID(str(source_id))
