"""What the typed rows' `from_row` constructors take: a Core row, its mapping, or a plain dict
(the live bus's rows come from asyncpg as dicts); and `read_rows`, the fast way to read a whole
result into a typed row class."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from operator import itemgetter
from typing import Any, Protocol, TypeVar, cast

from sqlalchemy import Row, RowMapping

AnyRow = Row[Any] | RowMapping | Mapping[str, Any]
R = TypeVar("R")


class Rows(Protocol):
    """A result's column names and its rows (SQLAlchemy's `Result`, or `db.direct.Fetched`)."""

    def keys(self) -> Iterable[str]: ...

    def __iter__(self) -> Iterator[Sequence[Any]]: ...


def columns(row: AnyRow) -> RowMapping | Mapping[str, Any]:
    """The row's columns by name."""
    return row._mapping if isinstance(row, Row) else row


def read_rows(result: Rows, cls: type[R]) -> list[R]:
    """Every row of `result` as `cls`, a dataclass whose fields are named as the columns.

    The same objects as `cls.from_row` on each row's mapping (a test holds them equal for every
    class read this way), for a fraction of the CPU: where each field's column sits is found once
    per result, and each row is read by position, not by name.
    """
    keys = tuple(result.keys())
    if not keys:  # no rows fetched (`Fetched` learns its columns from its first row)
        return []
    pick = _picker(keys, cast(Hashable, cls))
    return [cls(*pick(row)) for row in result]


def read_keyed_rows(result: Rows, key: str, cls: type[R], *, same_by: str) -> list[tuple[Any, R]]:
    """As `read_rows`, each row paired with its column `key` (a column `cls` does not have).

    Rows with the same `same_by` column (the row's own id, in a join that repeats it per key)
    are one object, made once.
    """
    keys = tuple(result.keys())
    if not keys:
        return []
    pick = _picker(keys, cast(Hashable, cls))
    where, same = keys.index(key), keys.index(same_by)
    made: dict[Any, R] = {}
    pairs: list[tuple[Any, R]] = []
    for row in result:
        value = made.get(row[same])
        if value is None:
            value = made[row[same]] = cls(*pick(row))
        pairs.append((row[where], value))
    return pairs


@functools.lru_cache(maxsize=256)
def _picker(keys: tuple[str, ...], cls: Any) -> Callable[[Sequence[Any]], Iterable[Any]]:
    """A row's values in the order of `cls`'s fields; a field without a column gets its default."""
    positions: list[int] = []
    defaults: dict[int, Any] = {}
    for number, field in enumerate(dataclasses.fields(cls)):
        if field.name in keys:
            positions.append(keys.index(field.name))
        elif field.default is not dataclasses.MISSING:
            positions.append(-1)
            defaults[number] = field.default
        else:
            raise KeyError(f"{cls.__name__}.{field.name}: no such column in {keys}")
    if not defaults and len(positions) > 1:
        return itemgetter(*positions)

    def pick(row: Sequence[Any]) -> list[Any]:
        return [defaults[n] if p < 0 else row[p] for n, p in enumerate(positions)]

    return pick
