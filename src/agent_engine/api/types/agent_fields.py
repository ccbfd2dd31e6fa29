"""The Agent type's own fields: its settings, owner, schedule, model, status and tools.

`Agent` (types/agents.py) adds the fields that name its runs; the two are one GraphQL type,
`Agent`, with these fields first (this class is never in the schema by itself).
"""

from __future__ import annotations

from datetime import datetime
from typing import Self

import strawberry
from strawberry.scalars import JSON

from agent_engine.api.enums import AgentStatus
from agent_engine.api.errors import BadUserInput
from agent_engine.api.guards import MAX_UPCOMING_RUN_TIMES
from agent_engine.api.loaders import Loaders
from agent_engine.api.resolvers import Info, awaited_later, described
from agent_engine.api.types.catalog import AgentModel, Tool
from agent_engine.api.types.columns import AGENT_LEAVES, AgentRelations
from agent_engine.api.types.schedules import Schedule, schedule_from_json
from agent_engine.api.types.users import User, existing_user, owner_zone
from agent_engine.db.agents import AgentRow
from agent_engine.domain import gate
from agent_engine.domain.schedule import next_slots, parse_schedule
from agent_engine.runtime.tools.registry import core_tools


def _gate(row: AgentRow) -> dict[str, bool]:
    return {
        "enabled": row.enabled,
        "admin_paused": row.admin_paused,
        "has_model": row.model_id is not None,
    }


@strawberry.type
class AgentFields:
    row: strawberry.Private[AgentRow]
    id: strawberry.ID
    name: str
    description: str | None
    prompt: str
    enabled: bool
    admin_paused: bool
    next_run_at: datetime | None
    meta: JSON | None
    created_at: datetime
    updated_at: datetime
    weekly_token_cap: int | None = strawberry.field(
        description=(
            "The owner's cap on this agent's tokens per budget week; once spent, its starts are "
            "SKIPPED / AGENT_BUDGET_EXCEEDED. null = none (the owner's cap still holds)."
        )
    )
    max_tokens_per_run: int | None = strawberry.field(
        description=(
            "A run that passes this many tokens stops FAILED / TOKEN_CAP, keeping its "
            "transcript. null = none."
        )
    )
    # The request's loaders: the fields a page prefetches (`relations`) load through them when
    # they were not, without asking for an `Info` (one per field and agent costs a page more than
    # the field).
    loaders: strawberry.Private[Loaders]
    relations: strawberry.Private[AgentRelations | None] = None

    @classmethod
    def from_row(
        cls,
        row: AgentRow,
        loaders: Loaders,
        relations: AgentRelations | None = None,
        columns: frozenset[str] | None = None,
    ) -> Self:
        """The agent of a whole row; with `columns`, of a narrow one (`AGENT_FIELD_COLUMNS`):
        only the fields those columns show are set (any other raises AttributeError when read).
        Made as `__init__` makes it (the same object), without its keyword call."""
        agent = cls.__new__(cls)
        agent.__dict__.update(row=row, loaders=loaders, relations=relations)
        AGENT_LEAVES.fill(agent, row, columns)
        return agent

    @strawberry.field
    async def owner(self, info: Info) -> User:
        return await existing_user(info, self.row.user_id)

    @strawberry.field
    def schedule(self) -> Schedule | None:
        return schedule_from_json(self.row.schedule)

    @strawberry.field
    def model(self) -> AgentModel | None:
        if self.relations is not None:
            return self.relations.model
        return awaited_later(self._load_model())

    async def _load_model(self) -> AgentModel | None:
        if self.row.model_id is None:
            return None
        row = await self.loaders.model.load(self.row.model_id)
        return AgentModel.from_row(row) if row else None

    @strawberry.field
    def status(self) -> AgentStatus:
        status = gate.agent_status(**_gate(self.row), has_schedule=self.row.schedule is not None)
        return AgentStatus(status)

    @described(description="Why an admin paused it (null when not paused or no note was given).")
    def admin_pause_note(self) -> str | None:
        return self.row.admin_pause_note

    @described(
        description=(
            "True when the start gate is open "
            "(a manual start would be accepted or journaled as skipped)."
        )
    )
    def can_start(self) -> bool:
        return gate.closed_lock(**_gate(self.row)) is None

    @described(
        description=(
            "The next slots of the schedule (empty when the agent cannot start or has no "
            f"schedule). At most {MAX_UPCOMING_RUN_TIMES}."
        )
    )
    async def upcoming_run_times(self, info: Info, limit: int = 5) -> list[datetime]:
        if not 0 <= limit <= MAX_UPCOMING_RUN_TIMES:
            raise BadUserInput("limit", f"must be between 0 and {MAX_UPCOMING_RUN_TIMES}")
        first = self.row.next_run_at
        schedule = parse_schedule(self.row.schedule)
        if limit == 0 or first is None or schedule is None or not self.can_start():
            return []
        zone = await owner_zone(info, self.row.user_id)
        following = next_slots(schedule, after=first, zone=zone, count=limit - 1, anchor=first)
        return [first, *following][:limit]

    @described(description="The locked Knowledge Store tools every agent has.")
    def core_tools(self) -> list[str]:
        return list(core_tools())

    @described(
        description=(
            "The owner's optional selection, including tools an admin has since disallowed "
            "(agentsAllowed = false)."
        )
    )
    def tools(self) -> list[Tool]:
        if self.relations is not None:
            return self.relations.tools
        return awaited_later(self._load_tools())

    async def _load_tools(self) -> list[Tool]:
        rows = await self.loaders.tools_of_agent.load(self.row.id)
        return [Tool.from_row(r) for r in rows]

    @described(
        description="WRITE tools of its selection that run without asking the owner "
        "(setToolAutoApproved)."
    )
    async def auto_approved_tools(self, info: Info) -> list[Tool]:
        rows = await info.context.loaders.auto_approved_of_agent.load(self.row.id)
        return [Tool.from_row(r) for r in rows]
