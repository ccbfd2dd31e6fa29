"""The plain fields of a run and an agent and the columns they show (`LeafTable`): a type made
from a narrow row sets only the fields its columns show, and a page of agents asks only for the
columns its selection needs, its relations prefetched (`AgentRelations`, `Viewer.agents`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import strawberry
from strawberry.utils.str_converters import to_camel_case

from agent_engine.api.scalars import decimal_text_or_none
from agent_engine.api.types.catalog import AgentModel, Tool
from agent_engine.db.runs import RunRow
from agent_engine.domain.runs import RunReason, RunState, RunTrigger

_TRIGGERS = {member.value: member for member in RunTrigger}


_STATES = {member.value: member for member in RunState}
_REASONS = {member.value: member for member in RunReason}


def _id(value: int) -> strawberry.ID:
    return strawberry.ID(str(value))


def _reason(value: str | None) -> RunReason | None:
    return _REASONS[value] if value else None


class LeafTable:
    """The plain fields of a type made from a row: each field's attribute, the column it shows
    and how (None: as it is). A whole row sets them all; a narrow one (its `columns`) only those
    its columns show, so reading another raises AttributeError, as the row's own would."""

    def __init__(self, *leaves: tuple[str, str, Callable[[Any], Any] | None]) -> None:
        self._every = leaves
        # By column set: the sets come from this table's own columns (finite), and a frozenset
        # keeps its hash.
        self._narrow: dict[frozenset[str], tuple[Any, ...]] = {}

    def fill(self, made: Any, row: Any, columns: frozenset[str] | None) -> None:
        """Set `made`'s fields from `row`, through its `__dict__` (as `__init__` would)."""
        values = made.__dict__
        for attribute, column, convert in self._of(columns):
            value = getattr(row, column)
            values[attribute] = value if convert is None else convert(value)

    def _of(self, columns: frozenset[str] | None) -> tuple[Any, ...]:
        if columns is None:
            return self._every
        leaves = self._narrow.get(columns)
        if leaves is None:
            leaves = self._narrow[columns] = tuple(
                leaf for leaf in self._every if leaf[1] in columns
            )
        return leaves

    def field_columns(self) -> dict[str, tuple[str, ...]]:
        """Each field's GraphQL name and the column it shows (and `__typename`, none)."""
        return {to_camel_case(attribute): (column,) for attribute, column, _ in self._every} | {
            "__typename": ()
        }


# By value from a dict for the enums: an Enum call costs ~0.6 µs, three per run of a page.
RUN_LEAVES = LeafTable(
    ("id", "id", _id),
    ("trigger", "trigger", _TRIGGERS.__getitem__),
    ("state", "state", _STATES.__getitem__),
    ("reason", "reason", _reason),
    ("tokens_used", "tokens_used", None),
    ("error", "error", None),
    ("started_at", "started_at", None),
    ("finished_at", "finished_at", None),
    ("heartbeat_at", "heartbeat_at", None),
    ("created_at", "created_at", None),
    ("prompt_tokens", "prompt_tokens", None),
    ("completion_tokens", "completion_tokens", None),
    ("cost", "cost", decimal_text_or_none),
)
# The Run fields a narrow run row can serve, by GraphQL name, with the columns each shows. A
# selection of only these reads only their columns (`Viewer.agents`); any other field (output,
# steps, agent, …) needs the whole row.
RUN_FIELD_COLUMNS = RUN_LEAVES.field_columns()


class AgentRelations(NamedTuple):
    """An agent's related objects, fetched for a whole page at once (Viewer.agents). A model or
    tool many agents share is one object, made once for the page. (A named tuple: a frozen
    dataclass costs ~1 µs more to make, a hundred times a page.)"""

    model: AgentModel | None
    tools: list[Tool]
    active_run: RunRow | None
    last_run: RunRow | None
    # The columns the runs were read with (narrow rows), None for whole rows.
    run_columns: frozenset[str] | None = None


# GraphQL names of the Agent fields served from AgentRelations when a page asks for them.
PREFETCHED_AGENT_FIELDS = frozenset({"model", "tools", "activeRun", "lastRun"})

# The plain fields of an Agent.
AGENT_LEAVES = LeafTable(
    ("id", "id", _id),
    ("name", "name", None),
    ("description", "description", None),
    ("prompt", "prompt", None),
    ("enabled", "enabled", None),
    ("admin_paused", "admin_paused", None),
    ("next_run_at", "next_run_at", None),
    ("meta", "meta", None),
    ("created_at", "created_at", None),
    ("updated_at", "updated_at", None),
    ("weekly_token_cap", "weekly_token_cap", None),
    ("max_tokens_per_run", "max_tokens_per_run", None),
)
# The Agent fields a page of narrow agent rows can serve (with its relations prefetched), by
# GraphQL name, with the columns each needs; any other field needs the whole row.
AGENT_FIELD_COLUMNS = AGENT_LEAVES.field_columns() | {
    "model": ("model_id",),
    "tools": (),
    "activeRun": ("user_id",),  # the owner, who alone sees a run's output
    "lastRun": ("user_id",),
}
