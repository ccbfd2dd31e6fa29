"""Crashes: a worker or the clock is SIGKILLed in the middle of the work.

What the user sees: every requested run ends in a terminal state in the journal, none is executed
twice (the model server counts the calls carrying each agent's marker), the agents can run again,
and a restarted clock fires each missed slot once.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from agent_engine.testing.fake_openai import FakeOpenAIServer, ScriptResult, text_reply
from tests.e2e.support import (  # noqa: F401 (fixtures)
    Client,
    Stack,
    all_terminal,
    eventually,
    fake_model,
    fake_openai,
    fetch,
    holds_for,
    invariant_violations,
    marker_counts,
    more_ticks,
    stack,
    ticks_settled,
    token,
)
from tests.support.factories import Factories

pytestmark = pytest.mark.slow

AGENTS = 16
# Long enough that runs seen running are still running when the kill lands, even under load.
MODEL_DELAY_SECONDS = 4.0
# The first agents answer at once, so "some done while others still run" is a wide window and not
# a moment the probe may miss: every run is in flight together on one worker.
QUICK_AGENTS = 2
QUICK_DELAY_SECONDS = 0.05
START = "mutation($id: ID!) { startRun(agentId: $id) { id state reason } }"


async def _owners_agents(
    factories: Factories, fake: FakeOpenAIServer, count: int, **values: object
) -> tuple[int, list[dict[str, object]], list[str]]:
    owner = (await factories.user())["id"]
    model = await fake_model(factories, fake)
    agents, markers = [], []
    for index in range(count):
        marker = f"MARK-{index}-{uuid.uuid4().hex[:8]}"
        markers.append(marker)
        agents.append(
            await factories.agent(
                user_id=owner,
                model_id=model["id"],
                name=f"agent {index}",
                prompt=f"Report {marker}.",
                **values,
            )
        )
    return owner, agents, markers


async def test_sigkill_worker_mid_runs_every_run_terminal_none_twice_agents_run_again(
    engine: AsyncEngine,
    factories: Factories,
    fake_openai: FakeOpenAIServer,  # noqa: F811
    stack: Stack,  # noqa: F811
) -> None:
    owner, agents, markers = await _owners_agents(factories, fake_openai, AGENTS)
    quick = markers[:QUICK_AGENTS]

    def reply(body: dict[str, Any]) -> ScriptResult:
        asked = str(body.get("messages"))
        quick_one = any(marker in asked for marker in quick)
        delay = QUICK_DELAY_SECONDS if quick_one else MODEL_DELAY_SECONDS
        return text_reply("ok", delay_seconds=delay)

    fake_openai.script(reply)
    api = await stack.api()
    victim = stack.worker(threads=4)
    client = Client(api.url or "", bearer=token(stack.settings, owner))
    try:
        started = [(await client.data(START, {"id": str(a["id"])}))["startRun"] for a in agents]
        assert {s["state"] for s in started} == {"QUEUED"}
        run_ids = [int(s["id"]) for s in started]

        async def some_running_some_done() -> bool:
            rows = await fetch(
                engine,
                "SELECT count(*) FILTER (WHERE state = 'running') AS running,"
                " count(*) FILTER (WHERE state = 'succeeded') AS done FROM agent_runs",
            )
            return bool(rows[0]["running"] >= 2 and rows[0]["done"] >= 1)

        await eventually(some_running_some_done, within=30, what="runs mid-flight")
        victim.kill()
        stack.worker(threads=4)
        stack.clock()  # the reaper fails the silent runs and re-sends the unclaimed ones
        await eventually(
            lambda: all_terminal(engine, run_ids), within=60, what="every run to be terminal"
        )
        rows = await fetch(engine, "SELECT id, agent_id, state, reason FROM agent_runs ORDER BY id")
        assert len(rows) == AGENTS
        by_state = {r["state"] for r in rows}
        assert by_state <= {"succeeded", "failed"}
        assert {r["reason"] for r in rows if r["state"] == "failed"} <= {"stale"}
        assert any(r["state"] == "failed" for r in rows), "no run was caught mid-flight"
        calls = marker_counts(fake_openai, markers)
        # One model call per run: succeeded ones exactly once, none of them twice.
        assert max(calls.values()) == 1, calls
        for row, marker in zip(rows, markers, strict=True):
            if row["state"] == "succeeded":
                assert calls[marker] == 1

        # The agents run again: the lock of the killed runs was released.
        again = [(await client.data(START, {"id": str(a["id"])}))["startRun"] for a in agents]
        assert {s["state"] for s in again} == {"QUEUED"}
        again_ids = [int(s["id"]) for s in again]
        await eventually(lambda: all_terminal(engine, again_ids), within=60, what="the reruns")
        states = await fetch(
            engine, "SELECT DISTINCT state FROM agent_runs WHERE id = ANY(:ids)", ids=again_ids
        )
        assert states == [{"state": "succeeded"}]
        assert await invariant_violations(engine) == []
    finally:
        await client.aclose()


async def test_sigkill_clock_restarted_clock_resumes_no_slot_doubled(
    engine: AsyncEngine,
    factories: Factories,
    fake_openai: FakeOpenAIServer,  # noqa: F811
    stack: Stack,  # noqa: F811
) -> None:
    _, agents, _ = await _owners_agents(
        factories, fake_openai, 10, schedule={"type": "interval", "every_hours": 1}
    )
    ids = [int(str(a["id"])) for a in agents]

    async def make_due(ago: str) -> None:
        async with engine.begin() as conn:
            await conn.execute(
                text(
                    f"UPDATE agents SET next_run_at = now() - interval '{ago}' WHERE id = ANY(:i)"
                ),
                {"i": ids},
            )

    async def runs_per_agent() -> dict[int, int]:
        rows = await fetch(
            engine, "SELECT agent_id, count(*) AS n FROM agent_runs GROUP BY agent_id"
        )
        return {int(r["agent_id"]): int(r["n"]) for r in rows}

    async def slot_fired(expected: int) -> bool:
        counts = await runs_per_agent()
        return counts == dict.fromkeys(ids, expected) and await all_terminal(engine)

    stack.worker(threads=4)
    clock = stack.clock()
    await make_due("1 second")
    await eventually(lambda: slot_fired(1), within=30, what="the first slot")
    clock.kill()
    await ticks_settled(stack.settings.redis_url or "")  # what the clock sent is processed
    # Slots missed while the clock is dead, several hours' worth: coalesced into one run each.
    # Nothing runs that could announce a tick, so the journal is watched for a while instead.
    await make_due("5 hours")

    async def one_run_each() -> bool:
        return await runs_per_agent() == dict.fromkeys(ids, 1)

    await holds_for(one_run_each, within=3.0, what="one run per agent without a clock")
    stack.clock()
    await eventually(lambda: slot_fired(2), within=30, what="the restarted clock to fire")
    await more_ticks(engine, 2)  # each saw the advanced slots: no doubled slot
    assert await runs_per_agent() == dict.fromkeys(ids, 2)
    nexts = await fetch(
        engine,
        "SELECT count(*) AS n FROM agents WHERE id = ANY(:i) AND next_run_at > now()",
        i=ids,
    )
    assert nexts[0]["n"] == len(ids)
    states = await fetch(engine, "SELECT DISTINCT state, trigger FROM agent_runs")
    assert states == [{"state": "succeeded", "trigger": "scheduled"}]
