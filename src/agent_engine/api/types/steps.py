"""A run's transcript: the RunStep type's own fields, as read from a step's row.

`RunStep` (types/agents.py) adds the step's approval; the two are one GraphQL type, `RunStep`,
with these fields first (this class is never in the schema by itself).
"""

from __future__ import annotations

from datetime import datetime
from typing import Self

import strawberry
from strawberry.scalars import JSON

from agent_engine.api.types.connections import ToolSourceAuth
from agent_engine.db.run_steps import StepRow
from agent_engine.domain.runs import RunStepKind


@strawberry.type
class RunStepFields:
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
    fallback: bool = strawberry.field(
        default=False,
        description=(
            "MODEL_CALL: true when a fallback model answered (name is the model that answered)."
        ),
    )
    reused: bool = strawberry.field(
        default=False,
        description=(
            "A RETRY run's step carried over from the failed run (not made again, not counted "
            "again)."
        ),
    )
    authority: ToolSourceAuth | None = strawberry.field(
        default=None,
        description=(
            "TOOL_CALL of an MCP tool: the credential the call carried (OWNER_OAUTH: the owner's "
            "own account)."
        ),
    )
    account: str | None = strawberry.field(
        default=None,
        description=(
            "TOOL_CALL of an OWNER_OAUTH tool: the owner's account at the server the call was "
            "made as. Owner only."
        ),
    )

    @classmethod
    def from_row(cls, row: StepRow, *, owner_view: bool) -> Self:
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
            fallback=row.fallback,
            reused=row.reused,
            authority=None if row.authority is None else ToolSourceAuth(row.authority),
            account=row.account if owner_view else None,
        )
