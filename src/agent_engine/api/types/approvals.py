"""Write-tool approvals: what waits for the owner, and how it was decided."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Annotated

import strawberry
from strawberry.scalars import JSON

from agent_engine.api.errors import NotFound
from agent_engine.api.pagination import Connection
from agent_engine.api.resolvers import Info, described
from agent_engine.api.types.catalog import Tool
from agent_engine.db.approvals import ApprovalRow
from agent_engine.db.catalog import ToolRow
from agent_engine.domain.mcp import ApprovalStatus, ToolAccess

if TYPE_CHECKING:
    from agent_engine.api.types.agents import Agent, Run

_AGENTS = "agent_engine.api.types.agents"


@strawberry.type(description="A WRITE tool call waiting for, or decided by, the run's owner.")
class ToolApproval:
    row: strawberry.Private[ApprovalRow]
    id: strawberry.ID
    status: ApprovalStatus
    requested_at: datetime
    expires_at: datetime = strawberry.field(
        description=(
            "PENDING becomes EXPIRED at this time (AGENT_ENGINE_APPROVAL_TIMEOUT_SECONDS after "
            "the request)."
        )
    )
    decided_at: datetime | None
    note: str | None = strawberry.field(
        description="The owner's note with the decision; the model sees it with a decline."
    )

    @classmethod
    def from_row(cls, row: ApprovalRow) -> ToolApproval:
        return cls(
            row=row,
            id=strawberry.ID(str(row.id)),
            status=ApprovalStatus(row.status),
            requested_at=row.requested_at,
            expires_at=row.expires_at,
            decided_at=row.decided_at,
            note=row.note,
        )

    @described(description="The arguments the model sent. Owner only.")
    def input(self, info: Info) -> JSON | None:
        viewer = info.context.viewer
        if viewer is None or viewer.user_id != self.row.owner_id:
            return None
        value: JSON = self.row.input
        return value

    @strawberry.field
    async def run(self, info: Info) -> Annotated[Run, strawberry.lazy(_AGENTS)]:
        from agent_engine.api.types.agents import Run

        row = await info.context.loaders.run.load(self.row.run_id)
        if row is None:
            raise NotFound("run", self.row.run_id)
        return Run.from_row(row, owner_id=self.row.owner_id)

    @strawberry.field
    async def agent(self, info: Info) -> Annotated[Agent, strawberry.lazy(_AGENTS)]:
        from agent_engine.api.types.agents import Agent

        row = await info.context.loaders.agent.load(self.row.agent_id)
        if row is None:
            raise NotFound("agent", self.row.agent_id)
        return Agent.from_row(row)

    @strawberry.field
    async def tool(self, info: Info) -> Tool:
        if self.row.tool_id is not None:
            row = await info.context.loaders.tool.load(self.row.tool_id)
            if row is not None:
                return Tool.from_row(row)
        # The tool left the catalog since (its source was removed): its name remains.
        return Tool.from_row(
            ToolRow(
                id=0,
                name=self.row.tool_name,
                description="no longer in the catalog",
                agents_allowed=False,
                created_at=self.row.requested_at,
                access=str(ToolAccess.WRITE),
            )
        )


ToolApprovalConnection = Connection[ToolApproval]
