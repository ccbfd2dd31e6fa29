"""The one bounded queue of live updates and its one overflow rule.

Every subscription ends in a `BoundedQueue`: a group's shared source (events), a member of a group
(the texts written to its socket), a stream without a socket. A queue that would hold more than
its limit is *ended* with `SubscriberTooSlow` instead of growing: what it held is still delivered,
then the error, and the client re-subscribes and re-queries what it missed. Nothing else slows
down: the producer never waits for a consumer.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator
from typing import Generic, TypeVar

from agent_engine.api.errors import ApiError

T = TypeVar("T")

SUBSCRIBER_TOO_SLOW = "SUBSCRIBER_TOO_SLOW"
# The one message a subscription that fell behind ends with (in `errors[0].message`).
LAG_MESSAGE = "subscriber fell behind its bounded queue; re-subscribe and re-query what it shows"


class SubscriberTooSlow(ApiError):
    """The subscription did not keep up; it ends, and the client re-queries."""

    code = SUBSCRIBER_TOO_SLOW

    def __init__(self, message: str = LAG_MESSAGE) -> None:
        super().__init__(message)


class QueueEnded(Exception):
    """The queue ended normally (its source completed, or the process is stopping)."""


class BoundedQueue(Generic[T]):
    """At most `limit` items; `take` waits for at least one and returns all of them."""

    __slots__ = ("_waiter", "closed", "error", "limit", "pending")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.pending: deque[T] = deque()
        self.closed = False
        self.error: Exception | None = None
        self._waiter: asyncio.Future[None] | None = None

    def offer(self, item: T) -> bool:
        """Queue `item`; False when the queue is ended (now, by overflowing, or before)."""
        if self.closed:
            return False
        if len(self.pending) >= self.limit:
            self.end(SubscriberTooSlow())
            return False
        self.pending.append(item)
        self._wake()
        return True

    def end(self, error: Exception | None = None) -> None:
        """No more items: the reader gets what is queued, then `error` (or the end)."""
        if not self.closed:
            self.closed = True
            self.error = error
            self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def take(self) -> list[T]:
        """Everything queued (waiting for at least one); raises `error` or `QueueEnded` once the
        queue ended and is drained."""
        while not self.pending:
            if self.closed:
                raise self.error or QueueEnded()
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        items = list(self.pending)
        self.pending.clear()
        return items

    async def batches(self) -> AsyncIterator[list[T]]:
        """`take` until the queue ended normally (an error is raised)."""
        while True:
            try:
                items = await self.take()
            except QueueEnded:
                return
            yield items
