"""Engine factory. One AsyncEngine per process, created by the entry point from Settings."""

from __future__ import annotations

from typing import Any

from sqlalchemy import event, text
from sqlalchemy.exc import DisconnectionError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from agent_engine.settings import Settings, to_asyncpg_url

PING = text("SELECT 1")


def create_engine(
    settings: Settings,
    *,
    pool_size: int | None = None,
    pre_ping: bool = False,
    keep_connections: bool = False,
    lifo: bool = False,
) -> AsyncEngine:
    """The process's engine. Without `pre_ping` (the workers' default) a connection that died
    with a database restart fails its first statement; SQLAlchemy then invalidates the whole
    pool and the caller retries (Dramatiq retries the actor, ticks repeat). The api, which
    answers clients directly, passes `pre_ping=True`.

    A pool has `pool_size` connections plus as many overflow ones, which SQLAlchemy closes when
    they come back while the pool is full. `keep_connections` (the api) keeps all of them open
    instead: under a burst of concurrent requests the overflow was opened and closed again for
    nearly every request (a new PostgreSQL session each time); the ceiling stays the same.

    `lifo` (the api) hands out the connection used last: at low load a request's statements go
    to a backend that just ran, not the one idle longest (4 same-moment pairs of 300 single pages
    after a 32-client burst: p50 ÷ raw 1.36 against 1.42 in turn; bench/README).
    """
    size = pool_size or settings.db_pool_size
    return create_engine_for_url(
        settings.require_database_url(),
        pool_size=2 * size if keep_connections else size,
        max_overflow=0 if keep_connections else size,
        pre_ping=pre_ping,
        lifo=lifo,
    )


def create_engine_for_url(
    url: str,
    *,
    pool_size: int = 10,
    pre_ping: bool = True,
    max_overflow: int | None = None,
    lifo: bool = False,
) -> AsyncEngine:
    engine = create_async_engine(
        to_asyncpg_url(url),
        pool_size=pool_size,
        max_overflow=pool_size if max_overflow is None else max_overflow,
        pool_recycle=1800,
        pool_use_lifo=lifo,
    )
    if pre_ping:
        # Survives a database restart without an error. Not SQLAlchemy's pool_pre_ping: the
        # asyncpg dialect's ping is three round trips (BEGIN, `;`, ROLLBACK) on every checkout,
        # a third of a small request's round trips.
        event.listen(engine.sync_engine.pool, "checkout", _replace_closed_connection)
    return engine


def _replace_closed_connection(dbapi_connection: Any, _record: Any, _proxy: Any) -> None:
    """A pooled connection whose socket the server closed (a restart, a terminated backend) is
    replaced before use, without a round trip: asyncpg marks it closed as soon as the event loop
    reads the end of its socket. (A silently dead peer is not noticed here; its first statement
    fails and SQLAlchemy invalidates the pool.)"""
    if dbapi_connection.driver_connection.is_closed():
        raise DisconnectionError("the database closed this pooled connection")


async def ping(conn: AsyncConnection) -> None:
    """One round trip: raises when the database does not answer."""
    await conn.execute(PING)
