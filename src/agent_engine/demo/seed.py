"""The demo seed of `agent-engine run`: idempotent, safe to run on every start.

A demo owner and a demo admin, the offline `builtin` model as the default, the optional tools
allowed, a handful of sample knowledge documents (public) and one sample scheduled agent.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from agent_engine.db.platform import load_platform_settings, zone_or_utc
from agent_engine.domain.schedule import first_slot, parse_schedule

DEMO_OWNER_ID = 1
DEMO_ADMIN_ID = 2
DEMO_MODEL_NAME = "Builtin digest (offline)"
DEMO_AGENT_NAME = "Weekly release digest"
DEMO_AGENT_PROMPT = "release process on-call"
DEMO_SCHEDULE = {"type": "interval", "every_hours": 6}
KNOWLEDGE_DIR = Path(__file__).parent / "knowledge"


@dataclass(frozen=True)
class DemoIds:
    owner_id: int
    admin_id: int
    model_id: int
    agent_id: int


async def seed_demo(engine: AsyncEngine, *, now: datetime) -> DemoIds:
    from agent_engine.knowledge.importer import import_paths
    from agent_engine.runtime.tools.registry import sync_tool_catalog

    async with engine.begin() as conn:
        for user_id, email, name in (
            (DEMO_OWNER_ID, "owner@example.com", "Demo Owner"),
            (DEMO_ADMIN_ID, "admin@example.com", "Demo Admin"),
        ):
            await conn.execute(
                text(
                    "INSERT INTO users (id, email, display_name, timezone)"
                    " VALUES (:id, :email, :name, 'UTC') ON CONFLICT (id) DO NOTHING"
                ),
                {"id": user_id, "email": email, "name": name},
            )
        model_id = (
            await conn.execute(
                text("SELECT id FROM agent_models WHERE provider = 'builtin' ORDER BY id LIMIT 1")
            )
        ).scalar()
        if model_id is None:
            has_default = (
                await conn.execute(text("SELECT 1 FROM agent_models WHERE is_default"))
            ).scalar()
            model_id = (
                await conn.execute(
                    text(
                        "INSERT INTO agent_models (name, provider, model, is_default)"
                        " VALUES (:name, 'builtin', 'builtin-digest', :default) RETURNING id"
                    ),
                    {"name": DEMO_MODEL_NAME, "default": has_default is None},
                )
            ).scalar_one()
        await sync_tool_catalog(conn)
        # The demo allows the shipped optional tools once; an admin's later choice is kept.
        first_seed = (
            await conn.execute(
                text("SELECT 1 FROM agents WHERE user_id = :u AND name = :n"),
                {"u": DEMO_OWNER_ID, "n": DEMO_AGENT_NAME},
            )
        ).scalar() is None
        if first_seed:
            await conn.execute(text("UPDATE tools SET agents_allowed = true"))
    await import_paths(engine, [KNOWLEDGE_DIR], owner_id=None, public=True, progress=False)

    async with engine.begin() as conn:
        agent_id = (
            await conn.execute(
                text("SELECT id FROM agents WHERE user_id = :u AND name = :n"),
                {"u": DEMO_OWNER_ID, "n": DEMO_AGENT_NAME},
            )
        ).scalar()
        if agent_id is None:
            platform = await load_platform_settings(conn)
            schedule = parse_schedule(DEMO_SCHEDULE)
            assert schedule is not None
            next_run_at = first_slot(schedule, now=now, zone=zone_or_utc(platform.timezone))
            agent_id = (
                await conn.execute(
                    text(
                        "INSERT INTO agents (user_id, name, description, prompt, schedule,"
                        " model_id, next_run_at) VALUES (:u, :n, :d, :p, CAST(:s AS jsonb),"
                        " :m, :next) RETURNING id"
                    ),
                    {
                        "u": DEMO_OWNER_ID,
                        "n": DEMO_AGENT_NAME,
                        "d": "Digest of the release and on-call pages, every 6 hours.",
                        "p": DEMO_AGENT_PROMPT,
                        "s": json.dumps(DEMO_SCHEDULE),
                        "m": model_id,
                        "next": next_run_at,
                    },
                )
            ).scalar_one()
    return DemoIds(DEMO_OWNER_ID, DEMO_ADMIN_ID, int(model_id), int(agent_id))
