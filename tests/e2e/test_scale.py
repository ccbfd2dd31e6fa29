"""Runs at real-model scale with real `agent-engine worker` and `clock` processes.

The model is the FakeOpenAIServer made slow (`delay_seconds`) or held (`hold()`: every reply waits
until the test releases it, so "all of these were in flight at the same moment" is observed, not
timed). What a user would notice: a morning's burst of runs executes side by side, not eight at a
time; a model's concurrency limit holds across worker processes; the schedule keeps ticking while
the workers are full of long runs; a killed worker's runs all end, none twice.
"""

from __future__ import annotations

import asyncio
import subprocess
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
import redis
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from agent_engine.domain.runs import RunTrigger
from agent_engine.runs.request import request_run
from agent_engine.settings import Settings
from agent_engine.testing.fake_openai import FakeOpenAIServer, text_reply
from agent_engine.workers.broker import close_broker, configure_broker, enqueue_execute
from tests.e2e.support import (  # noqa: F401 (fixtures)
    FAKE_KEY_ENV,
    Stack,
    agent_engine_command,
    all_terminal,
    eventually,
    fake_model,
    fake_openai,
    fetch,
    invariant_violations,
    marker_counts,
    settings_env,
    stack,
)
from tests.support.factories import Factories

pytestmark = pytest.mark.slow

MODEL_LATENCY_SECONDS = 3.0


@pytest.fixture
def sender(stack: Stack) -> Iterator[None]:  # noqa: F811
    """This process sends execute messages on the stack's broker (as the api does)."""
    configure_broker(stack.settings)
    try:
        yield
    finally:
        close_broker()


@pytest.fixture
async def slow_model_server(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[FakeOpenAIServer]:
    """A second model server, for runs that must stay long while others answer."""
    monkeypatch.setenv(FAKE_KEY_ENV, "test-key")
    async with FakeOpenAIServer() as server:
        yield server
        server.release()


async def agents_on(
    factories: Factories, model_id: int, count: int, **values: Any
) -> tuple[list[int], list[str]]:
    """`count` agents of one owner on the model; each prompt carries a marker."""
    owner = (await factories.user())["id"]
    ids, markers = [], []
    for index in range(count):
        marker = f"MARK-{index}-{uuid.uuid4().hex[:8]}"
        agent = await factories.agent(
            user_id=owner,
            model_id=model_id,
            name=f"agent {index}",
            prompt=f"Report {marker}.",
            **values,
        )
        ids.append(int(agent["id"]))
        markers.append(marker)
    return ids, markers


async def request_all(engine: AsyncEngine, agent_ids: list[int]) -> list[int]:
    run_ids = []
    for agent_id in agent_ids:
        row = await request_run(
            engine,
            agent_id,
            trigger=RunTrigger.MANUAL,
            now=datetime.now(UTC),
            enqueue=enqueue_execute,
        )
        assert row.state == "queued"
        run_ids.append(row.id)
    return run_ids


async def until(condition: Any, what: str, within: float = 60.0) -> None:
    async def probe() -> bool:
        return bool(condition())

    await eventually(probe, within=within, what=what)


async def count_running(engine: AsyncEngine, **where: int) -> int:
    sql = "SELECT count(*) AS n FROM agent_runs WHERE state = 'running'"
    if "model_id" in where:
        sql += " AND model_id = :model_id"
    return int((await fetch(engine, sql, **where))[0]["n"])


async def test_one_default_worker_keeps_120_runs_of_a_3_second_model_in_flight_at_once(
    engine: AsyncEngine,
    factories: Factories,
    fake_openai: FakeOpenAIServer,  # noqa: F811
    stack: Stack,  # noqa: F811
) -> None:
    model = await fake_model(factories, fake_openai)
    fake_openai.script(lambda _: text_reply("ok", delay_seconds=MODEL_LATENCY_SECONDS))
    agent_ids, _ = await agents_on(
        factories, model["id"], 120, schedule={"type": "interval", "every_hours": 24}
    )
    fake_openai.hold()
    stack.worker(threads=None)  # the defaults: `agent-engine worker`
    stack.clock()
    # The slot arrives for all 120 at once (a Monday 09:00).
    async with engine.begin() as conn:
        await conn.execute(
            text("UPDATE agents SET next_run_at = now() - interval '1 second' WHERE id = ANY(:i)"),
            {"i": agent_ids},
        )

    await until(lambda: fake_openai.active_requests == 120, "120 model calls waiting at once")
    assert await count_running(engine) == 120
    fake_openai.release()
    await eventually(lambda: all_terminal(engine), within=60, what="every run to finish")

    rows = await fetch(
        engine,
        "SELECT count(*) AS n, count(*) FILTER (WHERE state = 'succeeded') AS ok,"
        " max(started_at) < min(finished_at) AS overlapped FROM agent_runs",
    )
    assert (rows[0]["n"], rows[0]["ok"]) == (120, 120)
    # Every run was in flight while every other was: the burst took one model latency, not 15.
    assert rows[0]["overlapped"] is True
    assert fake_openai.request_count == 120


async def test_a_model_limited_to_two_never_runs_three_across_two_worker_processes(
    engine: AsyncEngine,
    factories: Factories,
    fake_openai: FakeOpenAIServer,  # noqa: F811
    stack: Stack,  # noqa: F811
    sender: None,
) -> None:
    model = await fake_model(factories, fake_openai, max_concurrent_runs=2)
    fake_openai.script(lambda _: text_reply("ok", delay_seconds=0.5))
    agent_ids, _ = await agents_on(factories, model["id"], 12)
    stack.worker(threads=4)
    stack.worker(threads=4)
    stack.clock()
    run_ids = await request_all(engine, agent_ids)

    samples = []
    while not await all_terminal(engine, run_ids):
        samples.append(await count_running(engine, model_id=model["id"]))
        await asyncio.sleep(0.02)

    assert max(samples) == 2, samples  # two side by side, never three
    assert fake_openai.max_active_requests == 2
    rows = await fetch(
        engine, "SELECT id FROM agent_runs WHERE id = ANY(:ids) ORDER BY started_at", ids=run_ids
    )
    started = [r["id"] for r in rows]
    # Oldest first: at each point the runs started are the oldest ones (pairs in either order).
    assert [set(started[i : i + 2]) for i in range(0, 12, 2)] == [
        set(run_ids[i : i + 2]) for i in range(0, 12, 2)
    ]
    states = await fetch(engine, "SELECT DISTINCT state FROM agent_runs")
    assert states == [{"state": "succeeded"}]


async def test_a_due_agent_runs_within_a_tick_while_40_long_runs_are_in_flight(
    engine: AsyncEngine,
    factories: Factories,
    fake_openai: FakeOpenAIServer,  # noqa: F811
    slow_model_server: FakeOpenAIServer,
    stack: Stack,  # noqa: F811
    sender: None,
) -> None:
    slow = await fake_model(factories, slow_model_server)
    quick = await fake_model(factories, fake_openai)
    long_agents, _ = await agents_on(factories, slow["id"], 40)
    (due_agent,), _ = await agents_on(
        factories, quick["id"], 1, schedule={"type": "interval", "every_hours": 1}
    )
    slow_model_server.hold()
    stack.worker(threads=4)
    stack.clock()
    long_runs = await request_all(engine, long_agents)
    await until(lambda: slow_model_server.active_requests == 40, "40 long runs in flight")

    async with engine.begin() as conn:
        await conn.execute(
            text("UPDATE agents SET next_run_at = now() - interval '1 second' WHERE id = :a"),
            {"a": due_agent},
        )

    async def scheduled_run_succeeded() -> bool:
        rows = await fetch(
            engine,
            "SELECT state, trigger FROM agent_runs WHERE agent_id = :a",
            a=due_agent,
        )
        return rows == [{"state": "succeeded", "trigger": "scheduled"}]

    await eventually(scheduled_run_succeeded, within=30, what="the due agent's run")
    # ... while every long run is still in flight.
    assert await count_running(engine, model_id=slow["id"]) == 40
    slow_model_server.release()
    await eventually(lambda: all_terminal(engine, long_runs), within=60, what="the long runs")


async def test_sigkill_of_a_worker_with_50_runs_in_flight_ends_every_one_none_twice(
    engine: AsyncEngine,
    factories: Factories,
    fake_openai: FakeOpenAIServer,  # noqa: F811
    stack: Stack,  # noqa: F811
    sender: None,
) -> None:
    model = await fake_model(factories, fake_openai)
    agent_ids, markers = await agents_on(factories, model["id"], 50)
    fake_openai.hold()
    victim = stack.worker(threads=4)
    run_ids = await request_all(engine, agent_ids)
    await until(lambda: fake_openai.active_requests == 50, "50 runs in flight")

    victim.kill()
    stack.worker(threads=4)
    stack.clock()  # the reaper fails the silent runs
    await eventually(lambda: all_terminal(engine, run_ids), within=60, what="every run to end")

    rows = await fetch(
        engine, "SELECT state, reason FROM agent_runs WHERE id = ANY(:ids)", ids=run_ids
    )
    assert {(r["state"], r["reason"]) for r in rows} == {("failed", "stale")}
    assert set(marker_counts(fake_openai, markers).values()) == {1}  # none executed twice
    fake_openai.release()
    again = await request_all(engine, agent_ids)  # the agents' locks were released
    await eventually(lambda: all_terminal(engine, again), within=60, what="the reruns")
    states = await fetch(
        engine, "SELECT DISTINCT state FROM agent_runs WHERE id = ANY(:ids)", ids=again
    )
    assert states == [{"state": "succeeded"}]
    assert await invariant_violations(engine) == []


async def test_a_full_in_flight_set_leaves_further_messages_to_other_workers(
    engine: AsyncEngine,
    factories: Factories,
    fake_openai: FakeOpenAIServer,  # noqa: F811
    stack: Stack,  # noqa: F811
    sender: None,
) -> None:
    model = await fake_model(factories, fake_openai)
    agent_ids, _ = await agents_on(factories, model["id"], 8)
    fake_openai.hold()
    # One thread, two runs in flight: Dramatiq's prefetch (2 x threads) bounds what it holds.
    stack.worker(1, "--runs-in-flight", "2")
    run_ids = await request_all(engine, agent_ids)
    broker = redis.Redis.from_url(stack.settings.redis_url or "")
    try:

        async def settled() -> bool:
            in_broker = broker.llen("dramatiq:runs")
            return bool(await count_running(engine) == 2 and in_broker == 4)

        await eventually(settled, within=30, what="two running, four left in the broker")
        await asyncio.sleep(0.5)
        assert await count_running(engine) == 2  # nothing more claimed

        stack.worker(4, "--runs-in-flight", "10")
        await until(lambda: fake_openai.active_requests == 6, "the second worker's four runs")
        assert await count_running(engine) == 6
    finally:
        broker.close()
    fake_openai.release()
    await eventually(lambda: all_terminal(engine, run_ids), within=60, what="every run to end")
    states = await fetch(engine, "SELECT DISTINCT state FROM agent_runs")
    assert states == [{"state": "succeeded"}]


@pytest.mark.parametrize("command", ["worker", "clock"])
def test_contradicting_settings_are_refused_at_start(settings: Settings, command: str) -> None:
    env = settings_env(settings, heartbeat_interval_seconds=30, stale_after_seconds=20)
    done = subprocess.run(
        agent_engine_command(command), env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2
    assert "AGENT_ENGINE_STALE_AFTER_SECONDS (20) must be greater than" in done.stderr
    assert "Traceback" not in done.stderr
