"""Who may see and who may act on an agent and its runs.

Owners see their own; someone else's is NOT_FOUND to them (existence is not leaked). Admins see
everything but do not act as the owner (an agent reads the Knowledge Store with its owner's
access).
"""

from __future__ import annotations

from agent_engine.api.auth import Caller
from agent_engine.api.errors import NotFound
from agent_engine.api.resolvers import Info
from agent_engine.db.agents import AgentRow
from agent_engine.db.runs import RunRow


def may_see(viewer: Caller, owner_id: int) -> bool:
    """Whether the viewer may see what `owner_id` owns: its owner, or an admin."""
    return viewer.is_admin or owner_id == viewer.user_id


def is_owner(viewer: Caller, owner_id: int) -> bool:
    """Whether the viewer acts as the owner (an admin on someone else's agent does not)."""
    return owner_id == viewer.user_id


async def visible_agent(info: Info, agent_id: int) -> AgentRow:
    """The agent if the viewer may see it (owner or admin), else NOT_FOUND."""
    viewer = info.context.require_viewer()
    row = await info.context.loaders.agent.load(agent_id)
    if row is None or not may_see(viewer, row.user_id):
        raise NotFound("agent", agent_id)
    return row


async def visible_run(info: Info, run_id: int) -> tuple[RunRow, int]:
    """The run and its agent's owner if the viewer may see it, else NOT_FOUND."""
    viewer = info.context.require_viewer()
    run = await info.context.loaders.run.load(run_id)
    agent = await info.context.loaders.agent.load(run.agent_id) if run else None
    if run is None or agent is None or not may_see(viewer, agent.user_id):
        raise NotFound("run", run_id)
    return run, agent.user_id
