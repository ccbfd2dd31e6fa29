"""Reads on autocommit connections, through the connection's asyncpg driver directly.

SQLAlchemy's statement layer costs about 100 µs of CPU per statement over asyncpg's own (its
execution context, result metadata and greenlet hop; bench/README, "CPU per unit of work"), and a
page of agents reads five kinds of rows. `fetch` sends the same `text()` statement, compiled once
to asyncpg's `$n` form, on the same pooled connection, and returns rows `read_rows` reads:

- Only on a connection in AUTOCOMMIT (the api's per-request read connection): inside a
  SQLAlchemy transaction the adapter begins lazily, so a statement beside it could land outside
  the transaction. Anywhere else `fetch` is `conn.execute`.
- The engine's `before_cursor_execute` listeners still see every statement (the statement-count
  tests and benchmark count them).
- Values are decoded by the same asyncpg codecs SQLAlchemy set up on the connection (JSON
  included); a test holds the rows equal to those read through SQLAlchemy.
- Errors are SQLAlchemy's: an asyncpg error is translated by the dialect's adapter and handed to
  the connection's own handler, which wraps it (`IntegrityError`, `DBAPIError` …) and invalidates
  the connection when it is a disconnect (`connection_invalidated`), as `conn.execute` would. The
  worker's claim and finish (`fetch_one`) retry on exactly that.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, NoReturn

from sqlalchemy import Connection, Row, TextClause
from sqlalchemy.ext.asyncio import AsyncConnection

# Per statement object (hashed by identity): its asyncpg SQL and its parameter names in `$n`
# order; gone with the statement.
_forms: weakref.WeakKeyDictionary[TextClause, tuple[str, tuple[str, ...]]] = (
    weakref.WeakKeyDictionary()
)


class Fetched:
    """Rows as `read_rows` takes them: the column names, then the rows (asyncpg records)."""

    def __init__(self, names: Sequence[str], rows: Sequence[Any]) -> None:
        self._names = tuple(names)
        self._rows = rows

    def keys(self) -> tuple[str, ...]:
        return self._names

    def __iter__(self) -> Iterator[Any]:
        return iter(self._rows)


async def fetch(conn: AsyncConnection, statement: TextClause, params: Mapping[str, Any]) -> Fetched:
    """`statement`'s rows, straight through asyncpg on an autocommit connection."""
    sync = conn.sync_connection
    if sync is None or sync.get_execution_options().get("isolation_level") != "AUTOCOMMIT":
        result = await conn.execute(statement, params)
        return Fetched(tuple(result.keys()), result.all())
    sql, names = _asyncpg_form(statement, conn)
    args = [params[name] for name in names]
    sync.dispatch.before_cursor_execute(sync, None, sql, args, None, False)
    # A live connection's DBAPI connection is at hand; `get_raw_connection` would fetch it
    # through a greenlet (~30 µs) in case it must reconnect, which only a closed or invalidated
    # connection needs.
    raw = (
        sync.connection
        if not (sync.closed or sync.invalidated)
        else await conn.get_raw_connection()
    )
    driver: Any = raw.driver_connection
    try:
        rows = await driver.fetch(sql, *args)
    except BaseException as error:
        _raise_as_sqlalchemy(sync, raw, error, sql, args)
    return Fetched(tuple(rows[0].keys()) if rows else (), rows)


async def fetch_one(
    conn: AsyncConnection, statement: TextClause, params: Mapping[str, Any]
) -> Row[Any] | Record | None:
    """`statement`'s first row (read by attribute, as a `Row`), or None; as `fetch`."""
    rows = await fetch(conn, statement, params)
    for row in rows:
        return row if isinstance(row, Row) else Record(row)
    return None


class Record:
    """An asyncpg record read by attribute, as a SQLAlchemy `Row` is (`row.state`)."""

    __slots__ = ("_record",)

    def __init__(self, record: Mapping[str, Any]) -> None:
        self._record = record

    def __getattr__(self, name: str) -> Any:
        try:
            return self._record[name]
        except KeyError:
            raise AttributeError(name) from None

    @property
    def _mapping(self) -> Mapping[str, Any]:
        return self._record


def _raise_as_sqlalchemy(
    sync: Connection, raw: Any, error: BaseException, sql: str, args: Sequence[Any]
) -> NoReturn:
    """Raise `error` as `conn.execute` would have: translated by the dialect's adapter, then
    through the connection's handler (wrapping, invalidation on a disconnect, the events)."""
    translated = error
    if isinstance(error, Exception):
        try:
            raw.dbapi_connection._handle_exception(error)
        except Exception as adapted:  # the adapter always raises
            translated = adapted
    sync._handle_dbapi_exception(translated, sql, tuple(args), None, None)


def _asyncpg_form(statement: TextClause, conn: AsyncConnection) -> tuple[str, tuple[str, ...]]:
    form = _forms.get(statement)
    if form is None:
        compiled = statement.compile(dialect=conn.dialect)
        form = _forms[statement] = (str(compiled), tuple(compiled.positiontup or ()))
    return form
