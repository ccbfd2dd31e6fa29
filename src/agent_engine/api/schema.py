"""The Strawberry schema: Query, Mutation and the Subscription type of `api/subscriptions.py`.

`export_sdl()` is what `agent-engine export-schema` writes to `schema/schema.graphql`; a test fails
when the committed file drifts from the code.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import strawberry
from graphql import GraphQLObjectType
from strawberry.extensions import SchemaExtension
from strawberry.schema.config import StrawberryConfig

from agent_engine.api.errors import ErrorPolicy
from agent_engine.api.mutations import Mutation
from agent_engine.api.queries import Query
from agent_engine.api.scalars import SCALAR_MAP
from agent_engine.api.subscriptions import Subscription
from agent_engine.api.types.agents import PREFETCHED_AGENT_RESOLVERS, RunEvent


class Schema(strawberry.Schema):
    def process_errors(self, errors: Any, execution_context: Any = None) -> None:
        # ErrorPolicy logs the unexpected ones (with a correlation id); client errors are not
        # server errors and would only flood the log.
        return None


def build_schema(
    extensions: Sequence[Callable[[], SchemaExtension] | type[SchemaExtension]] = (),
) -> strawberry.Schema:
    schema = Schema(
        query=Query,
        mutation=Mutation,
        subscription=Subscription,
        types=[RunEvent],
        extensions=[*extensions, ErrorPolicy],
        config=StrawberryConfig(scalar_map=SCALAR_MAP),
    )
    _resolve_prefetched_directly(schema)
    return schema


def _resolve_prefetched_directly(schema: strawberry.Schema) -> None:
    """A page's agents carry their relations (`Viewer.agents`): their four relation fields are
    resolved straight from them, without Strawberry's per-call resolver wrapper (an `Info`, the
    argument conversion, the extension chain: ~40 µs a field on this machine, 400 fields for a
    page of 100 agents). Any other agent (no relations) takes Strawberry's resolver as before.
    The fields stay resolver fields, so the SDL and its field order are unchanged."""
    agent_type = schema._schema.type_map["Agent"]
    assert isinstance(agent_type, GraphQLObjectType)
    for name, method in PREFETCHED_AGENT_RESOLVERS.items():
        field = agent_type.fields[name]
        field.resolve = _prefetched_or(method, field.resolve)


def _prefetched_or(method: str, resolve: Any) -> Callable[..., Any]:
    def resolver(source: Any, info: Any, **kwargs: Any) -> Any:
        if getattr(source, "relations", None) is not None:
            return getattr(source, method)()
        return resolve(source, info, **kwargs)

    return resolver


def export_sdl() -> str:
    return build_schema().as_str() + "\n"
