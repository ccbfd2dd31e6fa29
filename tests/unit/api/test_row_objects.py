"""`Run.from_row` and `Agent.from_row` set an object's fields from its leaves table, not through
`__init__`: the tables cover every plain field of the type, whole rows make the same objects as
`__init__`, and narrow rows set only the fields their columns show."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest
from strawberry.types.base import get_object_definition
from strawberry.utils.str_converters import to_camel_case

from agent_engine.api.types.agents import (
    AGENT_FIELD_COLUMNS,
    RUN_FIELD_COLUMNS,
    Agent,
    Run,
)
from agent_engine.db.agents import AgentRow
from agent_engine.db.runs import RunRow

NOW = datetime(2026, 12, 2, 9, 30, tzinfo=UTC)
RUN = RunRow(
    id=7,
    agent_id=3,
    trigger="manual",
    state="failed",
    reason="error",
    output="x",
    tokens_used=30,
    error="no",
    started_at=NOW,
    finished_at=NOW,
    heartbeat_at=NOW,
    created_at=NOW,
    model_id=2,
    last_sent_at=NOW,
    prompt_tokens=10,
    completion_tokens=20,
    cost=Decimal("0.000123"),
)
AGENT = AgentRow(
    id=3,
    user_id=5,
    name="n",
    description="d",
    prompt="p",
    schedule={"type": "interval", "every_hours": 6},
    model_id=2,
    enabled=True,
    admin_paused=False,
    admin_pause_note=None,
    next_run_at=NOW,
    meta={"team": "ops"},
    created_at=NOW,
    updated_at=NOW,
    deleted_at=None,
    weekly_token_cap=50_000,
    max_tokens_per_run=None,
)


def _plain_fields(cls: type[Any]) -> set[str]:
    """The GraphQL fields of `cls` without a resolver: what `__init__` takes besides privates."""
    definition = get_object_definition(cls, strict=True)
    return {field.python_name for field in definition.fields if field.base_resolver is None}


def _init_values(cls: type[Any], made: Any) -> dict[str, Any]:
    """What `cls(...)` with the values of `made` sets."""
    names = {field.name for field in dataclasses.fields(cls)} & set(vars(made))
    return dict(vars(cls(**{name: getattr(made, name) for name in names})))


@pytest.mark.parametrize(
    ("cls", "made"),
    [(Run, Run.from_row(RUN, owner_id=5)), (Agent, Agent.from_row(AGENT, loaders=None))],  # type: ignore[arg-type]
)
def test_a_whole_row_sets_every_plain_field_as_init_does(cls: type[Any], made: Any) -> None:
    assert _plain_fields(cls) <= set(vars(made)), "a plain field missing from the leaves table"
    assert vars(made) == _init_values(cls, made)


def test_the_narrow_tables_name_fields_of_the_types() -> None:
    names = {
        Run: set(RUN_FIELD_COLUMNS) - {"__typename"},
        Agent: set(AGENT_FIELD_COLUMNS) - {"__typename"},
    }
    for cls, listed in names.items():
        fields = get_object_definition(cls, strict=True).fields
        graphql = {field.graphql_name or to_camel_case(field.python_name) for field in fields}
        assert listed <= graphql, listed - graphql


def test_a_narrow_run_sets_only_what_its_columns_show() -> None:
    run = Run.from_row(RUN, owner_id=5, columns=frozenset({"id", "agent_id", "state", "cost"}))
    assert (run.id, run.state.value, run.cost) == ("7", "failed", "0.000123")
    with pytest.raises(AttributeError):
        run.error  # noqa: B018
