"""e0009: an existing source with authEnv becomes SHARED, one without NONE; OWNER_OAUTH cannot
carry authEnv; the migration round-trips."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from agent_engine.db.migrate import downgrade, upgrade
from agent_engine.settings import to_libpq_url
from tests.conftest import Servers
from tests.integration.db.support import empty_database


async def test_existing_sources_become_shared_or_none(servers: Servers) -> None:
    url = await empty_database(servers, f"{servers.prefix}_e0009")
    await asyncio.to_thread(upgrade, url, "e0008_budget_weeks")
    conn = await asyncpg.connect(to_libpq_url(url))
    try:
        await conn.execute(
            "INSERT INTO tool_sources (name, url, auth_env) VALUES"
            " ('with_env', 'https://a.example/mcp', 'A_TOKEN'),"
            " ('without', 'https://b.example/mcp', NULL)"
        )
    finally:
        await conn.close()

    await asyncio.to_thread(upgrade, url, "e0009_tool_connections")

    conn = await asyncpg.connect(to_libpq_url(url))
    try:
        rows = await conn.fetch("SELECT name, auth FROM tool_sources ORDER BY name")
        assert [(r["name"], r["auth"]) for r in rows] == [
            ("with_env", "shared"),
            ("without", "none"),
        ]
        with pytest.raises(asyncpg.CheckViolationError):
            await conn.execute(
                "UPDATE tool_sources SET auth = 'owner_oauth' WHERE name = 'with_env'"
            )
        with pytest.raises(asyncpg.CheckViolationError):
            await conn.execute("UPDATE tool_sources SET auth = 'oauth' WHERE name = 'without'")
    finally:
        await conn.close()
    await asyncio.to_thread(downgrade, url, "e0008_budget_weeks")
    await asyncio.to_thread(upgrade, url, "e0009_tool_connections")
