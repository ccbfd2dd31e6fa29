"""The api's engine replaces pooled connections the server closed, without a round trip."""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from agent_engine.db.engine import create_engine_for_url

# Long enough for the event loop to read the end of a terminated backend's socket.
SETTLE_SECONDS = 0.5


@pytest.mark.parametrize("pre_ping", [True, False])
async def test_a_pooled_connection_the_server_closed(database_url: str, pre_ping: bool) -> None:
    engine = create_engine_for_url(database_url, pool_size=1, pre_ping=pre_ping)
    try:
        async with engine.connect() as conn:
            pid = await conn.scalar(text("SELECT pg_backend_pid()"))
        killer = create_engine_for_url(database_url, pool_size=1)
        async with killer.connect() as other:
            await other.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
        await killer.dispose()
        await asyncio.sleep(SETTLE_SECONDS)
        if pre_ping:  # the closed connection is replaced: the caller sees nothing
            async with engine.connect() as conn:
                assert await conn.scalar(text("SELECT 1")) == 1
        else:  # without the check its first statement fails
            with pytest.raises(DBAPIError):
                async with engine.connect() as conn:
                    await conn.scalar(text("SELECT 1"))
    finally:
        await engine.dispose()
