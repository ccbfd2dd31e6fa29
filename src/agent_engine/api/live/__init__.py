"""Live updates: the path from a NOTIFY to a socket, one system for every subscription.

    PostgreSQL trigger --NOTIFY--> PostgresSource (postgres.py, the one LISTEN of db/listen.py)
      --> LiveBus (bus.py): topic `runs` (a burst loaded once), `alerts` (no read), `approvals`
          (ids: the feed reads the row), `steps`
          (one StepReader per watched run: one read per change) -- AudienceIndex (audience.py)
          picks the subscriptions that may see the event, each a BoundedQueue (queue.py)
      --> a group's Subscription (groups.py): executed once per event and (document, variables,
          audience), serialised once
      --> each member's BoundedQueue of texts --> SharedStream (stream.py) writes the frame to
          its socket (socket.py) behind the operation's own id.

Every subscription field is a `Feed` (feeds.py) on the bus: `runEvents`, `budget`,
`budgetAlerts`, `toolApprovals`, `runSteps` (which also replays what happened before it
joined). One overflow
rule: a queue that would exceed its bound ends with SUBSCRIBER_TOO_SLOW (queue.py).

Adding a feed (as `toolApprovals` was): (1) a `Topic` (`events.py`) and a channel decoder in
`bus.py` that turns the NOTIFY payload into an event with an `owner_id` (publish it with
`LiveBus.publish`, or load rows first as `runs` does); (2) in `api/subscriptions.py` a
`Feed(key, open, payload)` whose `open` is `live.bus.subscribe(Topic.X, owner_id=…)`, and a
resolver that checks the viewer and returns `shared_stream(info, feed, live.broadcaster)`.

`LiveUpdates` is what the api process holds (in its lifespan `State`): the bus, its source and
the groups.
"""

from __future__ import annotations

import asyncio
import logging

from sqlalchemy.ext.asyncio import AsyncEngine

from agent_engine.api.live.audience import AudienceIndex
from agent_engine.api.live.bus import (
    ApprovalChange,
    BusListener,
    LiveBus,
    RunChange,
    StepEvent,
    Store,
    Topic,
)
from agent_engine.api.live.feeds import NO_USER_ID, SKIP, Audience, Feed
from agent_engine.api.live.groups import Broadcaster
from agent_engine.api.live.postgres import PostgresSource, PostgresStore
from agent_engine.api.live.queue import (
    LAG_MESSAGE,
    SUBSCRIBER_TOO_SLOW,
    BoundedQueue,
    SubscriberTooSlow,
)
from agent_engine.api.live.socket import GroupedTransportWSHandler, SocketOperation
from agent_engine.api.live.stream import SharedStream, shared_stream

logger = logging.getLogger(__name__)


class LiveUpdates:
    """The api process's live path: one bus, its LISTEN source, the subscription groups."""

    def __init__(self, engine: AsyncEngine, *, queue_size: int) -> None:
        self.engine = engine
        self.bus = LiveBus(PostgresStore(engine), queue_size=queue_size)
        self.source = PostgresSource(self.bus, engine)
        self.broadcaster = Broadcaster(queue_size=queue_size)

    async def start(self, *, listen_timeout: float) -> None:
        self.bus.start()
        self.source.start()
        try:
            async with asyncio.timeout(listen_timeout):
                await self.source.wait_listening()
        except TimeoutError:
            logger.warning("live updates: not listening yet; subscriptions wait for it")

    async def stop(self) -> None:
        await self.broadcaster.stop()
        await self.source.stop()
        await self.bus.stop()

    @property
    def listening(self) -> bool:
        return self.source.listening

    @property
    def subscriber_count(self) -> int:
        """Open subscriptions of this process: in groups, or fed by the bus directly."""
        return self.broadcaster.member_count + self.bus.subscriber_count


__all__ = [
    "LAG_MESSAGE",
    "NO_USER_ID",
    "SKIP",
    "SUBSCRIBER_TOO_SLOW",
    "ApprovalChange",
    "Audience",
    "AudienceIndex",
    "BoundedQueue",
    "Broadcaster",
    "BusListener",
    "Feed",
    "GroupedTransportWSHandler",
    "LiveBus",
    "LiveUpdates",
    "RunChange",
    "SharedStream",
    "SocketOperation",
    "StepEvent",
    "Store",
    "SubscriberTooSlow",
    "Topic",
    "shared_stream",
]
