"""A worker's autocommit lane: kept connections, one statement at a time each, a failed one given
back to the pool, all given back when the lane closes."""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine

from agent_engine.db.lane import autocommit, close_lane, open_lane

PID = text("SELECT pg_backend_pid()")


async def _pid(engine: AsyncEngine, *, sleep: float = 0.0) -> int:
    async with autocommit(engine) as conn:
        if sleep:
            await conn.execute(text("SELECT pg_sleep(:s)"), {"s": sleep})
        return int((await conn.execute(PID)).scalar_one())


async def test_statements_share_the_kept_connections_in_autocommit(engine: AsyncEngine) -> None:
    open_lane(engine, size=2)
    try:
        pids = {await _pid(engine) for _ in range(20)}
        assert len(pids) == 1  # one at a time: the same warm connection each time
        at_once = await asyncio.gather(*(_pid(engine, sleep=0.05) for _ in range(6)))
        assert len(set(at_once)) == 2  # never more than the lane's size
        async with autocommit(engine) as conn:
            await conn.execute(text("CREATE TEMP TABLE lane_probe (n int)"))
            await conn.execute(text("INSERT INTO lane_probe VALUES (1)"))
            # Autocommit: no transaction is open on the connection between statements.
            raw = await conn.get_raw_connection()
            assert not raw.driver_connection.is_in_transaction()
        assert engine.pool.checkedout() == 2  # type: ignore[attr-defined]
    finally:
        await close_lane(engine)
    assert engine.pool.checkedout() == 0  # type: ignore[attr-defined]


async def test_a_connection_that_saw_an_error_goes_back_to_the_pool(engine: AsyncEngine) -> None:
    open_lane(engine, size=1)
    try:
        assert await _pid(engine) > 0
        assert engine.pool.checkedout() == 1  # type: ignore[attr-defined]
        with pytest.raises(DBAPIError):
            async with autocommit(engine) as conn:
                await conn.execute(text("SELECT 1 / 0"))
        # Not kept: the pool resets it (or drops it, when dead) as it did every statement's.
        assert engine.pool.checkedout() == 0  # type: ignore[attr-defined]
        assert await _pid(engine) > 0  # the lane opens another
        assert engine.pool.checkedout() == 1  # type: ignore[attr-defined]
    finally:
        await close_lane(engine)


async def test_a_cancelled_statement_closes_its_connection_and_frees_its_place(
    engine: AsyncEngine,
) -> None:
    open_lane(engine, size=1)
    try:
        stuck = asyncio.create_task(_pid(engine, sleep=5))
        await asyncio.sleep(0.2)
        waiting = asyncio.create_task(_pid(engine))  # the lane is full: it waits
        await asyncio.sleep(0.1)
        assert not waiting.done()
        stuck.cancel()
        with pytest.raises(asyncio.CancelledError):
            await stuck
        assert await asyncio.wait_for(waiting, 10) > 0
    finally:
        await close_lane(engine)
    assert engine.pool.checkedout() == 0  # type: ignore[attr-defined]


async def test_without_a_lane_each_block_checks_a_connection_out_of_the_pool(
    engine: AsyncEngine,
) -> None:
    async with autocommit(engine) as conn:
        assert engine.pool.checkedout() == 1  # type: ignore[attr-defined]
        raw = await conn.get_raw_connection()
        assert not raw.driver_connection.is_in_transaction()
    assert engine.pool.checkedout() == 0  # type: ignore[attr-defined]
