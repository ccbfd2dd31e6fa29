"""A LISTEN connection that comes back.

`Listener.run()` connects with asyncpg, LISTENs on its channels and keeps the connection until it
is lost (a termination, or a probe that fails: a half-open socket does not always report its end),
then reconnects after a growing delay. Notifications sent while it was away are not replayed:
`on_reconnect` is where a user catches up (re-reads what it watches).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Mapping

import asyncpg
import structlog

log = structlog.get_logger(__name__)

# asyncpg's listener callback: (connection, server pid, channel, payload).
Notify = Callable[[asyncpg.Connection, int, str, str], None]

RECONNECT_DELAY_SECONDS = (0.2, 0.5, 1.0, 2.0, 5.0)
# How often the listening connection is probed when it reports nothing.
PROBE_SECONDS = 5.0
_PROBE = "SELECT 1"


class Listener:
    """One LISTEN connection on `channels` (read again at each connect), kept up until cancelled.

    `listening` is set while the connection is up.
    """

    def __init__(
        self,
        dsn: str,
        channels: Mapping[str, Notify],
        *,
        name: str,
        on_reconnect: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self._dsn = dsn
        self._channels = channels
        self._name = name
        self._on_reconnect = on_reconnect
        self.listening = asyncio.Event()

    async def run(self) -> None:
        attempt = 0
        while True:
            lost = asyncio.Event()
            conn: asyncpg.Connection | None = None
            try:
                conn = await asyncpg.connect(self._dsn)
                conn.add_termination_listener(lambda _conn, lost=lost: lost.set())
                for channel, notify in self._channels.items():
                    await conn.add_listener(channel, notify)
                self.listening.set()
                if attempt:
                    log.info("listener reconnected", listener=self._name, attempts=attempt)
                    if self._on_reconnect is not None:
                        await self._on_reconnect()
                attempt = 0
                while not lost.is_set():
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(lost.wait(), PROBE_SECONDS)
                    if not lost.is_set():
                        await asyncio.wait_for(conn.execute(_PROBE), PROBE_SECONDS)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("listener lost the database", listener=self._name, error=str(exc))
            finally:
                self.listening.clear()
                if conn is not None:
                    with contextlib.suppress(Exception):
                        await conn.close(timeout=1)
            await asyncio.sleep(
                RECONNECT_DELAY_SECONDS[min(attempt, len(RECONNECT_DELAY_SECONDS) - 1)]
            )
            attempt += 1
