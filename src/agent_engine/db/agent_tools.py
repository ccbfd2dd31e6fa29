"""An agent's tool selection (`agent_tools`): the owner's auto-approval of a WRITE tool."""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

SET_AUTO_APPROVED = text(
    "UPDATE agent_tools SET auto_approved = :auto WHERE agent_id = :agent_id AND tool_id = :tool_id"
)
TOOL_ACCESS_IN_SELECTION = text(
    "SELECT t.access FROM agent_tools at JOIN tools t ON t.id = at.tool_id"
    " WHERE at.agent_id = :agent_id AND at.tool_id = :tool_id"
)


async def tool_access_in_selection(
    conn: AsyncConnection, agent_id: int, tool_id: int
) -> str | None:
    """The tool's access (READ or WRITE) when it is in the agent's selection, else None."""
    params = {"agent_id": agent_id, "tool_id": tool_id}
    access = (await conn.execute(TOOL_ACCESS_IN_SELECTION, params)).scalar()
    return None if access is None else str(access)


async def set_auto_approved(
    conn: AsyncConnection, agent_id: int, tool_id: int, *, auto_approved: bool
) -> None:
    """Whether the agent's selected tool runs without asking."""
    await conn.execute(
        SET_AUTO_APPROVED, {"agent_id": agent_id, "tool_id": tool_id, "auto": auto_approved}
    )
