from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from agent_engine.runtime.tools.registry import optional_tools, sync_tool_catalog
from tests.support.factories import Factories


async def _catalog(engine: AsyncEngine) -> dict[str, tuple[str, bool]]:
    async with engine.connect() as conn:
        rows = await conn.execute(text("SELECT name, description, agents_allowed FROM tools"))
        return {name: (description, allowed) for name, description, allowed in rows}


async def test_sync_adds_disallowed_rows_refreshes_descriptions_keeps_the_admins_choice(
    engine: AsyncEngine, factories: Factories
) -> None:
    await factories.tool("legacy_tool", agents_allowed=True)
    async with engine.begin() as conn:
        await sync_tool_catalog(conn)
    catalog = await _catalog(engine)
    registered = optional_tools()
    for name, spec in registered.items():
        assert catalog[name] == (spec.description, False)
    assert catalog["legacy_tool"] == ("the legacy_tool tool", True)  # left to the admin
    assert "search_knowledge" not in catalog  # core tools are not in the catalog

    async with engine.begin() as conn:
        await conn.execute(
            text(
                "UPDATE tools SET agents_allowed = true, description = 'stale'"
                " WHERE name = 'calculator'"
            )
        )
        await sync_tool_catalog(conn)
        await sync_tool_catalog(conn)
    assert (await _catalog(engine))["calculator"] == (registered["calculator"].description, True)
