"""The bus's PostgreSQL side: the one LISTEN connection of the api process and what it reads.

`PostgresSource` keeps a `db/listen.py` `Listener` on the bus's channels and hands every
notification to `LiveBus.notify`; after a reconnect the step readers read again (what changed
while the connection was away is covered: their reads are "everything since", not the NOTIFY's
payload). Run events committed while it was away are not replayed: that stream is live, and a
client re-queries the journal after reconnecting.

`PostgresStore` reads: a burst of runs on its own asyncpg connection (one statement per burst),
a run's steps through the process's pool (readers of different runs read side by side).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from functools import partial
from typing import Any

import asyncpg
from sqlalchemy.ext.asyncio import AsyncEngine

from agent_engine.api.live.bus import LiveBus
from agent_engine.db.listen import Listener
from agent_engine.db.run_events import load_runs, steps_since
from agent_engine.settings import to_libpq_url


class PostgresStore:
    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine
        self._dsn = to_libpq_url(engine.url.render_as_string(hide_password=False))
        self._loader: asyncpg.Connection | None = None

    async def load_runs(self, run_ids: Sequence[int]) -> dict[int, dict[str, Any]]:
        for attempt in range(2):
            try:
                if self._loader is None or self._loader.is_closed():
                    self._loader = await asyncpg.connect(self._dsn)
                return await load_runs(self._loader, run_ids)
            except (OSError, asyncpg.PostgresConnectionError, asyncpg.InterfaceError):
                await self.close()
                if attempt:
                    raise
        return {}

    async def steps_since(self, run_id: int, from_index: int) -> list[dict[str, Any]]:
        async with self._engine.connect() as conn:
            return await steps_since(conn, run_id, from_index=from_index)

    async def close(self) -> None:
        if self._loader is not None:
            with contextlib.suppress(Exception):
                await self._loader.close(timeout=1)
            self._loader = None


class PostgresSource:
    """The LISTEN connection feeding `bus` (one per api process)."""

    def __init__(self, bus: LiveBus, engine: AsyncEngine) -> None:
        self._bus = bus
        dsn = to_libpq_url(engine.url.render_as_string(hide_password=False))
        channels = {channel: partial(self._heard, channel) for channel in bus.channels}
        self._listener = Listener(dsn, channels, name="live updates", on_reconnect=bus.caught_up)
        self._task: asyncio.Task[None] | None = None

    def _heard(self, channel: str, _conn: object, _pid: int, _channel: str, payload: str) -> None:
        self._bus.notify(channel, payload)

    def start(self) -> None:
        self._task = asyncio.create_task(self._listener.run(), name="live-listen")

    async def wait_listening(self) -> None:
        await self._listener.listening.wait()

    @property
    def listening(self) -> bool:
        return self._listener.listening.is_set()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None
