"""Custom scalars of the contract beyond Strawberry's own (DateTime, JSON).

`Decimal`: money and prices as decimal text ("0.0042"); never a float. Input is taken as text and
checked by the mutation that uses it, so a malformed value is a BAD_USER_INPUT naming the field
(a scalar's own parse error could not say which field). A number literal is accepted as its exact
source text (`1.5`), a JSON number in variables as its shortest text.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any, NewType

import strawberry
from graphql import FloatValueNode, IntValueNode, StringValueNode, ValueNode
from strawberry.types.scalar import ScalarDefinition

from agent_engine.domain.money import format_decimal

DecimalText = NewType("DecimalText", str)

DECIMAL_DESCRIPTION = 'A decimal number as a string, e.g. "0.0042" (money is never a float).'


def decimal_text(value: Decimal) -> DecimalText:
    """An exact decimal as the API shows it: "0.0000285", never with an exponent."""
    return DecimalText(format_decimal(value))


def _serialize(value: Any) -> str:
    if isinstance(value, Decimal):
        return format_decimal(value)
    return str(value)


def _parse_value(value: Any) -> DecimalText:
    if isinstance(value, str):
        return DecimalText(value)
    if isinstance(value, int | float) and not isinstance(value, bool):
        return DecimalText(repr(value))
    raise ValueError('a Decimal is a string such as "0.0042"')


def _parse_literal(node: ValueNode, variables: dict[str, Any] | None = None) -> DecimalText:
    if isinstance(node, StringValueNode | IntValueNode | FloatValueNode):
        return DecimalText(node.value)
    raise ValueError('a Decimal is a string such as "0.0042"')


SCALAR_MAP: dict[object, ScalarDefinition] = {
    DecimalText: strawberry.scalar(
        name="Decimal",
        description=DECIMAL_DESCRIPTION,
        serialize=_serialize,
        parse_value=_parse_value,
        parse_literal=_parse_literal,
    )
}


def decimal_text_or_none(value: Decimal | None) -> DecimalText | None:
    return decimal_text(value) if value is not None else None
