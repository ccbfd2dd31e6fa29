"""Budget alerts as they are recorded, for the `budgetAlerts` subscription.

The `budget_alerts` insert trigger NOTIFYs `budget_alert_events` with the whole (small) row; the
process's RunEventHub hears that channel on its one LISTEN connection and hands each payload to
this feed, which offers it to the subscribers allowed to see it: the owner's own, and every
admin's. No database read per event. Queues are bounded like the run events' (`api/subscribers.py`);
the stream is live, not replayed: a client that reconnects re-queries `viewer.budgetAlerts` /
`adminBudgetAlerts`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import datetime
from typing import Any

from agent_engine.api.events import RunEventHub
from agent_engine.api.subscribers import BoundedSubscriber
from agent_engine.db.alerts import BudgetAlert
from agent_engine.observability.metrics import ACTIVE_SUBSCRIPTIONS

CHANNEL = "budget_alert_events"


class AlertSubscriber(BoundedSubscriber[BudgetAlert]):
    lag_message = "subscriber fell behind; re-query the alerts"

    def __init__(
        self,
        owner_id: int | None,  # None: an admin, sees every owner's alerts
        queue: asyncio.Queue[BudgetAlert | Exception],
        feed: BudgetAlertFeed | None = None,
    ) -> None:
        super().__init__(queue)
        self.owner_id = owner_id
        self._feed = feed

    def alerts(self) -> AsyncIterator[BudgetAlert]:
        return self.events()

    def forget(self) -> None:
        if self._feed is not None:
            self._feed._remove(self)


class BudgetAlertFeed:
    def __init__(self, *, queue_size: int = 256) -> None:
        self._queue_size = queue_size
        self._by_owner: dict[int, set[AlertSubscriber]] = {}
        self._admins: set[AlertSubscriber] = set()

    def attach(self, hub: RunEventHub) -> None:
        hub.add_channel(CHANNEL, self.publish)

    def subscribe(self, *, owner_id: int | None) -> AlertSubscriber:
        subscriber = AlertSubscriber(owner_id, asyncio.Queue(self._queue_size), self)
        if owner_id is None:
            self._admins.add(subscriber)
        else:
            self._by_owner.setdefault(owner_id, set()).add(subscriber)
        ACTIVE_SUBSCRIPTIONS.inc()
        return subscriber

    @property
    def subscriber_count(self) -> int:
        return len(self._admins) + sum(len(s) for s in self._by_owner.values())

    def publish(self, payload: dict[str, Any]) -> None:
        alert = alert_from_payload(payload)
        for subscriber in [*self._by_owner.get(alert.owner_id, ()), *self._admins]:
            subscriber.offer(alert)

    def close(self) -> None:
        for subscriber in [*self._admins, *(s for group in self._by_owner.values() for s in group)]:
            subscriber.close()

    def _remove(self, subscriber: AlertSubscriber) -> None:
        if subscriber.owner_id is None:
            if subscriber not in self._admins:
                return
            self._admins.discard(subscriber)
        else:
            group = self._by_owner.get(subscriber.owner_id)
            if group is None or subscriber not in group:
                return
            group.discard(subscriber)
            if not group:
                del self._by_owner[subscriber.owner_id]
        ACTIVE_SUBSCRIPTIONS.dec()


def alert_from_payload(payload: dict[str, Any]) -> BudgetAlert:
    """The alert from the trigger's JSON (timestamps in ISO 8601 with their offset)."""
    return BudgetAlert(
        id=int(payload["id"]),
        owner_id=int(payload["owner_id"]),
        window_start=datetime.fromisoformat(str(payload["window_start"])),
        percent=int(payload["percent"]),
        used_tokens=int(payload["used_tokens"]),
        cap_tokens=int(payload["cap_tokens"]),
        crossed_at=datetime.fromisoformat(str(payload["crossed_at"])),
    )
