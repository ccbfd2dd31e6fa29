"""An agent and its journal of runs, each run's transcript (steps) and its write-tool approvals.

One module: an agent serves its runs, a run serves its agent, its steps and its pending approval,
and an approval serves its run and agent (types that name each other live together, so the
package has no import cycle). What names none of them lives beside: an agent's own fields in
`types/agent_fields.py` (`AgentFields`, the base of `Agent`), a step's own fields in
`types/steps.py` (`RunStepFields`, the base of `RunStep`), and the columns the plain fields show
in `types/columns.py`.
"""

from __future__ import annotations

import asyncio
from datetime import datetime
from enum import Enum

import strawberry
from strawberry.dataloader import DataLoader
from strawberry.scalars import JSON

from agent_engine.api.errors import NotFound
from agent_engine.api.guards import page_size
from agent_engine.api.ids import decode_cursor
from agent_engine.api.pagination import Connection
from agent_engine.api.resolvers import Info, awaited_later, described, viewer_is_admin
from agent_engine.api.scalars import DecimalText
from agent_engine.api.types.agent_fields import AgentFields
from agent_engine.api.types.catalog import Tool
from agent_engine.api.types.columns import AGENT_FIELD_COLUMNS as AGENT_FIELD_COLUMNS
from agent_engine.api.types.columns import PREFETCHED_AGENT_FIELDS as PREFETCHED_AGENT_FIELDS
from agent_engine.api.types.columns import RUN_FIELD_COLUMNS as RUN_FIELD_COLUMNS
from agent_engine.api.types.columns import RUN_LEAVES
from agent_engine.api.types.columns import AgentRelations as AgentRelations
from agent_engine.api.types.connections import ConnectionStatus, ToolConnection
from agent_engine.api.types.delivery import Delivery, DeliveryTarget
from agent_engine.api.types.steps import RunStepFields
from agent_engine.db.approvals import ApprovalRow
from agent_engine.db.catalog import ToolRow
from agent_engine.db.runs import RunRow
from agent_engine.domain.mcp import ApprovalStatus, ToolAccess
from agent_engine.domain.runs import RunReason, RunState, RunStepKind, RunTrigger
from agent_engine.observability import tracing


@strawberry.enum(description="What a RUNNING run that no worker holds is waiting for.")
class RunWait(Enum):
    APPROVAL = "approval"
    CONNECTION = "connection"


@strawberry.type
class Run:
    row: strawberry.Private[RunRow]
    id: strawberry.ID
    trigger: RunTrigger
    state: RunState
    reason: RunReason | None
    tokens_used: int
    error: str | None
    started_at: datetime | None
    finished_at: datetime | None
    heartbeat_at: datetime | None
    created_at: datetime
    # The agent's owner when the caller knows it (else `output` looks it up).
    owner_id: strawberry.Private[int | None] = None
    prompt_tokens: int = strawberry.field(
        description="Provider-reported prompt tokens; promptTokens + completionTokens = tokensUsed."
    )
    completion_tokens: int
    cost: DecimalText | None = strawberry.field(
        description=(
            "tokens priced at the model's prices at the time of the run; null when the model has "
            "no prices."
        )
    )

    @classmethod
    def from_row(
        cls, row: RunRow, *, owner_id: int | None = None, columns: frozenset[str] | None = None
    ) -> Run:
        """The run of a whole row; with `columns`, of a narrow one (`RUN_FIELD_COLUMNS`): only
        the fields those columns show are set (any other raises AttributeError when read)."""
        # Made as `__init__` makes it (the same object), without its keyword call: a page makes a
        # hundred or two.
        run = cls.__new__(cls)
        run.__dict__.update(row=row, owner_id=owner_id)
        RUN_LEAVES.fill(run, row, columns)
        return run

    # The output was read with the owner's Knowledge Store access: it is the owner's alone.
    @described(
        description=(
            "The agent's final answer. The run's owner only: null for anyone else, admins included."
        )
    )
    def output(self, info: Info) -> str | None:
        viewer = info.context.viewer
        if viewer is None or self.row.output is None:
            return None
        if self.owner_id is not None:
            return self.row.output if self.owner_id == viewer.user_id else None
        return awaited_later(self._output_for(info, viewer.user_id))

    async def _output_for(self, info: Info, viewer_id: int) -> str | None:
        agent = await info.context.loaders.agent.load(self.row.agent_id)
        if agent is None or agent.user_id != viewer_id:
            return None
        return self.row.output

    @described(
        description=(
            "The run's transcript in order: every model call and tool call. Inputs and outputs are "
            "visible to the run's owner only (null for others, admins included)."
        )
    )
    async def steps(self, info: Info) -> list[RunStep]:
        rows, owner_view = await asyncio.gather(
            info.context.loaders.steps_of_run.load(int(self.id)),
            viewer_owns_run(info, self.row),
        )
        return [RunStep.from_row(r, owner_view=owner_view) for r in rows]

    @described(
        description=(
            "The approval this RUNNING run is parked on (no worker holds it meanwhile); null "
            "otherwise."
        )
    )
    async def pending_approval(self, info: Info) -> ToolApproval | None:
        if self.row.state != RunState.RUNNING:
            return None
        row = await info.context.loaders.pending_approval.load(self.row.id)
        return None if row is None else ToolApproval.from_row(row)

    @described(
        description=(
            "What this RUNNING run is parked on; null when a worker holds it or it is not running."
        )
    )
    async def waiting_for(self, info: Info) -> RunWait | None:
        if self.row.state != RunState.RUNNING:
            return None
        connection, approval = await asyncio.gather(
            info.context.loaders.pending_connection.load(self.row.id),
            info.context.loaders.pending_approval.load(self.row.id),
        )
        if connection is not None:
            return RunWait.CONNECTION
        return RunWait.APPROVAL if approval is not None else None

    @described(
        description="The owner's connection this RUNNING run waits for (waitingFor = CONNECTION)."
    )
    async def pending_connection(self, info: Info) -> ToolConnection | None:
        if self.row.state != RunState.RUNNING:
            return None
        pending = await info.context.loaders.pending_connection.load(self.row.id)
        if pending is None or pending.source_id is None:
            return None
        # What the owner must do, never their account's details (an admin may read this too).
        connection = ToolConnection.not_connected(pending.source_id, pending.source_name)
        if pending.connection_status == "expired":
            connection.status = ConnectionStatus.EXPIRED
        return connection

    @described(description="One per delivery target attached to the agent when the run finished.")
    async def deliveries(self, info: Info) -> list[Delivery]:
        rows = await info.context.loaders.deliveries_of_run.load(int(self.id))
        admin = viewer_is_admin(info)
        return [Delivery.from_row(r, admin=admin) for r in rows]

    @described(description="RETRY runs: the failed run it continues.")
    async def retry_of(self, info: Info) -> Run | None:
        if self.row.retry_of is None:
            return None
        row = await info.context.loaders.run.load(self.row.retry_of)
        return None if row is None else Run.from_row(row, owner_id=self.owner_id)

    @described(description="The RETRY run started from this one, if any.")
    async def retried_by(self, info: Info) -> Run | None:
        if self.row.state != RunState.FAILED:
            return None
        row = await info.context.loaders.retry_of_run.load(self.row.id)
        return None if row is None else Run.from_row(row, owner_id=self.owner_id)

    @described(
        description=(
            "The W3C trace id of the run's trace (32 hex digits) when tracing is on; null"
            " otherwise."
        )
    )
    async def trace_id(self, info: Info) -> str | None:
        # Off: no query. On: the traceparent its first worker saved (none before it started).
        if not tracing.ENABLED:
            return None
        found = await info.context.loaders.trace_parent.load(self.row.id)
        return None if found is None else tracing.trace_id_of(found[1])

    @strawberry.field
    async def agent(self, info: Info) -> Agent:
        return await agent_as_it_was(info, self.row.agent_id)


RunConnection = Connection[Run]


# The Agent type's fields that name no run are `AgentFields`' (types/agent_fields.py): the rest
# of this module's types and Agent name each other, so they live together.
@strawberry.type
class Agent(AgentFields):
    @described(description="The unfinished (queued or running) run, if any.")
    def active_run(self) -> Run | None:
        if self.relations is not None:
            row = self.relations.active_run
            return self._run(row, self.relations.run_columns) if row else None
        return awaited_later(self._load_run(self.loaders.active_run))

    @described(description="The newest finished run (succeeded, failed or skipped).")
    def last_run(self) -> Run | None:
        if self.relations is not None:
            row = self.relations.last_run
            return self._run(row, self.relations.run_columns) if row else None
        return awaited_later(self._load_run(self.loaders.last_run))

    @described(
        description=(
            "Median tokensUsed of this agent's last 10 SUCCEEDED or FAILED runs; null without "
            "history."
        )
    )
    async def expected_tokens_per_run(self, info: Info) -> int | None:
        return await info.context.loaders.expected_tokens.load(self.row.id)

    @described(description="This agent's tokensUsed in the current budget week.")
    async def used_tokens_this_week(self) -> int:
        return await self.loaders.agent_week_tokens.load(self.row.id)

    async def _load_run(self, loader: DataLoader[int, RunRow | None]) -> Run | None:
        row = await loader.load(self.row.id)
        return self._run(row) if row else None

    def _run(self, row: RunRow, columns: frozenset[str] | None = None) -> Run:
        return Run.from_row(row, owner_id=self.row.user_id, columns=columns)

    @described(
        description=(
            "Where each finished run of this agent is delivered (admin-approved targets the owner "
            "picked)."
        )
    )
    async def delivery_targets(self, info: Info) -> list[DeliveryTarget]:
        rows = await info.context.loaders.targets_of_agent.load(self.row.id)
        admin = viewer_is_admin(info)
        return [DeliveryTarget.from_row(r, admin=admin) for r in rows]

    @described(description="The journal, newest first.")
    async def runs(
        self,
        info: Info,
        first: int = 20,
        after: str | None = None,
        states: list[RunState] | None = None,
    ) -> RunConnection:
        size = page_size(first)
        key = (
            self.row.id,
            size + 1,  # one more tells hasNextPage
            decode_cursor("run", after),
            tuple(sorted({s.value for s in states})) if states is not None else None,
        )
        rows = await info.context.loaders.run_page.load(key)
        owner_id = self.row.user_id
        return RunConnection.from_rows(
            rows, size, kind="run", node=lambda row: Run.from_row(row, owner_id=owner_id)
        )


AgentConnection = Connection[Agent]


@strawberry.type
class RunEvent:
    run: Run
    previous_state: RunState | None


# --- a run's transcript ---------------------------------------------------------------------


# A step's own fields are `RunStepFields`' (types/steps.py); its approval is named here.
@strawberry.type
class RunStep(RunStepFields):
    @described(
        description="TOOL_CALL of a WRITE tool: the owner's approval (null when auto-approved)."
    )
    async def approval(self, info: Info) -> ToolApproval | None:
        if self.row.kind != RunStepKind.TOOL_CALL:
            return None
        for approval in await info.context.loaders.approvals_of_run.load(self.row.run_id):
            if approval.step_index == self.row.index:
                return ToolApproval.from_row(approval)
        return None


async def agent_as_it_was(info: Info, agent_id: int) -> Agent:
    """The agent of a run or an approval. Lists leave out the rows of hidden (deleted) agents;
    a row read just before its agent was hidden shows the agent as it was, so the row's list
    still answers. Only a row whose agent is gone altogether (its own row went with it, by
    cascade, after it was read) has none."""
    loaders = info.context.loaders
    row = await loaders.agent.load(agent_id)
    if row is None:
        row = await loaders.agent_as_it_was.load(agent_id)
    if row is None:
        raise NotFound("agent", agent_id)
    return Agent.from_row(row, loaders)


async def viewer_owns_run(info: Info, run_row: RunRow) -> bool:
    """Whether the viewer is the owner of the run's agent (batched through the agent loader)."""
    viewer = info.context.viewer
    if viewer is None:
        return False
    agent = await info.context.loaders.agent.load(run_row.agent_id)
    return agent is not None and agent.user_id == viewer.user_id


# --- write-tool approvals --------------------------------------------------------------------


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
    async def run(self, info: Info) -> Run:
        row = await info.context.loaders.run.load(self.row.run_id)
        if row is None:
            raise NotFound("run", self.row.run_id)
        return Run.from_row(row, owner_id=self.row.owner_id)

    @strawberry.field
    async def agent(self, info: Info) -> Agent:
        return await agent_as_it_was(info, self.row.agent_id)

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
