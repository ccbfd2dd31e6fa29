"""Helpers shared by the run-lifecycle tests (integration and e2e): polling, worker processes."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import dramatiq
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from agent_engine.domain.runs import HEARTBEAT_INTERVAL, RunState
from agent_engine.runs.claim import claim_run, utc_now
from agent_engine.runs.execute import RUN_TIMEOUT, execute_claimed
from agent_engine.runs.request import Enqueue
from agent_engine.runtime.loop import Runtime
from agent_engine.settings import Settings
from agent_engine.testing.fake_openai import FakeOpenAIServer
from agent_engine.workers.actors import RUNS_QUEUE, worker_context
from agent_engine.workers.main import EngineWorker
from tests.support.factories import Factories

# Not AGENT_ENGINE_*: the engine never sends its own settings as a model key.
FAKE_KEY_ENV = "AE_TEST_FAKE_OPENAI_KEY"
# The `fake_agent` fixture: `await fake_agent(**agent_values)` -> the agent row.
FakeAgent = Callable[..., Awaitable[dict[str, Any]]]
POLL_SECONDS = 0.05
PROCESS_STOP_SECONDS = 15.0
SETTLE_SECONDS = 20.0


async def eventually(
    probe: Callable[[], Awaitable[Any]], *, within: float = 20.0, what: str = "condition"
) -> Any:
    """Poll `probe` until it returns something truthy; return that."""
    deadline = time.monotonic() + within
    while True:
        value = await probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within:g}s waiting for {what}")
        await asyncio.sleep(POLL_SECONDS)


async def messages_settled(broker: dramatiq.Broker, worker: EngineWorker) -> None:
    """Every `runs` message taken and processed by the in-process `worker`: each actor call has
    returned, so each claim was tried and a won claim handed its run to the in-flight set.
    Redis or RabbitMQ alike (the broker's own `join`, then the worker's)."""
    await asyncio.to_thread(broker.join, RUNS_QUEUE, timeout=int(SETTLE_SECONDS * 1000))
    if worker.runs is not None:
        await asyncio.wait_for(asyncio.to_thread(worker.runs.join), SETTLE_SECONDS)


def runs_in_flight() -> int:
    """Runs executing on this process's worker (tests with an in-process worker)."""
    return worker_context().in_flight.running


async def no_run_in_flight() -> None:
    """This process's worker has no run executing: whatever it started has ended."""

    async def idle() -> bool:
        return runs_in_flight() == 0

    await eventually(idle, what="the worker's in-flight set to empty")


async def execute_run(
    engine: AsyncEngine,
    runtime: Runtime,
    run_id: int,
    *,
    now_fn: Callable[[], datetime] = utc_now,
    heartbeat_interval: timedelta = HEARTBEAT_INTERVAL,
    run_timeout: timedelta = RUN_TIMEOUT,
    enqueue: Enqueue | None = None,
) -> RunState | None:
    """What the `execute_run` actor does with a run, without the broker and the in-flight set:
    production's `claim_run`, then `execute_claimed` when the claim won. Returns the state this
    call left the run in (QUEUED: waiting for a slot of its model), None if it changed nothing."""
    claim = await claim_run(engine, run_id, now=now_fn(), enqueue=enqueue)
    if claim.state is not RunState.RUNNING:
        return claim.state
    return await execute_claimed(
        engine,
        runtime,
        claim,
        now_fn=now_fn,
        heartbeat_interval=heartbeat_interval,
        run_timeout=run_timeout,
        enqueue=enqueue,
    )


async def limited_model(factories: Factories, fake: FakeOpenAIServer, limit: int) -> int:
    """A model on the fake OpenAI server with `max_concurrent_runs = limit`; its id."""
    model = await factories.model(
        name=f"Limited to {limit}",
        provider="openai",
        model="fake-model",
        base_url=fake.base_url,
        api_key_env=FAKE_KEY_ENV,
        max_concurrent_runs=limit,
    )
    return int(model["id"])


async def fetch(engine: AsyncEngine, sql: str, **params: Any) -> list[dict[str, Any]]:
    async with engine.connect() as conn:
        return [dict(r._mapping) for r in await conn.execute(text(sql), params)]


async def run_row(engine: AsyncEngine, run_id: int) -> dict[str, Any]:
    found = await fetch(engine, "SELECT * FROM agent_runs WHERE id = :r", r=run_id)
    return found[0]


def settings_env(settings: Settings, **overrides: object) -> dict[str, str]:
    """The environment that makes a child process load exactly these settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_ENGINE_")}
    for key in ("DATABASE_URL", "REDIS_URL", "BROKER_URL"):
        env.pop(key, None)
    values = settings.model_dump()
    values.update(overrides)
    for name, value in values.items():
        if value is not None:
            env[f"AGENT_ENGINE_{name.upper()}"] = str(value)
    env[FAKE_KEY_ENV] = "test-key"
    return env


def agent_engine_command(*args: str) -> list[str]:
    script = Path(sys.executable).with_name("agent-engine")
    if script.exists():
        return [str(script), *args]
    return [sys.executable, "-c", "from agent_engine.cli import main; main()", *args]


@contextmanager
def processes(
    commands: list[list[str]], *, env: dict[str, str], log_dir: Path
) -> Iterator[list[subprocess.Popen[bytes]]]:
    """Start processes; on exit SIGTERM them and wait (a killed one is simply reaped)."""
    started: list[subprocess.Popen[bytes]] = []
    logs = []
    try:
        for index, command in enumerate(commands):
            log = (log_dir / f"process-{index}-{command[1]}.log").open("wb")
            logs.append(log)
            started.append(subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT))
        yield started
    finally:
        for proc in started:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in started:
            try:
                proc.wait(PROCESS_STOP_SECONDS)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for log in logs:
            log.close()
