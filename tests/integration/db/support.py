"""Helpers of the database tests."""

from __future__ import annotations

import json
from typing import Any

import asyncpg
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from agent_engine.db.spend import owner_week_tokens
from agent_engine.domain.budget import BudgetWindow
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


async def week_sum_plan(conn: AsyncConnection, owner_id: int, window: BudgetWindow) -> Any:
    """The executed plan of one owner's week (`owner_week_tokens`), as JSON."""
    explained = (
        await conn.execute(
            text(
                "EXPLAIN (ANALYZE, FORMAT JSON) SELECT "
                + owner_week_tokens("CAST(:owner_id AS bigint)")
            ),
            {"owner_id": owner_id, "start": window.start, "end": window.end},
        )
    ).scalar_one()
    return (json.loads(explained) if isinstance(explained, str) else explained)[0]["Plan"]


def rows_read_from_runs(plan: dict[str, Any]) -> int:
    """Rows the plan's scans of `agent_runs` (table or index) returned, over all their loops."""
    read = 0
    if plan.get("Relation Name") == "agent_runs":
        read += int(plan["Actual Rows"]) * int(plan["Actual Loops"])
    for child in plan.get("Plans", []):
        read += rows_read_from_runs(child)
    return read
