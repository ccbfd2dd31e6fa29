"""Engine factory. One AsyncEngine per process, created by the entry point from Settings."""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from agent_engine.settings import Settings, to_asyncpg_url


def create_engine(settings: Settings, *, pool_size: int | None = None) -> AsyncEngine:
    return create_engine_for_url(
        settings.require_database_url(), pool_size=pool_size or settings.db_pool_size
    )


def create_engine_for_url(url: str, *, pool_size: int = 10) -> AsyncEngine:
    return create_async_engine(
        to_asyncpg_url(url),
        pool_size=pool_size,
        max_overflow=pool_size,
        pool_pre_ping=True,  # survive a database restart without restarting the process
        pool_recycle=1800,
    )
