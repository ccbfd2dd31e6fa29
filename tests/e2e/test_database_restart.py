"""PostgreSQL restarts under load.

What the user sees: /readyz says the database is down (503) while it is, then ready again without
the api process being restarted; the workers reconnect and every run ends terminal; a dashboard's
open subscription keeps receiving events (the api's LISTEN connection reconnected).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
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
    subscriptions_open,
    token,
    websocket,
)
from tests.support.factories import Factories

pytestmark = pytest.mark.slow

AGENTS = 8
START = "mutation($id: ID!) { startRun(agentId: $id) { id state reason } }"
EVENTS = "subscription { runEvents { previousState run { id state } } }"


async def test_postgres_restart_readyz_reports_it_and_everything_recovers(
    servers: Servers,
    engine: AsyncEngine,
    factories: Factories,
    fake_openai: FakeOpenAIServer,  # noqa: F811
    stack: Stack,  # noqa: F811
) -> None:
    if servers.embedded is None or servers.embedded.postgres is None:
        pytest.skip("needs the embedded PostgreSQL (DATABASE_URL points at a shared server)")
    postgres = servers.embedded.postgres
    # Long enough that the runs seen running are still mid-flight when the database goes away.
    fake_openai.script(lambda _body: text_reply("ok", delay_seconds=3.0))
    owner, agents = await owner_with_agents(factories, fake_openai, AGENTS)
    api = await stack.api()
    stack.worker(threads=4)
    stack.clock()
    bearer = token(stack.settings, owner)
    client = Client(api.url or "", bearer=bearer)
    try:
        async with websocket(api.url or "") as ws:
            assert (await ws.init(bearer=bearer))["type"] == "connection_ack"
            await ws.subscribe("events", EVENTS)
            await subscriptions_open(api.url or "", 1)
            requested = [
                (await client.data(START, {"id": str(a["id"])}))["startRun"] for a in agents
            ]
            run_ids = [int(r["id"]) for r in requested]

            async def some_running() -> bool:
                rows = await fetch(
                    engine,
                    "SELECT count(*) AS n FROM agent_runs WHERE state = 'running'",
                )
                return bool(rows[0]["n"] >= 2)

            await eventually(some_running, within=20, what="runs mid-flight")
            statuses = await _readyz_during(api.url or "", postgres.restart)
            down = [body for status, body in statuses if status == 503]
            assert down, f"/readyz never reported the outage: {statuses}"
            assert all("database" in body.get("down", []) for body in down)

            async def ready() -> bool:
                response = await client.http.get(f"{api.url}/readyz")
                return response.status_code == 200 and response.json()["events"] == "listening"

            await eventually(ready, within=30, what="/readyz to be ready again")
            assert api.alive(), "the api process restarted"
            await eventually(
                lambda: all_terminal(engine, run_ids), within=45, what="every run to be terminal"
            )
            assert await invariant_violations(engine) == []

            # The same api process serves again, and the open subscription sees the new run.
            again = (await client.data(START, {"id": str(agents[0]["id"])}))["startRun"]
            assert again["state"] == "QUEUED"
            await eventually(lambda: all_terminal(engine, [int(again["id"])]), within=30)
            seen = await _states_seen(ws, again["id"], within=10)
            assert "SUCCEEDED" in seen, seen
    finally:
        await client.aclose()


async def _readyz_during(url: str, outage: Any) -> list[tuple[int, dict[str, Any]]]:
    """Poll /readyz while `outage` (blocking) runs in a thread, and a little after."""
    statuses: list[tuple[int, dict[str, Any]]] = []
    task = asyncio.ensure_future(asyncio.to_thread(outage))
    async with httpx.AsyncClient(timeout=5.0) as http:
        while not task.done():
            response = await http.get(f"{url}/readyz")
            statuses.append((response.status_code, response.json()))
            await asyncio.sleep(0.05)
    await task
    return statuses


async def _states_seen(ws: Any, run_id: str, *, within: float) -> list[str]:
    seen: list[str] = []
    deadline = time.monotonic() + within
    while "SUCCEEDED" not in seen and (left := deadline - time.monotonic()) > 0:
        try:
            message = await ws.receive(within=left)
        except TimeoutError:
            break
        assert message["type"] == "next", message
        run = message["payload"]["data"]["runEvents"]["run"]
        if run["id"] == run_id:
            seen.append(run["state"])
    return seen
