"""A subscription's bounded queue, shared by the run events and the budget alerts.

A subscriber that falls behind by more than its queue is closed with `SubscriberTooSlow` rather
than allowed to grow memory: the client re-subscribes and re-queries what it missed.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import ClassVar, Generic, TypeVar

T = TypeVar("T")


class SubscriberTooSlow(Exception):
    """The subscriber's queue overflowed; the subscription ends, the client re-queries."""


class _StreamEnded(Exception):
    """Wakes a reader blocked on an empty queue when the subscriber is closed."""


class BoundedSubscriber(Generic[T]):
    """One subscription's queue of items; `forget` is where its source lets go of it."""

    # What a subscriber that fell behind is told.
    lag_message: ClassVar[str] = "subscriber fell behind; re-query the journal"

    def __init__(self, queue: asyncio.Queue[T | Exception]) -> None:
        self.queue = queue
        self.closed = False

    def offer(self, item: T) -> None:
        if self.closed:
            return
        try:
            self.queue.put_nowait(item)
        except asyncio.QueueFull:
            # Make room for the terminal error so the reader learns why the stream ended.
            with contextlib.suppress(asyncio.QueueEmpty):
                self.queue.get_nowait()
            self.queue.put_nowait(SubscriberTooSlow(self.lag_message))
            self.close()

    async def events(self) -> AsyncIterator[T]:
        """The items until the subscriber is closed (then the iterator ends) or falls behind."""
        try:
            while not (self.closed and self.queue.empty()):
                item = await self.queue.get()
                if isinstance(item, _StreamEnded):
                    return
                if isinstance(item, Exception):
                    raise item
                yield item
        finally:
            self.close()

    async def batches(self) -> AsyncIterator[list[T]]:
        """As `events`, but what is already queued comes at once (a burst is handled together)."""
        try:
            while not (self.closed and self.queue.empty()):
                items = [await self.queue.get()]
                while not self.queue.empty():
                    items.append(self.queue.get_nowait())
                batch: list[T] = []
                for item in items:
                    if isinstance(item, _StreamEnded):
                        break
                    if isinstance(item, Exception):
                        if batch:
                            yield batch
                        raise item
                    batch.append(item)
                if batch:
                    yield batch
                if len(batch) < len(items):  # ended
                    return
        finally:
            self.close()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.forget()
            # A reader waiting on an empty queue would wait forever; one with items left drains
            # them and then sees `closed`.
            if self.queue.empty():
                self.queue.put_nowait(_StreamEnded())

    def forget(self) -> None:
        """Called once, on closing: the source stops offering to this subscriber."""
