"""The live bus with an in-memory store: no database, no socket."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from agent_engine.api.live import BusListener, LiveBus, RunChange, StepEvent, Topic
from agent_engine.api.live.bus import ALERTS_CHANNEL, RUNS_CHANNEL, STEPS_CHANNEL
from agent_engine.observability.metrics import ACTIVE_SUBSCRIPTIONS
from tests.unit.api.live.support import MemoryStore

WAIT = 5.0


@pytest.fixture
async def store() -> MemoryStore:
    return MemoryStore()


def gauge() -> float:
    return float(ACTIVE_SUBSCRIPTIONS._value.get())


@pytest.fixture
async def bus(store: MemoryStore) -> AsyncIterator[LiveBus]:
    before = gauge()
    bus = LiveBus(store, queue_size=16)
    bus.start()
    yield bus
    await bus.stop()
    # Every subscription counted in agent_engine_active_subscriptions was counted out again.
    assert gauge() == before


def run_note(run_id: int, owner_id: int, state: str, previous: str | None = None) -> str:
    return json.dumps(
        {
            "run_id": run_id,
            "agent_id": 100 + owner_id,
            "owner_id": owner_id,
            "state": state,
            "previous_state": previous,
        }
    )


async def take(subscription: BusListener[Any]) -> list[Any]:
    async with asyncio.timeout(WAIT):
        return await subscription.queue.take()


async def test_a_burst_is_loaded_once_and_each_sees_its_own_transition(
    bus: LiveBus, store: MemoryStore
) -> None:
    store.run(1, owner_id=7, agent_id=107, state="running")
    mine = bus.subscribe(Topic.RUNS, owner_id=7)
    admin = bus.subscribe(Topic.RUNS, owner_id=None)
    other = bus.subscribe(Topic.RUNS, owner_id=8)
    bus.notify(RUNS_CHANNEL, run_note(1, 7, "queued"))
    bus.notify(RUNS_CHANNEL, run_note(1, 7, "running", "queued"))

    seen: list[RunChange] = await take(mine)
    assert [(e.state, e.previous_state) for e in seen] == [("queued", None), ("running", "queued")]
    assert [e.state for e in await take(admin)] == ["queued", "running"]
    assert store.reads == [("runs", 1)]  # one read for the burst, whatever the audience
    assert not other.queue.pending


async def test_nobody_listening_reads_nothing(bus: LiveBus, store: MemoryStore) -> None:
    store.run(1, owner_id=7, agent_id=107, state="queued")
    bus.subscribe(Topic.RUNS, owner_id=8)
    bus.notify(RUNS_CHANNEL, run_note(1, 7, "queued"))
    bus.notify(RUNS_CHANNEL, "not json")  # logged and dropped
    witness = bus.subscribe(Topic.RUNS, owner_id=9)
    store.run(2, owner_id=9, agent_id=109, state="queued")
    bus.notify(RUNS_CHANNEL, run_note(2, 9, "queued"))
    await take(witness)  # later than the first note: that one was dropped without a read
    assert store.reads == [("runs", 2)]


async def test_a_subscription_to_one_agent_sees_only_that_agents_runs(
    bus: LiveBus, store: MemoryStore
) -> None:
    store.run(1, owner_id=7, agent_id=107, state="queued")
    store.run(2, owner_id=7, agent_id=108, state="queued")
    one_agent = bus.subscribe(Topic.RUNS, owner_id=7, agent_id=108)
    every_agent = bus.subscribe(Topic.RUNS, owner_id=7)
    bus.notify(RUNS_CHANNEL, run_note(1, 7, "queued"))  # agent 107 (run_note: 100 + owner)
    note = json.loads(run_note(2, 7, "queued"))
    bus.notify(RUNS_CHANNEL, json.dumps({**note, "agent_id": 108}))
    assert [e.run["id"] for e in await take(every_agent)] == [1, 2]
    assert [e.run["id"] for e in await take(one_agent)] == [2]


async def test_an_alert_reaches_its_owner_and_the_admins_without_a_read(
    bus: LiveBus, store: MemoryStore
) -> None:
    owner, other, admin = (bus.subscribe(Topic.ALERTS, owner_id=i) for i in (7, 8, None))
    payload = {
        "id": 1,
        "owner_id": 7,
        "window_start": "2025-03-09T00:00:00-05:00",
        "percent": 80,
        "used_tokens": 800,
        "cap_tokens": 1000,
        "crossed_at": "2025-03-12T10:15:00.123456+00:00",
    }
    bus.notify(ALERTS_CHANNEL, json.dumps(payload))
    (alert,) = await take(owner)
    assert (alert.percent, alert.window_start.isoformat()) == (80, "2025-03-09T00:00:00-05:00")
    assert alert.crossed_at.microsecond == 123456
    assert [a.id for a in await take(admin)] == [1]
    assert not other.queue.pending and store.reads == []


async def test_a_slow_subscriber_is_ended_and_the_others_go_on(
    bus: LiveBus, store: MemoryStore
) -> None:
    slow = bus.subscribe(Topic.ALERTS, owner_id=7, queue_size=2)
    fast = bus.subscribe(Topic.ALERTS, owner_id=7, queue_size=100)
    for index in range(5):
        bus.alert_recorded(
            {
                "id": index,
                "owner_id": 7,
                "window_start": "2025-03-09T00:00:00+00:00",
                "percent": 50,
                "used_tokens": 1,
                "cap_tokens": 2,
                "crossed_at": "2025-03-09T00:00:00+00:00",
            }
        )
    assert slow.closed and bus.count(Topic.ALERTS) == 1  # out of the index at once
    assert [a.id for a in await take(fast)] == [0, 1, 2, 3, 4]


async def test_a_step_change_is_read_once_for_a_thousand_watchers(
    bus: LiveBus, store: MemoryStore
) -> None:
    store.run(5, owner_id=7, agent_id=107, state="running")
    store.step(5, 0, finished=True)
    watchers = [bus.watch_steps(5, owner_id=7) for _ in range(1_000)]
    replay, ended = await bus.replay_steps(5, 7)
    assert [(e.index, e.finished) for e in replay] == [(0, True)] and not ended
    store.reads.clear()

    store.step(5, 1)
    bus.notify(STEPS_CHANNEL, json.dumps({"run_id": 5, "index": 1}))
    for watcher in watchers:
        events: list[StepEvent] = await take(watcher)
        assert [(e.index, e.finished) for e in events] == [(1, False)]
    assert store.reads == [("steps", 5)]  # one read, not one per watcher

    store.step(5, 1, finished=True)
    store.runs[5]["state"] = "succeeded"
    bus.notify(RUNS_CHANNEL, run_note(5, 7, "succeeded", "running"))
    for watcher in watchers:
        assert [(e.index, e.finished) for e in await take(watcher)] == [(1, True)]
        async with asyncio.timeout(WAIT):
            assert [b async for b in watcher.batches()] == []  # the run ended: so does the stream
    assert store.reads.count(("steps", 5)) == 2
    assert bus.count(Topic.STEPS) == 0 and bus.subscriber_count == 0


async def test_after_a_reconnect_the_readers_read_again(bus: LiveBus, store: MemoryStore) -> None:
    store.run(5, owner_id=7, agent_id=107, state="running")
    watcher = bus.watch_steps(5, owner_id=7)
    await bus.replay_steps(5, 7)
    store.step(5, 0)  # its NOTIFY was lost with the connection
    await bus.caught_up()
    assert [(e.index, e.finished) for e in await take(watcher)] == [(0, False)]


async def test_dashboards_opening_a_run_at_once_share_one_replay_read(
    bus: LiveBus, store: MemoryStore
) -> None:
    store.run(5, owner_id=7, agent_id=107, state="running")
    store.step(5, 0, finished=True)
    watchers = [bus.watch_steps(5, owner_id=7) for _ in range(1_000)]
    async with asyncio.timeout(WAIT):
        replays = await asyncio.gather(*(bus.replay_steps(5, 7) for _ in watchers))
    assert all([(e.index, e.finished) for e in events] == [(0, True)] for events, _ in replays)
    assert store.reads == [("steps", 5)]


async def test_a_step_that_started_and_finished_between_two_reads_shows_both(
    bus: LiveBus, store: MemoryStore
) -> None:
    store.run(5, owner_id=7, agent_id=107, state="running")
    watcher = bus.watch_steps(5, owner_id=7)
    await bus.replay_steps(5, 7)
    store.step(5, 0, finished=True)  # both changes committed before the reader woke
    bus.step_changed({"run_id": 5, "index": 0})
    bus.step_changed({"run_id": 5, "index": 0})
    events = await take(watcher)
    assert [(e.index, e.finished) for e in events] == [(0, False), (0, True)]
