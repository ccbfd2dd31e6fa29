"""Real `agent-engine worker` and `agent-engine clock` processes: kill, race, many slots."""

from __future__ import annotations

import signal
import subprocess
from datetime import UTC, datetime
from pathlib import Path

import dramatiq
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from agent_engine.domain.runs import RunTrigger
from agent_engine.runs.request import request_run
from agent_engine.settings import Settings
from agent_engine.testing.fake_openai import FakeOpenAIServer, text_reply
from agent_engine.workers.broker import enqueue_execute
from tests.e2e.support import more_ticks
from tests.integration.conftest import broker, fake_agent, fake_openai  # noqa: F401 (fixtures)
from tests.integration.runs.support import (
    FakeAgent,
    agent_engine_command,
    eventually,
    fetch,
    processes,
    run_row,
    settings_env,
)
from tests.support.factories import Factories

pytestmark = pytest.mark.slow

WORKER = agent_engine_command("worker", "--threads", "4")
CLOCK = agent_engine_command("clock")


def now() -> datetime:
    return datetime.now(UTC)


async def test_sigkilled_worker_run_goes_stale_and_the_agent_runs_again(
    engine: AsyncEngine,
    settings: Settings,
    fake_openai: FakeOpenAIServer,  # noqa: F811
    fake_agent: FakeAgent,  # noqa: F811
    broker: dramatiq.Broker,  # noqa: F811
    tmp_path: Path,
) -> None:
    agent = await fake_agent()
    fake_openai.enqueue(text_reply("Never delivered.", delay_seconds=120))
    env = settings_env(settings)

    with processes([WORKER], env=env, log_dir=tmp_path) as (victim,):
        doomed = await request_run(
            engine, agent["id"], trigger=RunTrigger.MANUAL, now=now(), enqueue=enqueue_execute
        )

        async def beating() -> bool:
            row = await run_row(engine, doomed.id)
            return bool(row["state"] == "running" and row["heartbeat_at"] > row["started_at"])

        await eventually(beating, what="the run to be mid-flight")
        victim.send_signal(signal.SIGKILL)
        victim.wait()

    with processes([WORKER, CLOCK], env=env, log_dir=tmp_path) as survivors:
        reaped = await eventually(
            lambda: _row_in_state(engine, doomed.id, "failed"),
            within=settings.stale_after_seconds + 15,
            what="the reaper to fail the silent run",
        )
        assert reaped["reason"] == "stale"
        again = await request_run(
            engine, agent["id"], trigger=RunTrigger.MANUAL, now=now(), enqueue=enqueue_execute
        )
        assert again.state == "queued"
        done = await eventually(
            lambda: _row_in_state(engine, again.id, "succeeded"), what="the next run"
        )
        assert done["output"] == "ok"
    assert [p.returncode for p in survivors] == [0, 0]  # SIGTERM stops them cleanly


async def test_three_clocks_and_two_workers_journal_exactly_one_row_per_slot(
    engine: AsyncEngine,
    settings: Settings,
    factories: Factories,
    fake_openai: FakeOpenAIServer,  # noqa: F811
    fake_agent: FakeAgent,  # noqa: F811
    tmp_path: Path,
) -> None:
    first = await fake_agent(schedule={"type": "interval", "every_hours": 1})
    agent_ids = [first["id"]]
    for _ in range(29):
        more = await factories.agent(
            model_id=first["model_id"], schedule={"type": "interval", "every_hours": 1}
        )
        agent_ids.append(more["id"])
    rounds = 4
    env = settings_env(settings)
    many_processes = agent_engine_command("worker", "--processes", "2", "--threads", "2")

    async def all_finished() -> bool:
        unfinished = await fetch(
            engine, "SELECT count(*) AS n FROM agent_runs WHERE state IN ('queued', 'running')"
        )
        return bool(unfinished[0]["n"] == 0)

    with processes([CLOCK, CLOCK, CLOCK, WORKER, many_processes], env=env, log_dir=tmp_path):
        for slot in range(1, rounds + 1):
            # The slot arrives for every agent at once.
            async with engine.begin() as conn:
                await conn.execute(
                    text(
                        "UPDATE agents SET next_run_at = now() - interval '1 second'"
                        " WHERE id = ANY(:ids)"
                    ),
                    {"ids": agent_ids},
                )

            async def all_advanced() -> bool:
                due = await fetch(
                    engine,
                    "SELECT count(*) AS n FROM agents WHERE id = ANY(:ids)"
                    " AND (next_run_at IS NULL OR next_run_at <= now())",
                    ids=agent_ids,
                )
                return bool(due[0]["n"] == 0)

            # Generous: the first slot waits for five processes to start on a busy 2-core machine.
            await eventually(
                all_advanced, within=60, what=f"slot {slot} to be claimed by every agent"
            )
            await eventually(all_finished, what=f"the runs of slot {slot} to finish")
        await more_ticks(engine, 2)  # each saw every slot advanced: nothing more is journalled

    per_agent = await fetch(
        engine,
        "SELECT agent_id, count(*) AS n, count(*) FILTER (WHERE state = 'succeeded') AS ok"
        " FROM agent_runs GROUP BY agent_id",
    )
    assert {r["agent_id"] for r in per_agent} == set(agent_ids)
    assert {r["n"] for r in per_agent} == {rounds}
    # An instant model finishes long before the next slot: no slot found its agent busy.
    assert {r["ok"] for r in per_agent} == {rounds}
    outputs = await fetch(engine, "SELECT DISTINCT output, trigger FROM agent_runs")
    assert outputs == [{"output": "ok", "trigger": "scheduled"}]
    nexts = await fetch(
        engine,
        "SELECT count(*) AS n FROM agents WHERE id = ANY(:ids) AND next_run_at > now()",
        ids=agent_ids,
    )
    assert nexts[0]["n"] == len(agent_ids)


async def _row_in_state(engine: AsyncEngine, run_id: int, state: str) -> dict[str, object] | None:
    row = await run_row(engine, run_id)
    return row if row["state"] == state else None


def test_the_worker_command_rejects_unknown_queues(settings: Settings, tmp_path: Path) -> None:
    done = subprocess.run(
        agent_engine_command("worker", "--queues", "nope"),
        env=settings_env(settings),
        capture_output=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert b"unknown queues" in done.stderr
