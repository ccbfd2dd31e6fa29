"""Broker loss: Valkey restarts (losing every message) while clients keep starting runs.

PostgreSQL is the only source of truth: the reaper re-sends the messages of queued runs nobody
picked up, so every run a client requested ends terminal — and, the model being healthy,
succeeded. The api answers throughout and reports the outage on /readyz.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from agent_engine.testing.fake_openai import FakeOpenAIServer, text_reply
from tests.conftest import Servers
from tests.e2e.support import (  # noqa: F401 (fixtures)
    Client,
    Stack,
    all_terminal,
    eventually,
    fake_openai,
    fetch,
    invariant_violations,
    owner_with_agents,
    stack,
    token,
)
from tests.support.factories import Factories

pytestmark = pytest.mark.slow

AGENTS = 10
LOAD_SECONDS = 6.0
START = "mutation($id: ID!) { startRun(agentId: $id) { id state reason } }"


async def test_valkey_restart_under_load_loses_no_run(
    servers: Servers,
    engine: AsyncEngine,
    factories: Factories,
    fake_openai: FakeOpenAIServer,  # noqa: F811
    stack: Stack,  # noqa: F811
) -> None:
    if servers.embedded is None or servers.embedded.valkey is None:
        pytest.skip("needs the embedded Valkey (REDIS_URL points at a shared server)")
    valkey = servers.embedded.valkey
    fake_openai.script(lambda _body: text_reply("ok", delay_seconds=0.3))
    owner, agents = await owner_with_agents(factories, fake_openai, AGENTS)
    api = await stack.api()
    stack.worker(threads=4)
    stack.clock()
    client = Client(api.url or "", bearer=token(stack.settings, owner))
    requested: list[dict[str, str]] = []
    readiness: set[int] = set()

    async def load() -> None:
        deadline = time.monotonic() + LOAD_SECONDS
        while time.monotonic() < deadline:
            for agent in agents:
                data = await client.data(START, {"id": str(agent["id"])})
                requested.append(data["startRun"])
            readiness.add((await client.http.get(f"{api.url}/readyz")).status_code)
            await asyncio.sleep(0.1)

    async def outage() -> None:
        await asyncio.sleep(1.5)
        await asyncio.to_thread(valkey.restart)

    try:
        await asyncio.gather(load(), outage())
        assert await client.healthz() == 200
        queued = [int(r["id"]) for r in requested if r["state"] == "QUEUED"]
        assert len(queued) >= AGENTS
        await eventually(
            lambda: all_terminal(engine, queued), within=45, what="every queued run to finish"
        )
        outcomes = await fetch(
            engine,
            "SELECT state, count(*) AS n FROM agent_runs WHERE id = ANY(:ids) GROUP BY state",
            ids=queued,
        )
        assert outcomes == [{"state": "succeeded", "n": len(queued)}]
        skipped = {r["reason"] for r in requested if r["state"] == "SKIPPED"}
        assert skipped <= {"ALREADY_RUNNING"}
        assert await invariant_violations(engine) == []
        ready = await client.http.get(f"{api.url}/readyz")
        assert ready.status_code == 200, ready.text
        assert readiness <= {200, 503}
        # The agents still work after the outage, through the same api and worker processes.
        again = (await client.data(START, {"id": str(agents[0]["id"])}))["startRun"]
        await eventually(lambda: all_terminal(engine, [int(again["id"])]), within=20)
    finally:
        await client.aclose()
