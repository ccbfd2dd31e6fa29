"""The budget-alert feed: who sees an alert, and a subscriber that falls behind."""

from __future__ import annotations

import asyncio

import pytest

from agent_engine.api.alert_events import BudgetAlertFeed, alert_from_payload
from agent_engine.api.subscribers import SubscriberTooSlow


def payload(owner_id: int, percent: int, id: int = 1) -> dict[str, object]:
    # As the trigger's json_build_object writes it.
    return {
        "id": id,
        "owner_id": owner_id,
        "window_start": "2025-03-09T00:00:00-05:00",
        "percent": percent,
        "used_tokens": 800,
        "cap_tokens": 1000,
        "crossed_at": "2025-03-12T10:15:00.123456+00:00",
    }


async def test_an_alert_reaches_its_owner_and_the_admins_only() -> None:
    feed = BudgetAlertFeed(queue_size=4)
    owner, other, admin = (feed.subscribe(owner_id=i) for i in (7, 8, None))

    feed.publish(payload(7, 80))

    assert [a.percent for a in (owner.queue.get_nowait(), admin.queue.get_nowait())] == [80, 80]
    assert other.queue.empty()
    for subscriber in (owner, other, admin):
        subscriber.close()
    assert feed.subscriber_count == 0


async def test_a_subscriber_that_falls_behind_is_told_so() -> None:
    feed = BudgetAlertFeed(queue_size=2)
    slow = feed.subscribe(owner_id=7)
    for index in range(3):
        feed.publish(payload(7, 50, id=index))

    received = []
    with pytest.raises(SubscriberTooSlow):
        async with asyncio.timeout(5):
            async for alert in slow.alerts():
                received.append(alert.id)
    assert received == [1]  # the oldest made room for the error
    assert feed.subscriber_count == 0


def test_the_payload_keeps_instants_exact() -> None:
    alert = alert_from_payload(payload(7, 80))
    assert alert.window_start.utcoffset() is not None
    assert alert.window_start.isoformat() == "2025-03-09T00:00:00-05:00"
    assert alert.crossed_at.microsecond == 123456
