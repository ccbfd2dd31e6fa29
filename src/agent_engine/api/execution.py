"""GraphQL execution: graphql-core's executor, its per-field work cut where it has nothing to do.

A page of 100 agents completes about a thousand fields, and graphql-core plus Strawberry spend more
on the machinery of each field than on the field itself (bench/README, "CPU per unit of work").
Two things are decided once per schema field when the schema is built (`streamline`), and fall
back to the standard path for anything else:

- **A plain leaf** — no resolver, no arguments, no field extensions, a scalar or enum type, not a
  list — is read off its source and coerced in place: no response path, no resolve info, no
  resolver call chain. Anything unusual (null where the type is non-null, a coercion that fails,
  an exception) runs the field again on the standard path, which is side-effect free for such a
  field and produces the standard error with its path.
- **A synchronous resolver** with no GraphQL arguments, no field extensions and no exception
  handlers is called directly — the source as `self`, Strawberry's `Info` when it asks for one —
  instead of through Strawberry's per-call argument conversion and extension chain, which have
  nothing to do for it. graphql-core still runs and completes it (errors, nullability, paths).

Results, errors and their paths are the same as graphql-core's and Strawberry's own; the whole API
suite runs on this executor.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple, cast

from graphql import (
    GraphQLEnumType,
    GraphQLField,
    GraphQLNonNull,
    GraphQLObjectType,
    GraphQLScalarType,
    GraphQLSchema,
)
from graphql.pyutils import Path, Undefined, gather_with_cancel
from strawberry.schema.schema import StrawberryGraphQLCoreExecutionContext
from strawberry.schema.schema_converter import GraphQLCoreConverter
from strawberry.types.field import StrawberryField

# The key under which Strawberry keeps a GraphQL field's StrawberryField.
_DEFINITION = GraphQLCoreConverter.DEFINITION_BACKREF


class _Leaf(NamedTuple):
    """How to read and coerce a plain leaf field in place."""

    attribute: str
    coerce: Callable[[Any], Any]
    non_null: bool


def _plain_leaf(field_def: GraphQLField) -> _Leaf | None:
    field = field_def.extensions.get(_DEFINITION)
    if (
        not isinstance(field, StrawberryField)
        or type(field).get_result is not StrawberryField.get_result
        or not field.is_basic_field
        or field.default_resolver is not getattr
        or field_def.args
        or not getattr(field_def.resolve, "_is_default", False)
    ):
        return None
    return_type = field_def.type
    non_null = isinstance(return_type, GraphQLNonNull)
    named = return_type.of_type if isinstance(return_type, GraphQLNonNull) else return_type
    if not isinstance(named, GraphQLScalarType | GraphQLEnumType):
        return None
    return _Leaf(field.python_name, named.coerce_output_value, non_null)


# Where `streamline` leaves the plain-leaf plans: in the GraphQL schema's own `extensions`, by
# object type name, then field name.
PLAIN_LEAVES = "agent_engine.plain_leaves"

LeafPlans = dict[str, dict[str, _Leaf]]


def _probe(_source: Any, _info: Any) -> None:
    """A resolver that middleware would wrap."""


class Executor(StrawberryGraphQLCoreExecutionContext):
    """graphql-core's executor (as Strawberry sets it up), plain leaves completed in place."""

    _leaf_plans: LeafPlans | None = None

    def _plans(self) -> LeafPlans:
        """The schema's plain-leaf plans; none when an extension wraps the resolvers (then every
        field takes the standard path) or the schema was not `streamline`d."""
        if self._leaf_plans is None:
            manager = self.middleware_manager
            wrapped = manager is not None and manager.get_field_resolver(_probe) is not _probe
            self._leaf_plans = {} if wrapped else self.schema.extensions.get(PLAIN_LEAVES, {})
        return self._leaf_plans

    def execute_fields(
        self,
        parent_type: GraphQLObjectType,
        source_value: Any,
        path: Path | None,
        grouped_field_set: Any,
        position_context: Any,
    ) -> Any:
        leaves = self._plans().get(parent_type.name)
        if leaves is None:
            return super().execute_fields(
                parent_type, source_value, path, grouped_field_set, position_context
            )
        results: dict[str, Any] = {}
        is_awaitable = self.is_awaitable
        awaitable_fields: list[str] = []
        try:
            for response_name, field_details_list in grouped_field_set.items():
                leaf = leaves.get(field_details_list[0].node.name.value)
                if leaf is not None:
                    value = _read_leaf(leaf, source_value)
                    if value is not Undefined:
                        results[response_name] = value
                        continue
                result = self.execute_field(
                    parent_type,
                    source_value,
                    field_details_list,
                    Path(path, response_name, parent_type.name),
                    position_context,
                )
                if result is not Undefined:
                    results[response_name] = result
                    if is_awaitable(result):
                        awaitable_fields.append(response_name)
        except Exception:
            if awaitable_fields:
                self.settle_in_background([results[name] for name in awaitable_fields])
            raise
        if not awaitable_fields:
            return results
        return _gathered(results, awaitable_fields)


async def _gathered(results: dict[str, Any], awaitable_fields: list[str]) -> dict[str, Any]:
    """As graphql-core's `execute_fields` settles the fields that returned awaitables."""
    if len(awaitable_fields) == 1:
        name = awaitable_fields[0]
        results[name] = await results[name]
    else:
        settled = await gather_with_cancel(*(results[name] for name in awaitable_fields))
        results.update(zip(awaitable_fields, settled, strict=True))
    return results


def _read_leaf(leaf: _Leaf, source: Any) -> Any:
    """The leaf's coerced value; Undefined where the standard path must complete (and word) it:
    null in a non-null field, an exception, a coercion that fails."""
    try:
        value = getattr(source, leaf.attribute)
        if value is None:
            return Undefined if leaf.non_null else None
        if isinstance(value, Exception):
            return Undefined
        coerced = leaf.coerce(value)
    except Exception:
        return Undefined
    return Undefined if coerced is None else coerced


def streamline(schema: Any) -> None:
    """Decide, once per field of a built Strawberry schema, what `Executor` may shortcut: its
    plain leaves (kept in the GraphQL schema's `extensions`), and the synchronous resolvers it
    calls directly (set as the fields' resolvers)."""
    graphql_schema: GraphQLSchema = schema._schema
    subscription = graphql_schema.subscription_type
    info_class = schema.config.info_class
    plans: LeafPlans = {}
    for graphql_type in graphql_schema.type_map.values():
        if not isinstance(graphql_type, GraphQLObjectType) or graphql_type is subscription:
            continue
        for name, field_def in graphql_type.fields.items():
            leaf = _plain_leaf(field_def)
            if leaf is not None:
                plans.setdefault(graphql_type.name, {})[name] = leaf
                continue
            direct = None if schema.exception_handlers else _direct_resolver(field_def, info_class)
            if direct is not None:
                field_def.resolve = direct
    graphql_schema.extensions = {**graphql_schema.extensions, PLAIN_LEAVES: plans}


def _direct_resolver(field_def: GraphQLField, info_class: type) -> Callable[..., Any] | None:
    field = field_def.extensions.get(_DEFINITION)
    if not isinstance(field, StrawberryField) or type(field).get_result is not (
        StrawberryField.get_result
    ):
        return None
    resolver = field.base_resolver
    if (
        resolver is None
        or field.is_async
        or field.extensions
        or field.arguments
        or field_def.args
        or resolver.root_parameter is not None
        or resolver.parent_parameter is not None
        or resolver.self_parameter is None
    ):
        return None
    function = cast(Callable[..., Any], resolver.wrapped_func)
    info_parameter = resolver.info_parameter
    if info_parameter is None:

        def resolve_plain(source: Any, _info: Any) -> Any:
            return function(source)

        resolve: Callable[[Any, Any], Any] = resolve_plain
    else:
        info_name = info_parameter.name

        def resolve_with_info(source: Any, info: Any) -> Any:
            return function(source, **{info_name: info_class(_raw_info=info, _field=field)})

        resolve = resolve_with_info
    resolve._is_default = False  # type: ignore[attr-defined]  # as Strawberry marks its own
    return resolve
