"""The worker's in-flight set on a real Dramatiq worker (in this process) over real Valkey: runs
are tasks, not threads; a stopping worker interrupts what it runs and gives back what it did not
claim; the settings reach the runtime."""

from __future__ import annotations

from datetime import UTC, datetime

import dramatiq
from sqlalchemy.ext.asyncio import AsyncEngine

from agent_engine.domain.runs import RunTrigger
from agent_engine.runs.execute import INTERRUPTED_ERROR
from agent_engine.runs.request import request_run
from agent_engine.settings import Settings
from agent_engine.testing.fake_openai import FakeOpenAIServer, FakeToolCall, text_reply, tool_reply
from agent_engine.workers.actors import worker_context
from agent_engine.workers.broker import enqueue_execute
from agent_engine.workers.main import start_worker, stop_worker
from tests.integration.runs.support import FakeAgent, eventually, fetch


async def _request(engine: AsyncEngine, agent_id: int) -> int:
    row = await request_run(
        engine,
        agent_id,
        trigger=RunTrigger.MANUAL,
        now=datetime.now(UTC),
        enqueue=enqueue_execute,
    )
    return row.id


async def _states(engine: AsyncEngine, run_ids: list[int]) -> dict[int, dict[str, object]]:
    rows = await fetch(
        engine, "SELECT id, state, reason, error FROM agent_runs WHERE id = ANY(:ids)", ids=run_ids
    )
    return {int(r["id"]): r for r in rows}


async def test_two_threads_keep_more_runs_in_flight_than_threads(
    engine: AsyncEngine,
    settings: Settings,
    fake_openai: FakeOpenAIServer,
    fake_agent: FakeAgent,
    broker: dramatiq.Broker,
) -> None:
    first = await fake_agent()
    agents = [first] + [await fake_agent(user_id=first["user_id"]) for _ in range(29)]
    fake_openai.hold()
    worker = start_worker(settings, threads=2)
    try:
        run_ids = [await _request(engine, a["id"]) for a in agents]
        # Thirty model calls waiting at once on a worker with two Dramatiq threads.
        await eventually(
            lambda: _true(fake_openai.active_requests == 30), what="30 runs in flight at once"
        )
        fake_openai.release()
        await eventually(lambda: _all_in(engine, run_ids, "succeeded"), what="every run to end")
    finally:
        fake_openai.release()
        stop_worker(worker, grace_seconds=5)


async def test_a_stopping_worker_interrupts_its_runs_and_gives_back_what_it_did_not_claim(
    engine: AsyncEngine,
    settings: Settings,
    fake_openai: FakeOpenAIServer,
    fake_agent: FakeAgent,
    broker: dramatiq.Broker,
) -> None:
    first = await fake_agent()
    agents = [first] + [await fake_agent(user_id=first["user_id"]) for _ in range(4)]
    fake_openai.hold()
    small = settings.model_copy(update={"runs_in_flight": 3})
    worker = start_worker(small, threads=2)
    try:
        run_ids = [await _request(engine, a["id"]) for a in agents]
        await eventually(
            lambda: _true(fake_openai.active_requests == 3), what="a full in-flight set"
        )
        # The other two messages wait for a place before claiming anything.
        await eventually(lambda: _true(worker_context().in_flight.waiting == 2), what="2 waiting")
        states = await _states(engine, run_ids)
        assert sorted(r["state"] for r in states.values()) == ["queued"] * 2 + ["running"] * 3
    finally:
        stop_worker(worker, grace_seconds=0.5)

    states = await _states(engine, run_ids)
    interrupted = [i for i, r in states.items() if r["state"] == "failed"]
    assert len(interrupted) == 3
    for run_id in interrupted:
        assert (states[run_id]["reason"], states[run_id]["error"]) == ("error", INTERRUPTED_ERROR)
    unclaimed = [i for i, r in states.items() if r["state"] == "queued"]
    assert len(unclaimed) == 2

    # Their messages went back to the broker: a new worker runs them (no reaper involved).
    fake_openai.release()
    again = start_worker(settings, threads=2)
    try:
        await eventually(
            lambda: _all_in(engine, unclaimed, "succeeded"), what="the given-back runs"
        )
    finally:
        stop_worker(again, grace_seconds=5)


async def test_the_tool_timeout_setting_reaches_the_workers_runtime(
    engine: AsyncEngine,
    settings: Settings,
    fake_openai: FakeOpenAIServer,
    fake_agent: FakeAgent,
    broker: dramatiq.Broker,
) -> None:
    agent = await fake_agent()
    fake_openai.enqueue(
        tool_reply(FakeToolCall("search_knowledge", {"query": "vpn"})), text_reply("Done.")
    )
    worker = start_worker(settings.model_copy(update={"tool_timeout_seconds": 0.5}), threads=2)
    try:
        # The Knowledge Store is stuck (its table locked): the tool call must give up in 0.5 s,
        # and a tool that cannot answer ends the run (it is not the model's to correct).
        async with engine.connect() as blocker:
            transaction = await blocker.begin()
            await blocker.exec_driver_sql("LOCK TABLE kb_documents IN ACCESS EXCLUSIVE MODE")
            run_id = await _request(engine, agent["id"])
            await eventually(lambda: _all_in(engine, [run_id], "failed"), what="the run to end")
            await transaction.rollback()
    finally:
        stop_worker(worker, grace_seconds=5)
    run = (await _states(engine, [run_id]))[run_id]
    assert run["reason"] == "error"
    assert run["error"] == "tool search_knowledge failed: no answer within 0.5 s"
    assert fake_openai.request_count == 1


async def _all_in(engine: AsyncEngine, run_ids: list[int], state: str) -> bool:
    states = await _states(engine, run_ids)
    return len(states) == len(run_ids) and all(r["state"] == state for r in states.values())


async def _true(value: bool) -> bool:
    return value
