"""Migrations: an empty database reaches head, round-trips, and matches the models."""

from __future__ import annotations

import subprocess
import sys

import asyncpg
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine as create_sync_engine  # noqa: F401
from sqlalchemy.ext.asyncio import create_async_engine

from agent_engine.db.migrate import downgrade, upgrade
from agent_engine.db.models import ENGINE_TABLES, PLATFORM_TABLES, Base
from agent_engine.settings import to_asyncpg_url, to_libpq_url
from tests.conftest import Servers
from tests.integration.db.support import empty_database


async def _tables(url: str) -> set[str]:
    conn = await asyncpg.connect(to_libpq_url(url))
    try:
        rows = await conn.fetch(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public'"
            " AND tablename <> 'alembic_version'"
        )
    finally:
        await conn.close()
    return {row["tablename"] for row in rows}


async def _drift(url: str) -> list[object]:
    engine = create_async_engine(to_asyncpg_url(url))
    try:
        async with engine.connect() as conn:
            return await conn.run_sync(
                lambda sync: compare_metadata(MigrationContext.configure(sync), Base.metadata)
            )
    finally:
        await engine.dispose()


async def test_migrate_command_upgrade_downgrade_round_trip(servers: Servers) -> None:
    url = await empty_database(servers, f"{servers.prefix}_migrations")
    result = subprocess.run(  # noqa: ASYNC221 - a one-off CLI call
        [sys.executable, "-m", "agent_engine.cli", "migrate"],
        env={"DATABASE_URL": url, "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert await _tables(url) == set(ENGINE_TABLES) | set(PLATFORM_TABLES)
    assert await _drift(url) == []

    await _run_in_thread(downgrade, url, "base")
    assert await _tables(url) == set()
    await _run_in_thread(upgrade, url, "heads")
    assert await _tables(url) == set(ENGINE_TABLES) | set(PLATFORM_TABLES)
    assert await _drift(url) == []


async def _run_in_thread(fn: object, *args: str) -> None:
    import asyncio

    await asyncio.to_thread(fn, *args)  # type: ignore[arg-type]
