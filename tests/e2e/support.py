"""Shared helpers of the reliability and security suite: real processes, a GraphQL client,
invariant probes.

Every process is a real `agent-engine …` command (api, worker, clock) started with the test's
settings through the environment, its output kept in the test's tmp dir. Nothing is mocked: the
model is the FakeOpenAIServer (a real HTTP server in this process), the database and the broker
are the session's embedded PostgreSQL and Valkey.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from agent_engine.embedded import free_port
from agent_engine.settings import Settings
from agent_engine.testing.fake_openai import FakeOpenAIServer
from tests.integration.conftest import fake_openai
from tests.integration.runs.support import (
    FAKE_KEY_ENV,
    POLL_SECONDS,
    agent_engine_command,
    eventually,
    fetch,
    settings_env,
)
from tests.support.factories import Factories
from tests.support.graphql import (
    LEGACY_WS,
    TRANSPORT_WS,
    GraphQL,
    GraphQLWs,
    codes,
    token,
    websocket,
)

__all__ = [
    "FAKE_KEY_ENV",
    "LEGACY_WS",
    "TRANSPORT_WS",
    "Client",
    "GraphQLWs",
    "Stack",
    "agent_engine_command",
    "codes",
    "eventually",
    "fake_openai",
    "fetch",
    "settings_env",
    "subscriptions_open",
    "token",
    "websocket",
]

PROCESS_START_SECONDS = 40.0
PROCESS_STOP_SECONDS = 15.0
# How long to collect the replies a burst of messages provokes (a window, not a speed bound).
QUICK_SECONDS = 2.0

# Short timings, so crashes are noticed within seconds (the defaults are 30 s / 90 s,
# docs/architecture.md §4.5).
FAST = {
    "heartbeat_interval_seconds": 1.0,
    "stale_after_seconds": 3.0,
    "queued_resend_after_seconds": 2.0,
    "schedule_tick_seconds": 0.3,
    "reap_tick_seconds": 0.5,
    "log_format": "console",
}


def fast_settings(settings: Settings, **overrides: Any) -> Settings:
    return settings.model_copy(update={**FAST, **overrides})


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path
    url: str | None = None

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def kill(self) -> None:
        """SIGKILL: no handler runs, nothing is journalled by the process itself."""
        self.popen.send_signal(signal.SIGKILL)
        self.popen.wait(PROCESS_STOP_SECONDS)

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""


@dataclass
class Stack:
    """The processes of one test, stopped (SIGTERM, then SIGKILL) when the test ends."""

    settings: Settings
    log_dir: Path
    procs: list[Proc] = field(default_factory=list)

    @property
    def env(self) -> dict[str, str]:
        return settings_env(self.settings)

    def _start(self, name: str, *args: str) -> Proc:
        number = len(self.procs)
        log_path = self.log_dir / f"{number:02d}-{name}.log"
        with log_path.open("wb") as log:
            popen = subprocess.Popen(
                agent_engine_command(*args), env=self.env, stdout=log, stderr=subprocess.STDOUT
            )
        proc = Proc(name, popen, log_path)
        self.procs.append(proc)
        return proc

    def worker(self, threads: int | None = 4, *options: str) -> Proc:
        """`agent-engine worker`; `threads=None` leaves the default, `options` are passed on."""
        thread_options = ("--threads", str(threads)) if threads is not None else ()
        return self._start("worker", "worker", *thread_options, *options)

    def clock(self) -> Proc:
        return self._start("clock", "clock")

    async def api(self) -> Proc:
        port = free_port()
        proc = self._start("api", "serve", "--host", "127.0.0.1", "--port", str(port))
        proc.url = f"http://127.0.0.1:{port}"
        await wait_healthy(proc)
        return proc

    def stop(self) -> None:
        for proc in self.procs:
            if proc.alive():
                proc.popen.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.popen.wait(PROCESS_STOP_SECONDS)
            except subprocess.TimeoutExpired:
                proc.popen.kill()
                proc.popen.wait()


async def subscriptions_open(url: str, count: int, within: float = 20.0) -> None:
    """Until the api at `url` holds `count` subscriptions (its `agent_engine_active_subscriptions`
    gauge): graphql-transport-ws acknowledges no subscription, and a subscription is counted once
    it is on the bus, so an event committed after this reaches it."""

    async def probe() -> bool:
        async with httpx.AsyncClient(timeout=5.0) as client:
            metrics = (await client.get(f"{url}/metrics")).text
        for line in metrics.splitlines():
            if line.startswith("agent_engine_active_subscriptions "):
                return float(line.split()[1]) >= count
        return False

    await eventually(probe, within=within, what=f"{count} subscription(s) on {url}")


async def wait_healthy(proc: Proc, within: float = PROCESS_START_SECONDS) -> None:
    deadline = time.monotonic() + within
    async with httpx.AsyncClient(timeout=2.0) as client:
        while True:
            if not proc.alive():
                raise AssertionError(f"{proc.name} exited:\n{proc.log_tail()}")
            try:
                if (await client.get(f"{proc.url}/healthz")).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"{proc.name} not healthy in {within:g}s:\n{proc.log_tail()}")
            await asyncio.sleep(0.1)


@pytest.fixture
def stack(settings: Settings, tmp_path: Path) -> Iterator[Stack]:
    running = Stack(fast_settings(settings), tmp_path)
    try:
        yield running
    finally:
        running.stop()


async def fake_model(factories: Factories, fake: FakeOpenAIServer, **values: Any) -> dict[str, Any]:
    values.setdefault("name", f"Fake {time.monotonic_ns()}")
    return await factories.model(
        provider="openai",
        model="fake-model",
        base_url=fake.base_url,
        api_key_env=FAKE_KEY_ENV,
        **values,
    )


async def owner_with_agents(
    factories: Factories, fake: FakeOpenAIServer, count: int
) -> tuple[int, list[dict[str, Any]]]:
    """A new owner with `count` agents on the fake model."""
    owner = (await factories.user())["id"]
    model = await fake_model(factories, fake)
    agents = [
        await factories.agent(user_id=owner, model_id=model["id"], name=f"a{i}")
        for i in range(count)
    ]
    return owner, agents


@dataclass
class Client(GraphQL):
    """The shared GraphQL client as a frontend sends it (`bearer`: the session's token); no answer
    may carry an INTERNAL error."""

    no_internal: bool = True

    async def healthz(self) -> int:
        return (await self.http.get(f"{self.url}/healthz")).status_code


# --- invariants (docs/architecture.md §3, §4) -----------------------------------------------------

_DOUBLE_UNFINISHED = (
    "SELECT agent_id, count(*) AS n FROM agent_runs WHERE state IN ('queued', 'running')"
    " GROUP BY agent_id HAVING count(*) > 1"
)
_OPEN_SLOT_ON_CLOSED_GATE = (
    "SELECT id, enabled, admin_paused, model_id, schedule, next_run_at FROM agents"
    " WHERE next_run_at IS NOT NULL"
    " AND NOT (enabled AND NOT admin_paused AND model_id IS NOT NULL AND schedule IS NOT NULL)"
)


async def invariant_violations(engine: AsyncEngine) -> list[str]:
    """What a snapshot of the database shows against the design's invariants."""
    found: list[str] = []
    async with engine.connect() as conn:
        for row in await conn.execute(text(_DOUBLE_UNFINISHED)):
            found.append(f"agent {row.agent_id} has {row.n} unfinished runs")
        for row in await conn.execute(text(_OPEN_SLOT_ON_CLOSED_GATE)):
            found.append(f"agent {row.id} has next_run_at with a closed gate: {dict(row._mapping)}")
    return found


async def ticks_done(engine: AsyncEngine, tick: str = "schedule") -> int:
    """How many `tick` ticks the workers have completed (`engine_activity`, bumped after each)."""
    async with engine.connect() as conn:
        count = await conn.scalar(
            text("SELECT count FROM engine_activity WHERE name = :n"), {"n": f"tick.{tick}"}
        )
    return int(count or 0)


async def more_ticks(engine: AsyncEngine, count: int = 2, tick: str = "schedule") -> None:
    """Wait until `count` more `tick` ticks have completed: each one saw the state as it is now,
    so whatever a tick would wrongly do has been done by then (absence proved by an event)."""
    target = await ticks_done(engine, tick) + count

    async def reached() -> bool:
        return await ticks_done(engine, tick) >= target

    await eventually(reached, what=f"{count} more {tick} ticks")


async def ticks_settled(redis_url: str) -> None:
    """Every tick message already sent has been taken and processed (the Redis broker's queue
    and its in-progress set are empty): after this, no tick arrives unless something sends one."""
    client = redis.Redis.from_url(redis_url)
    try:

        async def settled() -> bool:
            return client.llen("dramatiq:ticks") == 0 and client.hlen("dramatiq:ticks.msgs") == 0

        await eventually(settled, what="the tick messages to be processed")
    finally:
        client.close()


async def holds_for(probe: Callable[[], Awaitable[bool]], *, within: float, what: str) -> None:
    """Fail as soon as `probe` turns false within `within` seconds. Only where no event can
    prove an absence (nothing runs that could announce it, e.g. a killed clock)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not await probe():
            raise AssertionError(f"{what} no longer holds")
        await asyncio.sleep(POLL_SECONDS)


async def unfinished_runs(engine: AsyncEngine) -> int:
    rows = await fetch(
        engine, "SELECT count(*) AS n FROM agent_runs WHERE state IN ('queued', 'running')"
    )
    return int(rows[0]["n"])


async def all_terminal(engine: AsyncEngine, run_ids: list[int] | None = None) -> bool:
    if run_ids is None:
        return await unfinished_runs(engine) == 0
    rows = await fetch(
        engine,
        "SELECT count(*) AS n FROM agent_runs WHERE id = ANY(:ids)"
        " AND state NOT IN ('succeeded', 'failed', 'skipped')",
        ids=run_ids,
    )
    return int(rows[0]["n"]) == 0


def marker_counts(fake: FakeOpenAIServer, markers: list[str]) -> dict[str, int]:
    """How many model calls carried each agent's marker (its prompt is in the system message)."""
    counts = dict.fromkeys(markers, 0)
    for body in fake.requests:
        system = " ".join(
            str(m.get("content")) for m in body.get("messages", []) if m.get("role") == "system"
        )
        for marker in markers:
            if marker in system:
                counts[marker] += 1
    return counts
