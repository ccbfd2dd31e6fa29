"""The LISTEN/NOTIFY hub: transitions in order, each with its own state, to those who may see."""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from agent_engine.api.events import RunEvent, RunEventHub, Subscriber
from tests.conftest import Servers
from tests.support.factories import Factories


async def next_event(subscriber: Subscriber, seconds: float = 5.0) -> RunEvent:
    item = await asyncio.wait_for(subscriber.queue.get(), seconds)
    assert isinstance(item, RunEvent)
    return item


async def set_state(
    engine: AsyncEngine, run_id: int, state: str, reason: str | None = None
) -> None:
    async with engine.begin() as conn:
        await conn.execute(
            text("UPDATE agent_runs SET state = :s, reason = :r WHERE id = :id"),
            {"s": state, "r": reason, "id": run_id},
        )


@pytest.fixture
async def hub(database_url: str) -> RunEventHub:
    hub = RunEventHub(database_url, queue_size=8)
    await hub.start()
    async with asyncio.timeout(10):
        await hub.wait_listening()
    yield hub  # type: ignore[misc]
    await hub.stop()


async def test_each_transition_once_in_order_with_its_own_state(
    hub: RunEventHub, engine: AsyncEngine, factories: Factories
) -> None:
    agent = await factories.agent()
    mine = hub.subscribe(owner_id=agent["user_id"], agent_id=agent["id"])
    run = await factories.run(agent["id"], state="queued")
    # Both transitions commit before the first event is read: each still shows its own state.
    await set_state(engine, run["id"], "running")
    await set_state(engine, run["id"], "succeeded")
    seen = [await next_event(mine) for _ in range(3)]
    assert [(e.state, e.previous_state) for e in seen] == [
        ("queued", None),
        ("running", "queued"),
        ("succeeded", "running"),
    ]
    assert seen[0].run["id"] == run["id"]
    assert mine.queue.empty()


async def test_other_owners_see_nothing_admins_see_everything(
    hub: RunEventHub, factories: Factories
) -> None:
    agent = await factories.agent()
    stranger = await factories.user()
    other = hub.subscribe(owner_id=stranger["id"])
    admin = hub.subscribe(owner_id=None)
    run = await factories.run(agent["id"], state="skipped", reason="already_running")
    event = await next_event(admin)
    assert (event.run["id"], event.state, event.run["reason"]) == (
        run["id"],
        "skipped",
        "already_running",
    )
    await asyncio.sleep(0.3)
    assert other.queue.empty()


async def test_a_slow_subscriber_is_closed_not_grown(
    hub: RunEventHub, factories: Factories
) -> None:
    agent = await factories.agent()
    slow = hub.subscribe(owner_id=None)
    for _ in range(20):
        await factories.run(agent["id"], state="skipped", reason="budget_exceeded")
    async with asyncio.timeout(5):
        while not slow.closed:
            await asyncio.sleep(0.05)
    assert slow.queue.qsize() <= 8
    assert hub.subscriber_count == 0


async def test_the_listener_survives_a_database_restart(
    servers: Servers, hub: RunEventHub, factories: Factories
) -> None:
    if servers.embedded is None or servers.embedded.postgres is None:
        pytest.skip("needs the embedded PostgreSQL to restart it")
    agent = await factories.agent()
    subscriber = hub.subscribe(owner_id=agent["user_id"])
    await asyncio.to_thread(servers.embedded.postgres.restart)
    async with asyncio.timeout(20):
        while not hub.listening:
            await asyncio.sleep(0.1)
        # The factories' pool may hold dead connections: pre-ping replaces them.
        run = await factories.run(agent["id"], state="queued")
    event = await next_event(subscriber, 10)
    assert event.run["id"] == run["id"]
