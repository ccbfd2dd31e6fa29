"""The stream a grouped subscription's resolver returns."""

from __future__ import annotations

import asyncio
import json
from collections import deque
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from strawberry.execution.is_awaitable import optimized_is_awaitable

from agent_engine.api.live.feeds import SKIP, Feed, Shown
from agent_engine.api.live.groups import Broadcaster, Member
from agent_engine.api.live.queue import QueueEnded
from agent_engine.api.live.socket import SocketOperation, current_operation

if TYPE_CHECKING:
    import strawberry

    from agent_engine.api.context import Context
    from agent_engine.api.live.listeners import BusListener


class SharedStream:
    """What a grouped subscription's resolver returns (see the package docstring).

    Over graphql-transport-ws it joins its group when first iterated and writes the group's
    frames to its socket, never yielding; elsewhere it yields each event's payload.
    """

    def __init__(
        self, info: strawberry.Info[Context, None], feed: Feed, broadcaster: Broadcaster | None
    ) -> None:
        self._info = info
        self._feed = feed
        self._broadcaster = broadcaster
        self._operation = current_operation()
        self._member: Member | None = None
        self._source: BusListener[Any] | None = None
        self._events: AsyncIterator[list[Any]] | None = None
        self._ready: deque[Any] = deque()
        self._shown: Shown | None = Shown(feed.shown_as) if feed.shown_as else None
        self._ended_after_ready = False

    def __aiter__(self) -> SharedStream:
        return self

    async def __anext__(self) -> Any:
        if self._operation is None or self._broadcaster is None:
            return await self._next_payload()
        await self._write_frames(self._operation, self._broadcaster)
        raise StopAsyncIteration  # pragma: no cover - _write_frames only raises

    async def _write_frames(self, operation: SocketOperation, broadcaster: Broadcaster) -> None:
        context = self._info.context
        if self._member is None:
            self._member = broadcaster.join(
                self._feed, self._info.schema, operation, context.require_viewer(), context
            )
        member = self._member
        prefix = '{"id":' + json.dumps(operation.id) + ',"type":"next","payload":'

        async def send(text: str) -> None:
            try:
                await operation.send_text(prefix + text + "}")
            except Exception:
                # The socket is gone: its handler notices and cancels this operation.
                await asyncio.Future()

        try:
            if self._feed.replay is not None and member.shown is not None:
                # Joined first, then read: a change after the read is in the member's queue.
                events, ended = await self._feed.replay()
                for event in events:
                    if not member.shown.first_time(event):
                        continue
                    text = member.group.execute_for(member, event)
                    if optimized_is_awaitable(text):
                        text = await text
                    if text is not None:
                        await send(text)
                if ended:
                    raise StopAsyncIteration
            shown = member.shown
            while True:
                try:
                    items = await member.take()
                except QueueEnded:
                    raise StopAsyncIteration from None
                for item in items:
                    if shown is not None:
                        tag, item = item
                        if not shown.tag_first_time(tag):
                            continue
                    await send(item)
        finally:
            broadcaster.leave(member)

    async def _next_payload(self) -> Any:
        """Without a socket: the next event's payload, for graphql-core to execute."""
        if self._source is None:
            self._source = self._feed.open(None, True)
            self._events = self._source.batches()
            if self._feed.replay is not None:
                events, self._ended_after_ready = await self._feed.replay()
                self._ready.extend(events)
        assert self._events is not None
        context = self._info.context
        while True:
            while self._ready:
                event = self._ready.popleft()
                if self._shown is not None and not self._shown.first_time(event):
                    continue
                context.refresh()
                value = self._feed.payload(event, context)
                if optimized_is_awaitable(value):
                    value = await value
                if value is not SKIP:
                    return value
            if self._ended_after_ready:
                raise StopAsyncIteration
            self._ready.extend(await self._events.__anext__())

    async def aclose(self) -> None:
        if self._member is not None and self._broadcaster is not None:
            self._broadcaster.leave(self._member)
        if self._source is not None:
            self._source.close()


def shared_stream(
    info: strawberry.Info[Context, None], feed: Feed, broadcaster: Broadcaster | None
) -> AsyncIterator[Any]:
    """The stream a grouped subscription field returns (checks done, arguments parsed)."""
    return SharedStream(info, feed, broadcaster)
