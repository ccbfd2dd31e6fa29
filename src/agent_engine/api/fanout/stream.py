"""The stream a grouped subscription's resolver returns."""

from __future__ import annotations

import asyncio
import json
from collections import deque
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from strawberry.execution.is_awaitable import optimized_is_awaitable

from agent_engine.api.fanout.feed import SKIP, EventSource, Feed, SubscriberLagged
from agent_engine.api.fanout.groups import GroupEnded, Member
from agent_engine.api.fanout.socket import SocketOperation, current_operation
from agent_engine.api.subscribers import SubscriberTooSlow

if TYPE_CHECKING:
    import strawberry

    from agent_engine.api.context import Context


class SharedStream:
    """What a grouped subscription's resolver returns (see the module docstring).

    Over graphql-transport-ws it joins its group when first iterated and writes the group's
    frames to its socket, never yielding; elsewhere it yields each event's payload.
    """

    def __init__(self, info: strawberry.Info[Context, None], feed: Feed) -> None:
        self._info = info
        self._feed = feed
        self._operation = current_operation()
        self._member: Member | None = None
        self._source: EventSource[Any] | None = None
        self._events: AsyncIterator[list[Any]] | None = None
        self._ready: deque[Any] = deque()

    def __aiter__(self) -> SharedStream:
        return self

    async def __anext__(self) -> Any:
        context = self._info.context
        if self._operation is None or context.broadcaster is None:
            return await self._next_payload()
        await self._write_frames(self._operation, context)
        raise StopAsyncIteration  # pragma: no cover - _write_frames only raises

    async def _write_frames(self, operation: SocketOperation, context: Context) -> None:
        broadcaster = context.broadcaster
        assert broadcaster is not None
        if self._member is None:
            self._member = broadcaster.join(
                self._feed, self._info.schema, operation, context.require_viewer(), context
            )
        member = self._member
        prefix = '{"id":' + json.dumps(operation.id) + ',"type":"next","payload":'
        try:
            while True:
                try:
                    texts = await member.take()
                except GroupEnded:
                    raise StopAsyncIteration from None
                for text in texts:
                    try:
                        await operation.send_text(prefix + text + "}")
                    except Exception:
                        # The socket is gone: its handler notices and cancels this operation.
                        await asyncio.Future()
        finally:
            broadcaster.leave(member)

    async def _next_payload(self) -> Any:
        """Without a socket: the next event's payload, for graphql-core to execute."""
        if self._source is None:
            self._source = self._feed.open(None, True)
            self._events = self._source.batches()
        assert self._events is not None
        context = self._info.context
        while True:
            while self._ready:
                event = self._ready.popleft()
                context.refresh()
                value = self._feed.payload(event, context)
                if optimized_is_awaitable(value):
                    value = await value
                if value is not SKIP:
                    return value
            try:
                self._ready.extend(await self._events.__anext__())
            except StopAsyncIteration:
                raise
            except Exception as exc:
                if isinstance(exc, SubscriberTooSlow):
                    raise SubscriberLagged(str(exc)) from exc
                raise

    async def aclose(self) -> None:
        if self._member is not None and self._info.context.broadcaster is not None:
            self._info.context.broadcaster.leave(self._member)
        if self._source is not None:
            self._source.close()


def shared_stream(info: strawberry.Info[Context, None], feed: Feed) -> AsyncIterator[Any]:
    """The stream a grouped subscription field returns (checks done, arguments parsed)."""
    return SharedStream(info, feed)
