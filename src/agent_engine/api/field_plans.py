"""The field plans: what the executor may shortcut for each field, decided once when the schema
is built (`streamline` in `api/execution.py`), and the steps a selection is walked in.

A plain leaf's plan is a `LeafPlan` (`api/leaf_path.py`). A resolver with no GraphQL arguments,
no field extensions and no exception handlers is called directly (a `DirectPlan`) — the source
as `self`, Strawberry's `Info` when it asks for one — instead of through Strawberry's per-call
argument conversion and extension chain, which have nothing to do for it; its results are
completed by `api/resolver_path.py`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple, cast

from graphql import (
    GraphQLEnumType,
    GraphQLField,
    GraphQLList,
    GraphQLNonNull,
    GraphQLObjectType,
    GraphQLOutputType,
    GraphQLScalarType,
)
from strawberry.types.field import StrawberryField

from agent_engine.api.leaf_path import DEFINITION, LeafPlan

# The shapes of a direct resolver's result that `Executor` completes in place.
SHAPE_OTHER, SHAPE_OBJECT, SHAPE_OBJECTS, SHAPE_LEAF, SHAPE_LEAVES = range(5)


class DirectPlan(NamedTuple):
    """A synchronous resolver called directly, and the shape its result is completed in."""

    field_def: GraphQLField
    function: Callable[..., Any]
    info_name: str | None  # the resolver's `Info` parameter, if it has one
    field: StrawberryField
    info_class: type[Any]  # Strawberry's `Info`, its resolve info built on first use (`lazy_info`)
    is_async: bool  # its result is awaited, then completed as a synchronous one's
    non_null: bool
    shape: int
    # The object type of SHAPE_OBJECT/SHAPE_OBJECTS; the leaf's coercion of SHAPE_LEAF/SHAPE_LEAVES.
    object_type: GraphQLObjectType | None
    coerce: Callable[[Any], Any] | None
    item_type: GraphQLOutputType | None  # of a list, as its errors name it
    # Synchronous, without an `Info`, of an object or a list of objects: its usual results are
    # completed inline by `_execute_steps` (a page's model, tools and runs of each agent).
    inline: bool = False
    # The Python class of `object_type`'s objects: an object of exactly this class is neither
    # an exception nor awaitable (no checks needed).
    object_class: type[Any] | None = None


def direct_resolver(field_def: GraphQLField, info_class: type[Any]) -> DirectPlan | None:
    field = field_def.extensions.get(DEFINITION)
    if not isinstance(field, StrawberryField) or type(field).get_result is not (
        StrawberryField.get_result
    ):
        return None
    resolver = field.base_resolver
    if (
        resolver is None
        or field.extensions
        or field.arguments
        or field_def.args
        or resolver.root_parameter is not None
        or resolver.parent_parameter is not None
        or resolver.self_parameter is None
    ):
        return None
    info_parameter = resolver.info_parameter
    return_type = field_def.type
    non_null = isinstance(return_type, GraphQLNonNull)
    named = return_type.of_type if isinstance(return_type, GraphQLNonNull) else return_type
    shape, object_type, coerce, item_type = SHAPE_OTHER, None, None, None
    if isinstance(named, GraphQLList):
        item_type = named.of_type
        item = item_type.of_type if isinstance(item_type, GraphQLNonNull) else item_type
        if isinstance(item, GraphQLObjectType) and item.is_type_of is None:
            shape, object_type = SHAPE_OBJECTS, item
        elif isinstance(item, GraphQLScalarType | GraphQLEnumType):
            shape, coerce = SHAPE_LEAVES, item.coerce_output_value
    elif isinstance(named, GraphQLObjectType) and named.is_type_of is None:
        shape, object_type = SHAPE_OBJECT, named
    elif isinstance(named, GraphQLScalarType | GraphQLEnumType):
        shape, coerce = SHAPE_LEAF, named.coerce_output_value
    return DirectPlan(
        field_def=field_def,
        function=cast(Callable[..., Any], resolver.wrapped_func),
        info_name=None if info_parameter is None else info_parameter.name,
        field=field,
        info_class=info_class,
        is_async=field.is_async,
        non_null=non_null,
        shape=shape,
        object_type=object_type,
        coerce=coerce,
        item_type=item_type,
        inline=(
            info_parameter is None and not field.is_async and shape in (SHAPE_OBJECT, SHAPE_OBJECTS)
        ),
        object_class=_object_class(object_type),
    )


def _object_class(object_type: GraphQLObjectType | None) -> type[Any] | None:
    """The Strawberry type behind `object_type`, if it is one (else nothing matches it)."""
    definition = None if object_type is None else object_type.extensions.get(DEFINITION)
    origin = getattr(definition, "origin", None)
    return origin if isinstance(origin, type) else None


FieldPlan = LeafPlan | DirectPlan


# Where `streamline` leaves the plans: in the GraphQL schema's own `extensions`, by object type
# name, then field name.
FIELD_PLANS = "agent_engine.field_plans"

FieldPlans = dict[str, dict[str, FieldPlan]]


class FieldStep(NamedTuple):
    """One response key of a selection, as `Executor.execute_fields` takes it."""

    response_name: str
    field_details_list: Any
    plan: FieldPlan | None  # None: the standard path
    # An inline resolver's: the steps of its objects' selection once looked up (one item; steps
    # belong to one execution, and the field's object type is fixed), for the objects of every
    # source of the selection (a page's hundred agents' models).
    below: list[tuple[FieldStep, ...] | None]
