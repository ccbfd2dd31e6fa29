"""cancelRun through the public API, with a real worker executing the runs."""

from __future__ import annotations

import time
from collections.abc import Iterator

import dramatiq
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from agent_engine.settings import Settings
from agent_engine.testing.fake_openai import (
    FakeOpenAIServer,
    FakeToolCall,
    error_reply,
    text_reply,
    tool_reply,
)
from agent_engine.workers.main import EngineWorker, start_worker, stop_worker
from tests.integration.runs.support import (
    FakeAgent,
    eventually,
    fetch,
    messages_settled,
    no_run_in_flight,
    runs_in_flight,
)
from tests.integration.runs.transcript.support import CANCEL, START, Gql, error_code
from tests.support.factories import Factories

# Long enough that the run is surely still waiting on the model when the cancel lands.
SLOW_MODEL_SECONDS = 4.0


@pytest.fixture
def settings(settings: Settings) -> Settings:
    """Heartbeats far apart: the worker can learn of a cancel only from the cancel itself."""
    return settings.model_copy(
        update={"heartbeat_interval_seconds": 60.0, "stale_after_seconds": 180.0}
    )


async def _running(gql: Gql, run_id: str, owner: int) -> None:
    async def running() -> bool:
        return (await gql.run(run_id, as_user=owner))["state"] == "RUNNING"

    await eventually(running, what="the run to be running")


async def test_cancelling_a_running_run_stops_it_and_frees_the_agent(
    gql: Gql,
    engine: AsyncEngine,
    fake_openai: FakeOpenAIServer,
    fake_agent: FakeAgent,
    worker: dramatiq.Worker,
) -> None:
    agent = await fake_agent()
    owner = int(agent["user_id"])
    fake_openai.enqueue(
        text_reply("Looked around.", prompt_tokens=40, completion_tokens=2),
        # Would go on with a tool call and a third model call if the worker did not stop.
        tool_reply(
            FakeToolCall("search_knowledge", {"query": "x"}),
            delay_seconds=SLOW_MODEL_SECONDS,
        ),
    )
    fake_openai.enqueue(text_reply("Done.", delay_seconds=0))
    # First run succeeds (one call) so the slow call belongs to the second run.
    first = await gql.data(START, {"id": str(agent["id"])}, as_user=owner)
    await gql.finished_run(first["startRun"]["id"], as_user=owner)
    second = await gql.data(START, {"id": str(agent["id"])}, as_user=owner)
    run_id = second["startRun"]["id"]
    await _running(gql, run_id, owner)
    await eventually(lambda: _model_calls(fake_openai, 2), what="the slow model call")

    asked = time.monotonic()
    cancelled = (await gql.data(CANCEL, {"id": run_id}, as_user=owner))["cancelRun"]
    assert time.monotonic() - asked < 5.0
    assert (cancelled["state"], cancelled["reason"]) == ("FAILED", "CANCELLED")
    assert cancelled["error"] == "cancelled by its owner"

    # The agent is free again at once: a new start is queued, not skipped as already running.
    third = await gql.data(START, {"id": str(agent["id"])}, as_user=owner)
    assert third["startRun"]["state"] == "QUEUED"
    done = await gql.finished_run(third["startRun"]["id"], as_user=owner)
    assert done["state"] == "SUCCEEDED" and done["output"] == "Done."

    # The cancelled run's task has ended (the third run's too): nothing is left on the worker to
    # go on with the abandoned call's answer (no tool call, no further model call) or to write
    # to the cancelled run. Were it still waiting, the set would not empty before that answer.
    await no_run_in_flight()
    assert fake_openai.request_count == 3
    run = await gql.run(run_id, as_user=owner)
    assert (run["state"], run["reason"]) == ("FAILED", "CANCELLED")
    assert [(s["kind"], s["error"]) for s in run["steps"]] == [
        ("MODEL_CALL", "the run ended (failed/cancelled) during this step")
    ]
    assert run["tokensUsed"] == run["promptTokens"] + run["completionTokens"]
    (journal,) = await fetch(engine, "SELECT * FROM agent_runs WHERE id = :r", r=int(run_id))
    assert journal["finished_at"] is not None


async def test_cancelling_a_run_waiting_out_a_rate_limit_stops_the_wait(
    gql: Gql,
    fake_openai: FakeOpenAIServer,
    fake_agent: FakeAgent,
    worker: dramatiq.Worker,
) -> None:
    agent = await fake_agent()
    owner = int(agent["user_id"])
    # A 429 asking to come back in a few seconds: the provider waits, then would call again.
    wait_ms = int(SLOW_MODEL_SECONDS * 1000)
    fake_openai.enqueue(error_reply(429, "slow down", retry_after_ms=wait_ms), text_reply("Late."))
    run_id = await gql.start(agent["id"], as_user=owner)
    await eventually(lambda: _model_calls(fake_openai, 1), what="the rate-limited call")

    cancelled = (await gql.data(CANCEL, {"id": run_id}, as_user=owner))["cancelRun"]
    assert (cancelled["state"], cancelled["reason"]) == ("FAILED", "CANCELLED")
    # The wait ended with the run: the worker holds nothing that could call again later.
    await no_run_in_flight()
    assert fake_openai.request_count == 1
    assert (await gql.run(run_id, as_user=owner))["reason"] == "CANCELLED"


async def _model_calls(fake: FakeOpenAIServer, count: int) -> bool:
    return fake.request_count >= count


@pytest.fixture
def no_worker_yet(settings: Settings) -> Iterator[list[EngineWorker]]:
    """A worker the test starts when it wants one."""
    started: list[EngineWorker] = []
    try:
        yield started
    finally:
        for one in started:
            stop_worker(one, grace_seconds=5)


async def test_a_cancelled_queued_run_never_reaches_the_model(
    gql: Gql,
    settings: Settings,
    broker: dramatiq.Broker,
    fake_openai: FakeOpenAIServer,
    fake_agent: FakeAgent,
    no_worker_yet: list[EngineWorker],
) -> None:
    agent = await fake_agent()
    owner = int(agent["user_id"])
    # Queued behind nobody: no worker is running yet, its message waits in the broker.
    run_id = await gql.start(agent["id"], as_user=owner)
    cancelled = (await gql.data(CANCEL, {"id": run_id}, as_user=owner))["cancelRun"]
    assert (cancelled["state"], cancelled["reason"], cancelled["tokensUsed"]) == (
        "FAILED",
        "CANCELLED",
        0,
    )

    started = start_worker(settings, threads=2)
    no_worker_yet.append(started)
    # Processed means the claim was tried: a wrong one would have put the run in flight.
    await messages_settled(broker, started)
    assert runs_in_flight() == 0
    assert fake_openai.request_count == 0
    run = await gql.run(run_id, as_user=owner)
    assert (run["state"], run["reason"], run["steps"]) == ("FAILED", "CANCELLED", [])


async def test_cancel_permissions_and_a_finished_run_is_a_conflict(
    gql: Gql,
    factories: Factories,
    fake_agent: FakeAgent,
) -> None:
    agent = await fake_agent()
    owner = int(agent["user_id"])
    stranger = (await factories.user())["id"]
    admin = (await factories.user())["id"]
    finished = await factories.run(agent["id"], state="succeeded", output="old")
    queued = await factories.run(agent["id"], state="queued")

    body = await gql.body(CANCEL, {"id": str(finished["id"])}, as_user=owner)
    assert error_code(body) == "CONFLICT"
    body = await gql.body(CANCEL, {"id": str(queued["id"])}, as_user=stranger)
    assert error_code(body) == "NOT_FOUND"
    body = await gql.body(CANCEL, {"id": "not-an-id"}, as_user=owner)
    assert error_code(body) == "BAD_USER_INPUT"
    assert body["errors"][0]["extensions"]["field"] == "runId"

    by_admin = await gql.data(CANCEL, {"id": str(queued["id"])}, as_user=admin, admin=True)
    assert by_admin["cancelRun"]["state"] == "FAILED"
    assert by_admin["cancelRun"]["error"] == f"cancelled by an admin (user {admin})"
    body = await gql.body(CANCEL, {"id": str(queued["id"])}, as_user=owner)
    assert error_code(body) == "CONFLICT"


async def test_a_run_waiting_for_a_model_slot_is_cancelled_and_never_reaches_the_model(
    gql: Gql,
    engine: AsyncEngine,
    fake_openai: FakeOpenAIServer,
    fake_agent: FakeAgent,
    broker: dramatiq.Broker,
    worker: EngineWorker,
) -> None:
    first = await fake_agent()
    owner = int(first["user_id"])
    second = await fake_agent(user_id=owner, model_id=first["model_id"])
    async with engine.begin() as conn:
        await conn.exec_driver_sql(
            f"UPDATE agent_models SET max_concurrent_runs = 1 WHERE id = {int(first['model_id'])}"
        )
    fake_openai.enqueue(text_reply("Slow answer.", delay_seconds=SLOW_MODEL_SECONDS))
    holder = await gql.start(first["id"], as_user=owner)
    await _running(gql, holder, owner)
    waiting = await gql.start(second["id"], as_user=owner)
    # Its message was taken and dropped: the model's one slot is held.
    await messages_settled(broker, worker)
    assert (await gql.run(waiting, as_user=owner))["state"] == "QUEUED"

    cancelled = (await gql.data(CANCEL, {"id": waiting}, as_user=owner))["cancelRun"]
    assert (cancelled["state"], cancelled["reason"]) == ("FAILED", "CANCELLED")

    # The slot frees when the holder finishes; the hand-on finds nothing left to start.
    assert (await gql.finished_run(holder, as_user=owner))["state"] == "SUCCEEDED"
    # The holder's task (which hands the slot on) has ended and every message it may have sent
    # is acknowledged: a wrongly started run would be in flight or have called the model.
    await no_run_in_flight()
    await messages_settled(broker, worker)
    assert runs_in_flight() == 0
    assert fake_openai.request_count == 1
    run = await gql.run(waiting, as_user=owner)
    assert (run["state"], run["reason"], run["steps"], run["tokensUsed"]) == (
        "FAILED",
        "CANCELLED",
        [],
        0,
    )
