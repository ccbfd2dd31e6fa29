"""A run's transcript: its model calls and tool calls, in order."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Annotated

import strawberry
from strawberry.scalars import JSON

from agent_engine.api.resolvers import Info, described
from agent_engine.db.run_steps import StepRow
from agent_engine.db.runs import RunRow
from agent_engine.domain.runs import RunStepKind

if TYPE_CHECKING:
    from agent_engine.api.types.approvals import ToolApproval


@strawberry.type
class RunStep:
    row: strawberry.Private[StepRow]
    index: int = strawberry.field(description="0, 1, 2 … in the order the steps started.")
    kind: RunStepKind
    name: str = strawberry.field(
        description="The model name for MODEL_CALL, the tool name for TOOL_CALL."
    )
    input: JSON | None = strawberry.field(
        description="TOOL_CALL: the arguments the model sent. Owner only."
    )
    output: str | None = strawberry.field(
        description=(
            "MODEL_CALL: the assistant text (may be empty when it only called tools); TOOL_CALL: "
            "the result as the model saw it (bounded). Owner only."
        )
    )
    error: str | None
    prompt_tokens: int | None
    completion_tokens: int | None
    started_at: datetime
    finished_at: datetime | None

    @classmethod
    def from_row(cls, row: StepRow, *, owner_view: bool) -> RunStep:
        """`owner_view`: the viewer owns the run; inputs and outputs were read with the owner's
        access and are the owner's alone."""
        return cls(
            row=row,
            index=row.index,
            kind=RunStepKind(row.kind),
            name=row.name,
            input=row.input if owner_view else None,
            output=row.output if owner_view else None,
            error=row.error,
            prompt_tokens=row.prompt_tokens,
            completion_tokens=row.completion_tokens,
            started_at=row.started_at,
            finished_at=row.finished_at,
        )

    @described(
        description="TOOL_CALL of a WRITE tool: the owner's approval (null when auto-approved)."
    )
    async def approval(
        self, info: Info
    ) -> Annotated[ToolApproval, strawberry.lazy("agent_engine.api.types.approvals")] | None:
        from agent_engine.api.types.approvals import ToolApproval

        if self.row.kind != RunStepKind.TOOL_CALL:
            return None
        for approval in await info.context.loaders.approvals_of_run.load(self.row.run_id):
            if approval.step_index == self.row.index:
                return ToolApproval.from_row(approval)
        return None


async def viewer_owns_run(info: Info, run_row: RunRow) -> bool:
    """Whether the viewer is the owner of the run's agent (batched through the agent loader)."""
    viewer = info.context.viewer
    if viewer is None:
        return False
    agent = await info.context.loaders.agent.load(run_row.agent_id)
    return agent is not None and agent.user_id == viewer.user_id
