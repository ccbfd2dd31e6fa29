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


def read_rows(result: Rows, cls: type[R], *, partial: bool = False) -> list[R]:
    """Every row of `result` as `cls`, a dataclass whose fields are named as the columns.

    The same objects as `cls.from_row` on each row's mapping (a test holds them equal for every
    class read this way), for a fraction of the CPU: where each field's column sits is found once
    per result, and each row is read by position, not by name.

    `partial`: a narrow read, of a frozen dataclass with slots. A field without a column is left
    unset, not defaulted: reading it raises AttributeError, so code that needs a column the read
    left out fails loudly instead of seeing a default. (Such a row has no `==` or `repr`.)
    """
    keys = tuple(result.keys())
    if not keys:  # no rows fetched (`Fetched` learns its columns from its first row)
        return []
    read = _reader(keys, cast(Hashable, cls), partial)
    return [read(row) for row in result]


def narrow(cls: Any, columns: Iterable[str], *, always: Iterable[str]) -> tuple[str, ...] | None:
    """The columns of a narrow read of `cls`'s table: `columns` and `always`, in `cls`'s order
    (one statement per set, whatever order they were asked in); None when that is every column
    (a whole row). A name that is not a field of `cls` is refused: these go into SQL text."""
    names = tuple(field.name for field in dataclasses.fields(cls))
    wanted = set(columns)
    unknown = wanted.difference(names)
    if unknown:
        raise ValueError(f"{cls.__name__} has no columns {sorted(unknown)}")
    wanted.update(always)
    chosen = tuple(name for name in names if name in wanted)
    return None if len(chosen) == len(names) else chosen


def read_keyed_rows(result: Rows, key: str, cls: type[R], *, same_by: str) -> list[tuple[Any, R]]:
    """As `read_rows`, each row paired with its column `key` (a column `cls` does not have).

    Rows with the same `same_by` column (the row's own id, in a join that repeats it per key)
    are one object, made once.
    """
    keys = tuple(result.keys())
    if not keys:
        return []
    read = _reader(keys, cast(Hashable, cls))
    where, same = keys.index(key), keys.index(same_by)
    made: dict[Any, R] = {}
    pairs: list[tuple[Any, R]] = []
    for row in result:
        value = made.get(row[same])
        if value is None:
            value = made[row[same]] = read(row)
        pairs.append((row[where], value))
    return pairs


@functools.lru_cache(maxsize=256)
def _reader(
    keys: tuple[str, ...], cls: Any, partial: bool = False
) -> Callable[[Sequence[Any]], Any]:
    """A row of columns `keys` read as `cls`.

    A frozen dataclass's `__init__` sets each field through `object.__setattr__`, which costs
    ~2.7 µs for a run's 17 fields against ~0.2 µs for plain assignments. For a frozen dataclass
    with slots and no `__post_init__` (the typed rows), the reader is made once per class and
    column order, as `dataclasses` makes `__init__`: generated source that sets each slot through
    its descriptor, reading the row by position — the same object for a third of the CPU (a test
    holds it equal to `from_row`'s). Any other class is called with the picked values.
    """
    params = getattr(cls, "__dataclass_params__", None)
    if (
        params is None
        or not params.frozen
        or "__slots__" not in cls.__dict__
        or hasattr(cls, "__post_init__")
    ):
        if partial:
            raise TypeError(f"{cls.__name__}: a partial read needs a frozen dataclass with slots")
        pick = _picker(keys, cls)
        return lambda row: cls(*pick(row))
    namespace: dict[str, Any] = {"new": object.__new__, "cls": cls}
    lines = ["def read(row):", " self = new(cls)"]
    for number, field in enumerate(dataclasses.fields(cls)):
        namespace[f"set_{number}"] = cls.__dict__[field.name].__set__
        if field.name in keys:
            value = f"row[{keys.index(field.name)}]"
        elif partial:
            continue
        else:
            value = f"default_{number}"
            namespace[value] = _default(cls, field, keys)
        lines.append(f" set_{number}(self, {value})")
    lines.append(" return self")
    exec("\n".join(lines), namespace)  # source made here: field numbers only
    return cast(Callable[[Sequence[Any]], Any], namespace["read"])


@functools.lru_cache(maxsize=256)
def _picker(keys: tuple[str, ...], cls: Any) -> Callable[[Sequence[Any]], Iterable[Any]]:
    """A row's values in the order of `cls`'s fields; a field without a column gets its default."""
    positions: list[int] = []
    defaults: dict[int, Any] = {}
    for number, field in enumerate(dataclasses.fields(cls)):
        if field.name in keys:
            positions.append(keys.index(field.name))
        else:
            positions.append(-1)
            defaults[number] = _default(cls, field, keys)
    if not defaults and len(positions) > 1:
        return itemgetter(*positions)

    def pick(row: Sequence[Any]) -> list[Any]:
        return [defaults[n] if p < 0 else row[p] for n, p in enumerate(positions)]

    return pick


def _default(cls: Any, field: dataclasses.Field[Any], keys: tuple[str, ...]) -> Any:
    """A field's value where the result has no column for it: its default, else an error."""
    if field.default is dataclasses.MISSING:
        raise KeyError(f"{cls.__name__}.{field.name}: no such column in {keys}")
    return field.default
