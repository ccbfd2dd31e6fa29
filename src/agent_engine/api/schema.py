"""The Strawberry schema: Query, Mutation and the Subscription type of `api/subscriptions.py`.

`export_sdl()` is what `agent-engine export-schema` writes to `schema/schema.graphql`; a test fails
when the committed file drifts from the code.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import strawberry
from strawberry.extensions import SchemaExtension
from strawberry.schema.config import StrawberryConfig

from agent_engine.api.errors import ErrorPolicy
from agent_engine.api.execution import Executor, streamline
from agent_engine.api.mutations import Mutation
from agent_engine.api.queries import Query
from agent_engine.api.scalars import SCALAR_MAP
from agent_engine.api.subscriptions import Subscription
from agent_engine.api.types.agents import RunEvent


class Schema(strawberry.Schema):
    def process_errors(self, errors: Any, execution_context: Any = None) -> None:
        # ErrorPolicy logs the unexpected ones (with a correlation id); client errors are not
        # server errors and would only flood the log.
        return None


def build_schema(
    extensions: Sequence[Callable[[], SchemaExtension] | type[SchemaExtension]] = (),
    *,
    fast_execution: bool = True,
) -> strawberry.Schema:
    """The schema, executed by `api/execution.py` (`fast_execution`, what the app serves) or by
    Strawberry's standard execution (the reference the differential test compares it with)."""
    schema = Schema(
        query=Query,
        mutation=Mutation,
        subscription=Subscription,
        types=[RunEvent],
        extensions=[*extensions, ErrorPolicy],
        config=StrawberryConfig(scalar_map=SCALAR_MAP),
        execution_context_class=Executor if fast_execution else None,
    )
    if fast_execution:
        streamline(schema)
    return schema


def export_sdl() -> str:
    return build_schema().as_str() + "\n"
