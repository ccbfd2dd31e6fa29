"""The one bounded queue (its one overflow rule) and the one audience index."""

from __future__ import annotations

import asyncio

import pytest

from agent_engine.api.live import LAG_MESSAGE, AudienceIndex, BoundedQueue, SubscriberTooSlow


async def test_a_queue_hands_out_bursts_in_order() -> None:
    queue: BoundedQueue[int] = BoundedQueue(4)
    for item in (1, 2, 3):
        assert queue.offer(item)
    assert await queue.take() == [1, 2, 3]
    waiting = asyncio.create_task(queue.take())
    await asyncio.sleep(0)
    queue.offer(4)
    assert await waiting == [4]


async def test_overflow_ends_the_queue_with_the_one_message_after_what_it_held() -> None:
    queue: BoundedQueue[int] = BoundedQueue(2)
    assert queue.offer(1) and queue.offer(2)
    assert not queue.offer(3)  # over the bound: ended, not grown
    assert not queue.offer(4)  # and stays ended
    assert await queue.take() == [1, 2]
    with pytest.raises(SubscriberTooSlow) as ended:
        await queue.take()
    assert ended.value.message == LAG_MESSAGE
    assert ended.value.extensions["code"] == "SUBSCRIBER_TOO_SLOW"


async def test_an_ended_queue_wakes_its_reader_and_its_batches_stop() -> None:
    queue: BoundedQueue[int] = BoundedQueue(2)
    batches = []

    async def read() -> None:
        async for batch in queue.batches():
            batches.append(batch)

    reader = asyncio.create_task(read())
    queue.offer(1)
    await asyncio.sleep(0)
    queue.end()
    async with asyncio.timeout(5):
        await reader
    assert batches == [[1]]


def test_an_owners_event_reaches_the_owner_and_the_admins_only() -> None:
    index: AudienceIndex[str] = AudienceIndex()
    index.add(7, "owner 7")
    index.add(7, "owner 7, second tab")
    index.add(8, "owner 8")
    index.add(None, "admin")
    assert sorted(index.audience(7)) == ["admin", "owner 7", "owner 7, second tab"]
    assert index.audience(9) == ["admin"]
    assert index.has_audience(9)
    assert index.discard(None, "admin") and not index.discard(None, "admin")
    assert not index.has_audience(9) and index.audience(9) == []
    assert index.discard(8, "owner 8") and len(index) == 2
