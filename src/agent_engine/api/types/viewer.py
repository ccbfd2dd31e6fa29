"""The viewer: who is asking, their agents and their budget."""

from __future__ import annotations

import strawberry
from strawberry.types.nodes import SelectedField, Selection

from agent_engine.api.resolvers import Info, described
from agent_engine.api.types.agents import PREFETCHED_AGENT_FIELDS, Agent, AgentRelations
from agent_engine.api.types.budget import Budget, BudgetAlert
from agent_engine.api.types.catalog import AgentModel, Tool
from agent_engine.api.types.users import User, existing_user


@strawberry.type
class Viewer:
    viewer_id: strawberry.Private[int]
    is_admin: bool

    @strawberry.field
    async def user(self, info: Info) -> User:
        return await existing_user(info, self.viewer_id)

    @described(description="The viewer's own agents, oldest first.")
    async def agents(self, info: Info) -> list[Agent]:
        loaders = info.context.loaders
        rows = await loaders.agents_of_owner.load(self.viewer_id)
        for row in rows:
            loaders.prime_agent(row)
        if not rows or not PREFETCHED_AGENT_FIELDS & _selected_names(info.selected_fields):
            return [Agent.from_row(r, loaders) for r in rows]
        # The whole page's relations at once, one statement each, so the per-agent fields need
        # no awaiting (see `awaited_later`).
        ids = [r.id for r in rows]
        model_ids = sorted({r.model_id for r in rows if r.model_id is not None})
        found = await loaders.page_relations(ids, model_ids)
        models = {model_id: AgentModel.from_row(model) for model_id, model in found.models.items()}
        tools: dict[int, Tool] = {}
        return [
            Agent.from_row(
                row,
                loaders,
                AgentRelations(
                    model=models.get(row.model_id) if row.model_id is not None else None,
                    tools=[
                        tools.get(tool.id) or tools.setdefault(tool.id, Tool.from_row(tool))
                        for tool in found.tools[agent_id]
                    ],
                    active_run=found.active_runs.get(agent_id),
                    last_run=found.last_runs.get(agent_id),
                ),
            )
            for row, agent_id in zip(rows, ids, strict=True)
        ]

    @strawberry.field
    async def budget(self, info: Info) -> Budget:
        value = await info.context.loaders.budget.load(self.viewer_id)
        return Budget.from_value(value, owner_id=self.viewer_id)

    @described(description="This week's alerts for the viewer's own spend.")
    async def budget_alerts(self, info: Info) -> list[BudgetAlert]:
        alerts = await info.context.loaders.alerts_this_week.load(self.viewer_id)
        return [BudgetAlert.from_value(alert) for alert in alerts]


def _selected_names(fields: list[Selection]) -> set[str]:
    """The names of the fields selected below `fields` (the resolver's own), through fragments."""
    names: set[str] = set()
    pending: list[Selection] = [selection for field in fields for selection in field.selections]
    while pending:
        selection = pending.pop()
        if isinstance(selection, SelectedField):
            names.add(selection.name)
        else:
            pending.extend(selection.selections)
    return names
