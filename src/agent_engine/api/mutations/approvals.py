"""The owner's say over write tools: auto-approve one for an agent, or decide a waiting call.
Admins oversee but do not decide for the owner (FORBIDDEN)."""

from __future__ import annotations

import strawberry

from agent_engine.api.access import is_owner, may_see
from agent_engine.api.errors import BadUserInput, Conflict, Forbidden, NotFound
from agent_engine.api.guards import checked_text
from agent_engine.api.ids import parse_id
from agent_engine.api.mutations.common import fresh_agent, owned_agent, transaction
from agent_engine.api.resolvers import Info, described_mutation
from agent_engine.api.state import services
from agent_engine.api.types.agents import Agent, ToolApproval
from agent_engine.db import agent_tools as agent_tools_db
from agent_engine.db import approvals as approvals_db
from agent_engine.domain.mcp import ToolAccess
from agent_engine.runs import approvals


@strawberry.type
class ApprovalMutation:
    @described_mutation(
        description=(
            "Owner only. A WRITE tool of the agent's selection runs without asking (true) or "
            "waits for approval (false, the default)."
        )
    )
    async def set_tool_auto_approved(
        self, info: Info, agent_id: strawberry.ID, tool_id: strawberry.ID, auto_approved: bool
    ) -> Agent:
        info.context.require_viewer()
        agent = parse_id(agent_id, "agentId")
        tool = parse_id(tool_id, "toolId")
        await owned_agent(info, agent, "auto-approve its tools", owner_only=True)
        async with transaction(info) as conn:
            access = await agent_tools_db.tool_access_in_selection(conn, agent, tool)
            if access is None:
                raise BadUserInput("toolId", f"tool {tool} is not in the agent's selection")
            if access != ToolAccess.WRITE:
                raise BadUserInput(
                    "toolId", f"tool {tool} only reads (READ): it never waits for approval"
                )
            await agent_tools_db.set_auto_approved(conn, agent, tool, auto_approved=auto_approved)
            return await fresh_agent(info, conn, agent)

    @described_mutation(
        description=(
            "Owner only. Decides a PENDING approval; the parked run resumes on any worker. A "
            "decided or expired one is a CONFLICT."
        )
    )
    async def decide_tool_call(
        self, info: Info, approval_id: strawberry.ID, approve: bool, note: str | None = None
    ) -> ToolApproval:
        viewer = info.context.require_viewer()
        ident = parse_id(approval_id, "approvalId")
        if note is not None:
            note = checked_text("note", note, approvals.NOTE_MAX_CHARS, allow_blank=True).strip()
        async with services(info)["engine"].connect() as conn:
            found = await approvals_db.fetch(conn, ident)
        if found is None or not may_see(viewer, found.owner_id):
            raise NotFound("tool approval", ident)
        if not is_owner(viewer, found.owner_id):
            raise Forbidden("only the run's owner decides its tool calls")
        try:
            decided = await approvals.decide(
                services(info)["engine"],
                ident,
                actor_id=viewer.user_id,
                approve=approve,
                note=note or None,
                enqueue=services(info)["enqueue"],
            )
        except approvals.ApprovalMissing as exc:
            raise NotFound("tool approval", ident) from exc
        except approvals.ApprovalClosed as exc:
            raise Conflict(f"approval {ident} is already {exc.status}") from exc
        return ToolApproval.from_row(decided)
