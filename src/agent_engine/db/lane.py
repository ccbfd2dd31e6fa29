"""Autocommit connections a worker keeps for its one-statement writes (claim, finish, heartbeat,
the budget-alert sum).

Each of a run's statements used to check a connection out of the pool, switch it to autocommit
and check it back in: ~0.15 ms of the worker's CPU per statement, about as much as the statement
itself, three times a run (bench/README, "CPU per unit of work"). A lane keeps up to `size`
connections checked out and in autocommit, handing each to one statement at a time. The claim
and the finish are sent through asyncpg directly on them (`db/direct.py`), their errors raised
as SQLAlchemy raises them (its exceptions, its invalidation of a dead connection).

A connection that saw an exception (or a cancellation) is not kept: it goes back to the pool,
which resets it (or drops it when it is dead), as it did after every statement before. A worker
opens its lane when its engine is made and closes it before disposing of the engine
(`workers/context.py`); anywhere else — the api, a test calling a function of `runs/` with an
engine of its own — `autocommit` checks a connection out of the pool as before.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

# Connections a lane keeps unless told (a worker's is as large as its pool size: half of the
# connections its engine keeps open). With four, the full stampede (1,000 runs in flight, and a
# claim's and an alert's budget sum over a week of 10,000 runs) queued on the lane: 89 s against
# 82 s without it, and more CPU per run.
LANE_SIZE = 4


class AutocommitLane:
    def __init__(self, engine: AsyncEngine, *, size: int = LANE_SIZE) -> None:
        self.engine = engine
        self._size = size
        self._idle: deque[AsyncConnection] = deque()
        self._opened = 0  # connections out of the pool for this lane, idle or in use
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._closed = False

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[AsyncConnection]:
        conn = await self._take()
        try:
            yield conn
        except BaseException:
            await self._discard(conn)
            raise
        if conn.closed or conn.invalidated or self._closed:
            await self._discard(conn)
        else:
            self._idle.append(conn)
            self._wake()

    async def close(self) -> None:
        """Return every idle connection to the pool; one in use goes back when its statement
        ends."""
        self._closed = True
        while self._idle:
            await self._discard(self._idle.popleft())
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)

    async def _take(self) -> AsyncConnection:
        while True:
            if self._idle:
                return self._idle.pop()  # the most recent: its socket is the warmest
            if self._closed or self._opened < self._size:
                return await self._open()
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            finally:
                if waiter in self._waiters:
                    self._waiters.remove(waiter)

    async def _open(self) -> AsyncConnection:
        self._opened += 1
        try:
            conn = await self.engine.connect()
            return await conn.execution_options(isolation_level="AUTOCOMMIT")
        except BaseException:
            self._opened -= 1
            self._wake()
            raise

    async def _discard(self, conn: AsyncConnection) -> None:
        self._opened -= 1
        self._wake()
        with contextlib.suppress(Exception):
            await conn.close()

    def _wake(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return


# The lane of each engine that has one (a worker's), by engine.
_lanes: dict[AsyncEngine, AutocommitLane] = {}


def open_lane(engine: AsyncEngine, *, size: int = LANE_SIZE) -> AutocommitLane:
    """Keep autocommit connections of `engine` for `autocommit` (until `close_lane`)."""
    lane = _lanes.get(engine)
    if lane is None:
        lane = _lanes[engine] = AutocommitLane(engine, size=size)
    return lane


async def close_lane(engine: AsyncEngine) -> None:
    lane = _lanes.pop(engine, None)
    if lane is not None:
        await lane.close()


@contextlib.asynccontextmanager
async def autocommit(engine: AsyncEngine) -> AsyncIterator[AsyncConnection]:
    """A connection of `engine` in autocommit for one statement (or a few in a row): from the
    engine's lane when it has one, else checked out of the pool for the block."""
    lane = _lanes.get(engine)
    if lane is not None:
        async with lane.connection() as conn:
            yield conn
        return
    async with engine.connect() as conn:
        yield await conn.execution_options(isolation_level="AUTOCOMMIT")
