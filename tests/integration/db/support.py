"""Helpers of the database tests."""

from __future__ import annotations

import asyncpg

from tests.conftest import Servers


async def empty_database(servers: Servers, name: str) -> str:
    """A new database with nothing in it (not cloned from the migrated template)."""
    conn = await asyncpg.connect(servers.admin_url)
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    return servers.database_url(name)
