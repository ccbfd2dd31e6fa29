"""The viewer: who is asking, their agents and their budget."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import strawberry
from strawberry.types.nodes import SelectedField, Selection

from agent_engine.api.execution import field_nodes
from agent_engine.api.loaders import Loaders
from agent_engine.api.resolvers import Info, described
from agent_engine.api.types.agents import (
    AGENT_FIELD_COLUMNS,
    PREFETCHED_AGENT_FIELDS,
    RUN_FIELD_COLUMNS,
    Agent,
    AgentRelations,
)
from agent_engine.api.types.budget import Budget, BudgetAlert
from agent_engine.api.types.catalog import AgentModel, Tool
from agent_engine.api.types.users import User, existing_user
from agent_engine.db.agents import AgentRow


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
        shape = _page_shape(info)
        if not shape.prefetch:
            rows = await self._whole_agents(loaders)
            return [Agent.from_row(r, loaders) for r in rows]
        # The whole page's relations at once, in one statement (`db.pages`), so the per-agent
        # fields need no awaiting (see `awaited_later`); the agents and their runs as narrow
        # rows when the page shows only columns of them.
        agent_columns, run_columns = shape.agent_columns, shape.run_columns
        if agent_columns is None:
            rows = await self._whole_agents(loaders)
            if not rows:
                return []
            model_ids = sorted({r.model_id for r in rows if r.model_id is not None})
            found = await loaders.page_relations([r.id for r in rows], model_ids, run_columns)
        else:
            rows, found = await loaders.narrow_page(self.viewer_id, agent_columns, run_columns)
            if not rows:
                return []
        ids = [r.id for r in rows]
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
                    run_columns=run_columns,
                ),
                agent_columns,
            )
            for row, agent_id in zip(rows, ids, strict=True)
        ]

    async def _whole_agents(self, loaders: Loaders) -> list[AgentRow]:
        """The viewer's agents as whole rows, each primed for `agent` (narrow rows never are)."""
        rows = await loaders.agents_of_owner.load(self.viewer_id)
        for row in rows:
            loaders.prime_agent(row)
        return rows

    @strawberry.field
    async def budget(self, info: Info) -> Budget:
        value = await info.context.loaders.budget.load(self.viewer_id)
        return Budget.from_value(value, owner_id=self.viewer_id)

    @described(description="This week's alerts for the viewer's own spend.")
    async def budget_alerts(self, info: Info) -> list[BudgetAlert]:
        alerts = await info.context.loaders.alerts_this_week.load(self.viewer_id)
        return [BudgetAlert.from_value(alert) for alert in alerts]


class _PageShape(NamedTuple):
    """What a selection of `agents` needs: its relations prefetched (it shows one of them), and
    the columns its agents and their runs show (None: whole rows)."""

    prefetch: bool
    agent_columns: frozenset[str] | None
    run_columns: frozenset[str] | None


# Shapes by the `agents` field's nodes: a document served from the guards' cache brings the same
# node objects each time, and a shape depends on the document alone (field names, through
# fragments). The nodes are kept beside their shape, so no id is reused while it is cached.
_SHAPES: dict[tuple[int, ...], tuple[tuple[Any, ...], _PageShape]] = {}
_MAX_SHAPES = 256


def _page_shape(info: Info) -> _PageShape:
    nodes = tuple(field_nodes(info))
    key = tuple(map(id, nodes))
    cached = _SHAPES.get(key)
    if cached is not None and all(a is b for a, b in zip(cached[0], nodes, strict=True)):
        return cached[1]
    fields = _fields_below(info.selected_fields)
    runs = [field for field in fields if field.name in ("lastRun", "activeRun")]
    shape = _PageShape(
        prefetch=bool(PREFETCHED_AGENT_FIELDS.intersection(field.name for field in fields)),
        agent_columns=_columns(fields, AGENT_FIELD_COLUMNS),
        run_columns=_columns(_fields_below(runs), RUN_FIELD_COLUMNS),
    )
    if len(_SHAPES) >= _MAX_SHAPES:
        _SHAPES.clear()
    _SHAPES[key] = (nodes, shape)
    return shape


def _fields_below(fields: Sequence[Selection]) -> list[SelectedField]:
    """The fields selected directly below `fields`, through fragments."""
    found: list[SelectedField] = []
    pending: list[Selection] = [selection for field in fields for selection in field.selections]
    while pending:
        selection = pending.pop()
        if isinstance(selection, SelectedField):
            found.append(selection)
        else:
            pending.extend(selection.selections)
    return found


def _columns(
    fields: list[SelectedField], field_columns: dict[str, tuple[str, ...]]
) -> frozenset[str] | None:
    """The columns `fields` show, when each is one of `field_columns`; None when any needs the
    whole row."""
    columns: set[str] = set()
    for field in fields:
        shown = field_columns.get(field.name)
        if shown is None:
            return None
        columns.update(shown)
    return frozenset(columns)
