"""The demo seed of `agent-engine run`: idempotent, safe to run on every start.

A demo owner and a demo admin, the offline `builtin` model as the default, a model whose endpoint
is down with the builtin model as its fallback (choose it for an agent to watch a fallback step),
the optional tools
allowed, a handful of sample knowledge documents (public), one sample scheduled agent and, with
`make run`, the demo MCP ticket server as a tool source of that agent.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from agent_engine.db import agents as agents_db
from agent_engine.db import catalog, users
from agent_engine.db import tool_sources as sources_db
from agent_engine.db.platform import load_platform_settings
from agent_engine.domain.schedule import first_slot, parse_schedule
from agent_engine.knowledge.importer import import_paths
from agent_engine.runtime.tools.registry import sync_tool_catalog
from agent_engine.tool_sources.sync import sync_source

DEMO_OWNER_ID = 1
DEMO_ADMIN_ID = 2
DEMO_MODEL_NAME = "Builtin digest (offline)"
# Nothing listens on the discard port: every call is refused at once, and the builtin model
# (its fallback) answers. Its key variable is none: nothing is sent anywhere.
DEMO_DOWN_MODEL_NAME = "Unreachable endpoint (falls back to the builtin digest)"
DEMO_DOWN_MODEL_URL = "http://127.0.0.1:9/v1"
DEMO_AGENT_NAME = "Weekly release digest"
DEMO_AGENT_PROMPT = "release process on-call"
DEMO_AGENT_DESCRIPTION = "Digest of the release and on-call pages, every 6 hours."
DEMO_SCHEDULE = {"type": "interval", "every_hours": 6}
KNOWLEDGE_DIR = Path(__file__).parent / "knowledge"
DEMO_SOURCE_NAME = "tickets"
DEMO_SYNC_SECONDS = 10.0


@dataclass(frozen=True)
class DemoIds:
    owner_id: int
    admin_id: int
    model_id: int
    agent_id: int


async def seed_demo(
    engine: AsyncEngine,
    *,
    now: datetime,
    tickets_url: str | None = None,
    tickets_auth: str = "none",
) -> DemoIds:
    """`tickets_url`: the demo MCP ticket server (`agent_engine.testing.mcp_tickets`), registered
    as the source `tickets` with its tools allowed and attached to the sample agent."""
    async with engine.begin() as conn:
        for user_id, email, name in (
            (DEMO_OWNER_ID, "owner@example.com", "Demo Owner"),
            (DEMO_ADMIN_ID, "admin@example.com", "Demo Admin"),
        ):
            await users.ensure_user(conn, user_id, email=email, name=name, timezone="UTC")
        model_id = await catalog.first_builtin_model(conn)
        if model_id is None:
            has_default = await catalog.has_default_model(conn)
            created = await catalog.insert_model(
                conn,
                catalog.ModelFields(
                    name=DEMO_MODEL_NAME,
                    provider="builtin",
                    model="builtin-digest",
                    is_default=not has_default,
                ),
            )
            model_id = created.id
        await _seed_down_model(conn, fallback_id=model_id)
        await sync_tool_catalog(conn)
        # The demo allows the shipped optional tools once; an admin's later choice is kept.
        if await agents_db.find_agent_by_name(conn, DEMO_OWNER_ID, DEMO_AGENT_NAME) is None:
            await catalog.allow_all_tools(conn)
    await import_paths(engine, [KNOWLEDGE_DIR], owner_id=None, public=True, progress=False)

    async with engine.begin() as conn:
        agent_id = await agents_db.find_agent_by_name(conn, DEMO_OWNER_ID, DEMO_AGENT_NAME)
        if agent_id is None:
            platform = await load_platform_settings(conn)
            schedule = parse_schedule(DEMO_SCHEDULE)
            assert schedule is not None
            agent_id = await agents_db.insert_agent(
                conn,
                user_id=DEMO_OWNER_ID,
                name=DEMO_AGENT_NAME,
                description=DEMO_AGENT_DESCRIPTION,
                prompt=DEMO_AGENT_PROMPT,
                schedule=DEMO_SCHEDULE,
                model_id=model_id,
                enabled=True,
                next_run_at=first_slot(schedule, now=now, zone=platform.zone),
                meta=None,
            )
    if tickets_url is not None:
        await seed_tool_source(engine, tickets_url, agent_id=agent_id, auth=tickets_auth)
    return DemoIds(DEMO_OWNER_ID, DEMO_ADMIN_ID, model_id, agent_id)


async def _seed_down_model(conn: AsyncConnection, *, fallback_id: int) -> None:
    """The demo's model that is always down, with `fallback_id` as its fallback (created when
    missing: an admin's later change is kept, a removed one comes back on the next start)."""
    if await catalog.model_id_by_name(conn, DEMO_DOWN_MODEL_NAME) is not None:
        return
    created = await catalog.insert_model(
        conn,
        catalog.ModelFields(
            name=DEMO_DOWN_MODEL_NAME,
            provider="openai",
            model="demo-down",
            base_url=DEMO_DOWN_MODEL_URL,
        ),
    )
    await catalog.set_model_fallback(conn, created.id, fallback_id)


async def seed_tool_source(
    engine: AsyncEngine, url: str, *, agent_id: int, auth: str = "none"
) -> int:
    """Register (or point at its new address) the demo MCP source and sync it. The first time,
    its tools are allowed and attached to the sample agent; an admin's later choice is kept.
    `auth` "owner_oauth": the demo ticket server is an OAuth resource server
    (testing/oauth_servers.py) that lists its tools anonymously; each owner connects their own
    account to call them."""
    async with engine.begin() as conn:
        existing = await sources_db.source_by_name(conn, DEMO_SOURCE_NAME)
        if existing is None:
            source_id = await sources_db.insert_source(
                conn,
                name=DEMO_SOURCE_NAME,
                url=url,
                auth_env=None,
                enabled=True,
                auth=sources_db.SourceAuth(auth),
            )
        else:
            source_id = existing.id
            await sources_db.update_source(
                conn,
                source_id,
                name=DEMO_SOURCE_NAME,
                url=url,
                auth_env=None if auth == "owner_oauth" else existing.auth_env,
                enabled=existing.enabled,
                auth=sources_db.SourceAuth(auth)
                if auth == "owner_oauth" or not existing.auth_env
                else None,
            )
    await sync_source(engine, source_id, seconds=DEMO_SYNC_SECONDS)
    if existing is None:
        async with engine.begin() as conn:
            tools = await catalog.tools_of_sources(conn, [source_id])
            for tool in tools:
                await catalog.set_tool_allowed(conn, tool.id, True)
            await agents_db.insert_tool_links(conn, agent_id, [tool.id for tool in tools])
    return source_id
