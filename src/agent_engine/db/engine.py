"""Engine factory. One AsyncEngine per process, created by the entry point from Settings."""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from agent_engine.settings import Settings, to_asyncpg_url


def create_engine(
    settings: Settings, *, pool_size: int | None = None, pre_ping: bool = False
) -> AsyncEngine:
    """The process's engine. Without `pre_ping` (the workers' default) a connection that died
    with a database restart fails its first statement; SQLAlchemy then invalidates the whole
    pool and the caller retries (Dramatiq retries the actor, ticks repeat). The api, which
    answers clients directly, passes `pre_ping=True`."""
    return create_engine_for_url(
        settings.require_database_url(),
        pool_size=pool_size or settings.db_pool_size,
        pre_ping=pre_ping,
    )


def create_engine_for_url(url: str, *, pool_size: int = 10, pre_ping: bool = True) -> AsyncEngine:
    return create_async_engine(
        to_asyncpg_url(url),
        pool_size=pool_size,
        max_overflow=pool_size,
        # Survives a database restart without an error, at a price: the asyncpg dialect's ping
        # is three round trips (BEGIN, `;`, ROLLBACK) on every checkout.
        pool_pre_ping=pre_ping,
        pool_recycle=1800,
    )
