"""Grouped delivery (api/live/) in process: a real Strawberry schema and Broadcaster, an
in-memory event source, and sockets that record the text written to them. No database: the
contexts' engine is never connected."""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pytest
import strawberry
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from agent_engine.api.auth import Caller
from agent_engine.api.context import Context
from agent_engine.api.live import (
    NO_USER_ID,
    SKIP,
    Broadcaster,
    Feed,
    SocketOperation,
    SubscriberTooSlow,
    shared_stream,
)
from agent_engine.api.live.socket import _OPERATION
from agent_engine.api.loaders import Loaders
from agent_engine.settings import Settings

QUERY = "subscription { seen { viewerId ownerId number } }"
WAIT_SECONDS = 5.0


@dataclass(frozen=True)
class Event:
    owner_id: int
    number: int


class MemorySource:
    """An EventSource fed by the test."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[Event | Exception] = asyncio.Queue()
        self.closed = False

    async def batches(self) -> AsyncIterator[list[Event]]:
        while True:
            items = [await self.queue.get()]
            while not self.queue.empty():
                items.append(self.queue.get_nowait())
            batch = [item for item in items if isinstance(item, Event)]
            if batch:
                yield batch
            if len(batch) < len(items):
                raise next(item for item in items if isinstance(item, Exception))

    def close(self) -> None:
        self.closed = True


class Sources:
    def __init__(self) -> None:
        self.opened: list[MemorySource] = []
        self.payloads = 0

    def emit(self, event: Event | Exception) -> None:
        for source in self.opened:
            if not source.closed:
                source.queue.put_nowait(event)

    def feed(self) -> Feed:
        def open_source(queue_size: int | None, counted: bool) -> MemorySource:
            source = MemorySource()
            self.opened.append(source)
            return source

        def payload(event: Event, context: Context) -> Any:
            self.payloads += 1
            if event.number < 0:
                return SKIP
            assert context.viewer is not None
            return Seen(
                viewer_id=context.viewer.user_id, owner_id=event.owner_id, number=event.number
            )

        return Feed(("seen",), open_source, payload)


@strawberry.type
class Seen:
    viewer_id: int
    owner_id: int
    number: int


SOURCES: contextvars.ContextVar[Sources] = contextvars.ContextVar("sources")
BROADCASTER: contextvars.ContextVar[Broadcaster] = contextvars.ContextVar("broadcaster")


@strawberry.type
class Query:
    ok: bool = True


@strawberry.type
class Subscription:
    @strawberry.subscription
    async def seen(self, info: strawberry.Info[Context, None]) -> AsyncIterator[Seen]:
        return shared_stream(info, SOURCES.get().feed(), BROADCASTER.get())


SCHEMA = strawberry.Schema(query=Query, subscription=Subscription)


class Socket:
    """One subscription's socket: the text frames written to it."""

    def __init__(self, *, stuck: bool = False) -> None:
        self.frames: list[str] = []
        self.reading = asyncio.Event()
        if not stuck:
            self.reading.set()
        self.task: asyncio.Task[list[Any]] | None = None

    async def send_text(self, text: str) -> None:
        await self.reading.wait()  # a client that stopped reading: the write does not finish
        self.frames.append(text)


@pytest.fixture
def sources() -> Sources:
    value = Sources()
    SOURCES.set(value)
    return value


@pytest.fixture
def broadcaster() -> Broadcaster:
    value = Broadcaster(queue_size=4)
    BROADCASTER.set(value)
    return value


@pytest.fixture
async def engine() -> AsyncIterator[AsyncEngine]:
    # Never connected: the feed's payloads read nothing.
    engine = create_async_engine("postgresql+asyncpg://nobody@127.0.0.1:1/none")
    yield engine
    await engine.dispose()


@pytest.fixture
def settings() -> Settings:
    return Settings(jwt_secret="x" * 32)


def subscribe(
    engine: AsyncEngine,
    settings: Settings,
    broadcaster: Broadcaster,
    viewer: Caller,
    socket: Socket,
    *,
    id: str = "1",
) -> None:
    """What GroupedTransportWSHandler.run_operation does for a `subscribe` message."""
    context = Context(
        new_loaders=lambda now: Loaders(engine, now=now),
        now=datetime.now(UTC),
        viewer=viewer,
    )

    async def run() -> list[Any]:
        _OPERATION.set(SocketOperation(id, QUERY, None, None, socket.send_text))
        results = await SCHEMA.subscribe(QUERY, context_value=context)
        return [result async for result in results]  # type: ignore[union-attr]

    socket.task = asyncio.create_task(run(), context=contextvars.copy_context())


def owner(user_id: int) -> Caller:
    return Caller(user_id=user_id, is_admin=False, email=None, display_name=None, timezone=None)


def admin(user_id: int) -> Caller:
    return Caller(user_id=user_id, is_admin=True, email=None, display_name=None, timezone=None)


async def until(condition: Callable[[], bool]) -> None:
    async with asyncio.timeout(WAIT_SECONDS):
        while not condition():
            await asyncio.sleep(0.01)


async def test_one_execution_per_event_and_group_and_the_same_text_for_every_member(
    engine: AsyncEngine, settings: Settings, sources: Sources, broadcaster: Broadcaster
) -> None:
    sockets = [Socket() for _ in range(5)]
    for index, socket in enumerate(sockets):
        subscribe(engine, settings, broadcaster, owner(7), socket, id=f"op-{index}")
    await until(lambda: broadcaster.member_count == 5)
    assert broadcaster.group_count == 1 and len(sources.opened) == 1
    for number in range(3):
        sources.emit(Event(owner_id=7, number=number))
    sources.emit(Event(owner_id=7, number=-1))  # SKIP: nothing sent
    await until(lambda: all(len(s.frames) == 3 for s in sockets))
    assert sources.payloads == 4  # once per event, not once per subscriber
    for index, socket in enumerate(sockets):
        prefix = f'{{"id":"op-{index}","type":"next","payload":'
        assert all(frame.startswith(prefix) for frame in socket.frames)
        payloads = [frame[len(prefix) :] for frame in socket.frames]
        assert payloads == [
            f'{{"data":{{"seen":{{"viewerId":7,"ownerId":7,"number":{n}}}}}}}}}' for n in range(3)
        ]
    for socket in sockets:
        assert socket.task is not None
        socket.task.cancel()
    await until(lambda: broadcaster.group_count == 0)
    assert broadcaster.member_count == 0 and sources.opened[0].closed


async def test_audiences_get_their_own_groups_and_an_admin_owner_their_own_payload(
    engine: AsyncEngine, settings: Settings, sources: Sources, broadcaster: Broadcaster
) -> None:
    mine, theirs, admin_owner, other_admin = Socket(), Socket(), Socket(), Socket()
    subscribe(engine, settings, broadcaster, owner(7), mine)
    subscribe(engine, settings, broadcaster, owner(8), theirs)
    subscribe(engine, settings, broadcaster, admin(9), admin_owner)
    subscribe(engine, settings, broadcaster, admin(10), other_admin)
    await until(lambda: broadcaster.member_count == 4)
    assert broadcaster.group_count == 3  # owner 7, owner 8, the admins

    sources.emit(Event(owner_id=9, number=1))  # a run of the admin who is also an owner
    await until(lambda: len(admin_owner.frames) == 1 and len(other_admin.frames) == 1)
    assert '"viewerId":9' in admin_owner.frames[0]
    assert f'"viewerId":{NO_USER_ID}' in other_admin.frames[0]
    # Each group saw the event (the test source does not filter by owner), the admins' twice.
    assert sources.payloads == 4
    for socket in (mine, theirs, admin_owner, other_admin):
        assert socket.task is not None
        socket.task.cancel()
    await until(lambda: broadcaster.group_count == 0)


async def test_an_event_only_its_owner_receives_is_executed_for_the_owner_alone(
    engine: AsyncEngine, settings: Settings, sources: Sources, broadcaster: Broadcaster
) -> None:
    admin_owner = Socket()
    subscribe(engine, settings, broadcaster, admin(9), admin_owner)
    await until(lambda: broadcaster.member_count == 1)
    sources.emit(Event(owner_id=9, number=1))  # the admins' group holds only its owner
    await until(lambda: len(admin_owner.frames) == 1)
    assert '"viewerId":9' in admin_owner.frames[0]
    assert sources.payloads == 1  # no admins' payload for nobody
    assert admin_owner.task is not None
    admin_owner.task.cancel()
    await until(lambda: broadcaster.group_count == 0)


async def test_a_stuck_member_is_told_it_fell_behind_and_the_others_go_on(
    engine: AsyncEngine, settings: Settings, sources: Sources, broadcaster: Broadcaster
) -> None:
    fast, stuck = Socket(), Socket(stuck=True)
    subscribe(engine, settings, broadcaster, owner(7), fast)
    subscribe(engine, settings, broadcaster, owner(7), stuck)
    await until(lambda: broadcaster.member_count == 2)
    for number in range(10):  # more than the queue (4) plus the frame being written
        sources.emit(Event(owner_id=7, number=number))
        await asyncio.sleep(0.01)
    await until(lambda: len(fast.frames) == 10)
    assert stuck.task is not None
    stuck.reading.set()  # the client reads again: what was queued, then the error
    results = await asyncio.wait_for(stuck.task, WAIT_SECONDS)
    assert [r.errors[0].extensions["code"] for r in results] == ["SUBSCRIBER_TOO_SLOW"]
    assert broadcaster.member_count == 1
    assert [int(f.split('"number":')[1].split("}")[0]) for f in fast.frames] == list(range(10))
    assert fast.task is not None
    fast.task.cancel()
    await until(lambda: broadcaster.group_count == 0)


async def test_a_source_that_overflows_ends_every_member_with_the_error(
    engine: AsyncEngine, settings: Settings, sources: Sources, broadcaster: Broadcaster
) -> None:
    sockets = [Socket(), Socket()]
    for socket in sockets:
        subscribe(engine, settings, broadcaster, owner(7), socket)
    await until(lambda: broadcaster.member_count == 2)
    sources.emit(Event(owner_id=7, number=1))
    sources.emit(SubscriberTooSlow("the group's source fell behind"))
    for socket in sockets:
        assert socket.task is not None
        results = await asyncio.wait_for(socket.task, WAIT_SECONDS)
        assert [r.errors[0].extensions["code"] for r in results] == ["SUBSCRIBER_TOO_SLOW"]
        assert len(socket.frames) == 1
    assert broadcaster.member_count == 0 and broadcaster.group_count == 0
