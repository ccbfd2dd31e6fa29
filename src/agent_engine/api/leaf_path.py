"""The executor's leaf path: a plain leaf field, read off its source and coerced in place.

A plain leaf — no resolver, no arguments, no field extensions, a scalar or enum type, not a list —
needs no response path, no resolve info and no resolver call chain (`api/execution.py` says when
it takes this path, and what happens when something is unusual).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from graphql import GraphQLEnumType, GraphQLField, GraphQLNonNull, GraphQLScalarType
from graphql.pyutils import Undefined
from strawberry.schema.schema_converter import GraphQLCoreConverter
from strawberry.types.field import StrawberryField

# The key under which Strawberry keeps a GraphQL field's StrawberryField.
DEFINITION = GraphQLCoreConverter.DEFINITION_BACKREF


class LeafPlan(NamedTuple):
    """How to read and coerce a plain leaf field in place."""

    attribute: str
    coerce: Callable[[Any], Any]
    non_null: bool


def plain_leaf(field_def: GraphQLField) -> LeafPlan | None:
    field = field_def.extensions.get(DEFINITION)
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
    return LeafPlan(field.python_name, named.coerce_output_value, non_null)


def coerced_output(coerce: Callable[[Any], Any], value: Any) -> Any:
    """A leaf value coerced for output; Undefined where the standard path must word the error."""
    if value is None or isinstance(value, Exception):
        return Undefined
    try:
        coerced = coerce(value)
    except Exception:
        return Undefined
    return Undefined if coerced is None else coerced
