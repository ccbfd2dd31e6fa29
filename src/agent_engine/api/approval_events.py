"""Approvals as they are requested, decided, expire or are cancelled: the `toolApprovals`
subscription.

Every write to `tool_approvals` NOTIFYs `tool_approval_events` with the approval's id and owner
(`db/approvals.py`, in the writing transaction, so at commit). The api process's RunEventHub hears
the channel on its one LISTEN connection; this feed offers each event to the subscribers allowed
to see it (the owner's own, every admin's), which read the row once and send it -- inputs only to
the owner (the type's resolver). Bounded queues like every subscription; live, not replayed: a
client that reconnects re-queries `toolApprovals`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from agent_engine.api.events import RunEventHub
from agent_engine.api.subscribers import BoundedSubscriber
from agent_engine.db.approvals import CHANNEL
from agent_engine.observability.metrics import ACTIVE_SUBSCRIPTIONS


@dataclass(frozen=True)
class ApprovalEvent:
    id: int
    owner_id: int


class ApprovalSubscriber(BoundedSubscriber[ApprovalEvent]):
    lag_message = "subscriber fell behind; re-query toolApprovals"

    def __init__(
        self,
        owner_id: int | None,  # None: an admin, hears every owner's approvals
        queue: asyncio.Queue[ApprovalEvent | Exception],
        feed: ApprovalFeed,
    ) -> None:
        super().__init__(queue)
        self.owner_id = owner_id
        self._feed = feed

    def approvals(self) -> AsyncIterator[ApprovalEvent]:
        return self.events()

    def forget(self) -> None:
        self._feed._remove(self)


class ApprovalFeed:
    def __init__(self, *, queue_size: int = 256) -> None:
        self._queue_size = queue_size
        self._subscribers: set[ApprovalSubscriber] = set()

    def attach(self, hub: RunEventHub) -> None:
        hub.add_channel(CHANNEL, self.publish)

    def subscribe(self, *, owner_id: int | None) -> ApprovalSubscriber:
        subscriber = ApprovalSubscriber(owner_id, asyncio.Queue(self._queue_size), self)
        self._subscribers.add(subscriber)
        ACTIVE_SUBSCRIPTIONS.inc()
        return subscriber

    @property
    def subscriber_count(self) -> int:
        return len(self._subscribers)

    def publish(self, payload: dict[str, Any]) -> None:
        event = ApprovalEvent(id=int(payload["id"]), owner_id=int(payload["owner_id"]))
        for subscriber in list(self._subscribers):
            if subscriber.owner_id is None or subscriber.owner_id == event.owner_id:
                subscriber.offer(event)

    def close(self) -> None:
        for subscriber in list(self._subscribers):
            subscriber.close()

    def _remove(self, subscriber: ApprovalSubscriber) -> None:
        if subscriber in self._subscribers:
            self._subscribers.discard(subscriber)
            ACTIVE_SUBSCRIPTIONS.dec()
