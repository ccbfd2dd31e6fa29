"""What the typed rows' `from_row` constructors take: a Core row, its mapping, or a plain dict
(the live bus's rows come from asyncpg as dicts)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import Row, RowMapping

AnyRow = Row[Any] | RowMapping | Mapping[str, Any]


def columns(row: AnyRow) -> RowMapping | Mapping[str, Any]:
    """The row's columns by name."""
    return row._mapping if isinstance(row, Row) else row
