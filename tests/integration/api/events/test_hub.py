"""The live bus on PostgreSQL (one LISTEN): transitions in order, each with its own state, to
those who may see."""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from agent_engine.api.live import BusListener, LiveUpdates, RunChange, Topic
from tests.conftest import Servers
from tests.support.factories import Factories


class Reader:
    """A subscription's events one at a time."""

    def __init__(self, subscription: BusListener[RunChange]) -> None:
        self.subscription = subscription
        self.ready: list[RunChange] = []

    async def next(self, seconds: float = 5.0) -> RunChange:
        if not self.ready:
            self.ready = await asyncio.wait_for(self.subscription.queue.take(), seconds)
        return self.ready.pop(0)

    @property
    def empty(self) -> bool:
        return not self.ready and not self.subscription.queue.pending


async def set_state(
    engine: AsyncEngine, run_id: int, state: str, reason: str | None = None
) -> None:
    async with engine.begin() as conn:
        await conn.execute(
            text("UPDATE agent_runs SET state = :s, reason = :r WHERE id = :id"),
            {"s": state, "r": reason, "id": run_id},
        )


@pytest.fixture
async def hub(engine: AsyncEngine) -> LiveUpdates:
    live = LiveUpdates(engine, queue_size=8)
    await live.start(listen_timeout=10)
    assert live.listening
    yield live  # type: ignore[misc]
    await live.stop()


def subscribe(hub: LiveUpdates, owner_id: int | None, agent_id: int | None = None) -> Reader:
    return Reader(hub.bus.subscribe(Topic.RUNS, owner_id=owner_id, agent_id=agent_id))


async def test_each_transition_once_in_order_with_its_own_state(
    hub: LiveUpdates, engine: AsyncEngine, factories: Factories
) -> None:
    agent = await factories.agent()
    mine = subscribe(hub, agent["user_id"], agent["id"])
    run = await factories.run(agent["id"], state="queued")
    # Both transitions commit before the first event is read: each still shows its own state.
    await set_state(engine, run["id"], "running")
    await set_state(engine, run["id"], "succeeded")
    seen = [await mine.next() for _ in range(3)]
    assert [(e.state, e.previous_state) for e in seen] == [
        ("queued", None),
        ("running", "queued"),
        ("succeeded", "running"),
    ]
    assert seen[0].run["id"] == run["id"]
    assert mine.empty


async def test_other_owners_see_nothing_admins_see_everything(
    hub: LiveUpdates, factories: Factories
) -> None:
    agent = await factories.agent()
    stranger = await factories.user()
    other = subscribe(hub, stranger["id"])
    admin = subscribe(hub, None)
    run = await factories.run(agent["id"], state="skipped", reason="already_running")
    event = await admin.next()
    assert (event.run["id"], event.state, event.run["reason"]) == (
        run["id"],
        "skipped",
        "already_running",
    )
    # A witness: the stranger's own run, committed later, is the first thing they see.
    theirs = await factories.run((await factories.agent(stranger["id"]))["id"], state="queued")
    assert (await other.next()).run["id"] == theirs["id"]
    assert other.empty


async def test_a_slow_subscriber_is_closed_not_grown(
    hub: LiveUpdates, factories: Factories
) -> None:
    agent = await factories.agent()
    slow = hub.bus.subscribe(Topic.RUNS, owner_id=None)
    for _ in range(20):
        await factories.run(agent["id"], state="skipped", reason="budget_exceeded")
    async with asyncio.timeout(5):
        while not slow.closed:
            await asyncio.sleep(0.05)
    assert len(slow.queue.pending) <= 8
    slow.close()
    assert hub.subscriber_count == 0


async def test_the_listener_survives_a_database_restart(
    servers: Servers, hub: LiveUpdates, factories: Factories
) -> None:
    if servers.embedded is None or servers.embedded.postgres is None:
        pytest.skip("needs the embedded PostgreSQL to restart it")
    agent = await factories.agent()
    subscriber = subscribe(hub, agent["user_id"])
    await asyncio.to_thread(servers.embedded.postgres.restart)
    async with asyncio.timeout(20):
        while not hub.listening:
            await asyncio.sleep(0.1)
        # The factories' pool may hold dead connections: pre-ping replaces them.
        run = await factories.run(agent["id"], state="queued")
    event = await subscriber.next(10)
    assert event.run["id"] == run["id"]


async def test_a_runs_steps_written_around_a_database_restart_all_arrive(
    servers: Servers, hub: LiveUpdates, engine: AsyncEngine, factories: Factories
) -> None:
    if servers.embedded is None or servers.embedded.postgres is None:
        pytest.skip("needs the embedded PostgreSQL to restart it")
    agent = await factories.agent()
    run = await factories.run(agent["id"], state="running")
    watcher = hub.bus.watch_steps(run["id"], owner_id=agent["user_id"])
    replay, ended = await hub.bus.replay_steps(run["id"], agent["user_id"])
    assert (replay, ended) == ([], False)
    await asyncio.to_thread(servers.embedded.postgres.restart)
    async with asyncio.timeout(20):
        # Written as soon as the database is back, whether or not the listener is yet.
        async with engine.begin() as conn:
            await conn.execute(
                text(
                    "INSERT INTO agent_run_steps (run_id, index, kind, name, started_at,"
                    " finished_at, output) VALUES (:run, 0, 'tool_call', 'calculator', now(),"
                    " now(), '42')"
                ),
                {"run": run["id"]},
            )
        await set_state(engine, run["id"], "succeeded")
    seen = []
    async with asyncio.timeout(20):
        async for batch in watcher.batches():  # ends when the run has ended
            seen.extend((event.index, event.finished) for event in batch)
    assert seen[-1] == (0, True) and set(seen) <= {(0, False), (0, True)}, seen
