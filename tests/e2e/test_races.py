"""Races: many clients interleave manual starts, switches, admin pauses, model removal and
re-picks while scheduled slots keep arriving — through a real api, worker and clock.

The invariants are sampled throughout, not only at the end: at most one unfinished run per agent,
`next_run_at` NULL whenever the start gate is closed, and the weekly budget never overrun by more
than the runs already in flight when it was reached. No request may fail with a server error.
"""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from agent_engine.testing.fake_openai import FakeOpenAIServer, text_reply
from tests.e2e.support import (  # noqa: F401 (fixtures)
    FAKE_KEY_ENV,
    Client,
    Stack,
    all_terminal,
    codes,
    eventually,
    fake_model,
    fake_openai,
    fetch,
    invariant_violations,
    stack,
    token,
)
from tests.support.factories import Factories

pytestmark = pytest.mark.slow

OWNERS = 3
AGENTS_PER_OWNER = 3
CLIENTS_PER_OWNER = 2
TOKENS_PER_RUN = 15  # the fake's usage: 10 prompt + 5 completion, one model call per run
WEEKLY_CAP = 60
LOAD_SECONDS = 10.0
EXPECTED_CODES = {"AGENT_NOT_STARTABLE", "BAD_USER_INPUT", "NOT_FOUND"}

START = "mutation($id: ID!) { startRun(agentId: $id) { id state reason } }"
ENABLE = "mutation($id: ID!, $on: Boolean!) { setAgentEnabled(id: $id, enabled: $on) { id } }"
PAUSE = "mutation($id: ID!, $p: Boolean!) { setAdminPaused(agentId: $id, paused: $p) { id } }"
PICK_MODEL = "mutation($id: ID!, $m: ID!) { updateAgent(id: $id, input: {modelId: $m}) { id } }"
SCHEDULE = (
    "mutation($id: ID!, $s: ScheduleInput) { updateAgent(id: $id, input: {schedule: $s}) { id } }"
)
REMOVE_MODEL = "mutation($id: ID!) { removeAgentModel(id: $id) }"
ADD_MODEL = """
mutation($name: String!, $url: String!, $env: String!) {
  upsertAgentModel(input: {name: $name, provider: "openai", model: "fake-model",
                           baseUrl: $url, apiKeyEnv: $env}) { id }
}
"""
HOURLY = {"interval": {"everyHours": 1}}


async def test_interleaved_clients_keep_the_invariants(
    engine: AsyncEngine,
    factories: Factories,
    fake_openai: FakeOpenAIServer,  # noqa: F811
    stack: Stack,  # noqa: F811
) -> None:
    fake_openai.script(lambda _body: text_reply("ok", delay_seconds=0.2))
    await factories.setting("agent_weekly_token_cap", WEEKLY_CAP)
    model = {"id": str((await fake_model(factories, fake_openai))["id"])}
    owners: dict[int, list[str]] = {}
    for _ in range(OWNERS):
        owner = (await factories.user())["id"]
        owners[owner] = [
            str(
                (
                    await factories.agent(
                        user_id=owner,
                        model_id=int(model["id"]),
                        schedule={"type": "interval", "every_hours": 1},
                    )
                )["id"]
            )
            for _ in range(AGENTS_PER_OWNER)
        ]
    admin_id = (await factories.user())["id"]
    all_agents = [a for agents in owners.values() for a in agents]
    api = await stack.api()
    worker = stack.worker(threads=4)
    stack.clock()

    async def worker_started() -> bool:
        return "worker started" in worker.log_tail(100_000)

    # The load starts once the worker consumes: on a busy machine it may take seconds to start,
    # and a load run without it proves nothing about the budget.
    await eventually(worker_started, within=60, what="the worker to start")
    admin = Client(api.url or "", bearer=token(stack.settings, admin_id, admin=True))
    clients = [
        (Client(api.url or "", bearer=token(stack.settings, owner)), agents)
        for owner, agents in owners.items()
        for _ in range(CLIENTS_PER_OWNER)
    ]
    violations: list[str] = []
    unexpected: list[Any] = []
    requests = 0
    stop = asyncio.Event()

    async def call(client: Client, query: str, variables: dict[str, Any]) -> dict[str, Any]:
        nonlocal requests
        requests += 1
        response = await client.post(query, variables)
        if response.status_code != 200:
            unexpected.append((response.status_code, response.text[:300]))
            return {}
        body: dict[str, Any] = response.json()
        if set(codes(body)) - EXPECTED_CODES:
            unexpected.append(body)
        return body

    async def owner_client(client: Client, agents: list[str], seed: int) -> None:
        rng = random.Random(seed)
        while not stop.is_set():
            agent = rng.choice(agents)
            roll = rng.random()
            if roll < 0.5:
                await call(client, START, {"id": agent})
            elif roll < 0.7:
                await call(client, ENABLE, {"id": agent, "on": rng.random() < 0.7})
            elif roll < 0.85:
                await call(client, PICK_MODEL, {"id": agent, "m": model["id"]})
            else:
                await call(
                    client, SCHEDULE, {"id": agent, "s": HOURLY if rng.random() < 0.8 else None}
                )

    async def admin_client() -> None:
        rng = random.Random(7)
        removed_at = time.monotonic()
        while not stop.is_set():
            if time.monotonic() - removed_at > 1.5:
                # The admin removes the model and offers a new one; owners re-pick it.
                await call(admin, REMOVE_MODEL, {"id": model["id"]})
                body = await call(
                    admin,
                    ADD_MODEL,
                    {
                        "name": f"Fake {time.monotonic_ns()}",
                        "url": fake_openai.base_url,
                        "env": FAKE_KEY_ENV,
                    },
                )
                model["id"] = body["data"]["upsertAgentModel"]["id"]
                removed_at = time.monotonic()
            await call(admin, PAUSE, {"id": rng.choice(all_agents), "p": rng.random() < 0.3})
            await asyncio.sleep(0.05)

    async def slots() -> None:
        # Every scheduled agent's slot arrives, again and again; the trigger clears closed ones.
        # Locked in id order, as every multi-row write of agents in the engine does.
        while not stop.is_set():
            async with engine.begin() as conn:
                await conn.execute(
                    text(
                        "UPDATE agents SET next_run_at = now() WHERE id IN (SELECT id FROM agents"
                        " WHERE schedule IS NOT NULL ORDER BY id FOR NO KEY UPDATE)"
                    )
                )
            await asyncio.sleep(0.3)

    async def checker() -> None:
        while not stop.is_set():
            violations.extend(await invariant_violations(engine))
            await asyncio.sleep(0.05)

    async def timer() -> None:
        await asyncio.sleep(LOAD_SECONDS)
        stop.set()

    try:
        await asyncio.gather(
            timer(),
            slots(),
            checker(),
            admin_client(),
            *(owner_client(c, agents, i) for i, (c, agents) in enumerate(clients)),
        )
        assert violations == []
        # Above all no INTERNAL (e.g. removeAgentModel picked as a deadlock's victim).
        assert unexpected == []
        assert requests > 200
        await eventually(lambda: all_terminal(engine), within=30, what="every run to finish")
        assert await invariant_violations(engine) == []
        spent = await fetch(
            engine,
            "SELECT a.user_id, sum(r.tokens_used) AS used,"
            " count(*) FILTER (WHERE r.reason = 'budget_exceeded') AS refused"
            " FROM agent_runs r JOIN agents a ON a.id = r.agent_id GROUP BY a.user_id",
        )
        assert {r["user_id"] for r in spent} == set(owners)
        for row in spent:
            # Reached, then overrun by at most the runs in flight (one per agent) at that moment.
            assert row["used"] <= WEEKLY_CAP + AGENTS_PER_OWNER * TOKENS_PER_RUN, row
        journal = await fetch(
            engine, "SELECT state, reason, count(*) AS n FROM agent_runs GROUP BY 1, 2"
        )
        assert any(r["refused"] > 0 for r in spent), f"the cap was never reached: {journal}"
        triggers = await fetch(engine, "SELECT DISTINCT trigger FROM agent_runs ORDER BY trigger")
        assert triggers == [{"trigger": "manual"}, {"trigger": "scheduled"}]
        assert await admin.healthz() == 200
    finally:
        await admin.aclose()
        for client, _ in clients:
            await client.aclose()
