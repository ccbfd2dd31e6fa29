"""A parked run holds no slot of its model, and its resume takes one: against the real worker, the
real MCP ticket server and a model with `maxConcurrentRuns`, a decided run waits while the
model's slots are taken and goes on as soon as one frees (no reaper runs here), and a resumed
run's finish hands its slot on."""

from __future__ import annotations

import dramatiq
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from agent_engine.testing.fake_openai import FakeToolCall, text_reply, tool_reply
from agent_engine.workers.broker import enqueue_execute
from agent_engine.workers.main import EngineWorker
from tests.integration.runs.support import (
    eventually,
    fetch,
    limited_model,
    messages_settled,
    run_row,
    runs_in_flight,
)
from tests.integration.tool_sources.conftest import McpAgent, Scene
from tests.integration.tool_sources.test_approvals import CREATE, DECIDE, parked
from tests.support.factories import Factories

# Every time a run of a model becomes running and unparked (a start, a resume, a heartbeat), the
# database records the most runs of that model it saw running at once: "never more than the
# limit" checked on every write, not by sampling. A probe of this test, not of the product.
PEAK_PROBE = (
    "CREATE TABLE slot_peaks (model_id bigint PRIMARY KEY, peak bigint NOT NULL)",
    "CREATE FUNCTION record_slot_peak() RETURNS trigger LANGUAGE plpgsql AS $$"
    " BEGIN"
    "  INSERT INTO slot_peaks AS p (model_id, peak)"
    "   SELECT NEW.model_id, count(*) FROM agent_runs"
    "   WHERE model_id = NEW.model_id AND state = 'running' AND parked_at IS NULL"
    "  ON CONFLICT (model_id) DO UPDATE SET peak = GREATEST(p.peak, EXCLUDED.peak);"
    "  RETURN NULL;"
    " END $$",
    "CREATE TRIGGER record_slot_peak AFTER UPDATE ON agent_runs FOR EACH ROW"
    " WHEN (NEW.state = 'running' AND NEW.parked_at IS NULL AND NEW.model_id IS NOT NULL)"
    " EXECUTE FUNCTION record_slot_peak()",
)


async def watch_peak(engine: AsyncEngine) -> None:
    async with engine.begin() as conn:
        for statement in PEAK_PROBE:
            await conn.execute(text(statement))


async def peak(engine: AsyncEngine, model_id: int) -> int:
    rows = await fetch(engine, "SELECT peak FROM slot_peaks WHERE model_id = :m", m=model_id)
    return int(rows[0]["peak"]) if rows else 0


async def parked_on_a_write(mcp: Scene, model_id: int) -> tuple[McpAgent, str, str]:
    """An agent on the model whose run asks for a ticket and parks; (agent, run id, approval id)."""
    agent = await mcp.agent(model_id=model_id)
    mcp.fake_openai.enqueue(
        tool_reply(FakeToolCall(CREATE, {"title": "Renew the TLS certificate"}))
    )
    run_id = await mcp.start(agent)
    approval = (await parked(mcp.gql, run_id, as_user=agent.owner))["pendingApproval"]
    return agent, run_id, str(approval["id"])


async def model_answering(mcp: Scene, count: int) -> None:
    async def asked() -> bool:
        return mcp.fake_openai.active_requests == count

    await eventually(asked, what=f"{count} model call(s) in progress")


async def test_an_approved_run_waits_for_a_slot_of_its_model_and_resumes_when_one_frees(
    mcp: Scene,
    engine: AsyncEngine,
    factories: Factories,
    broker: dramatiq.Broker,
    worker: EngineWorker,
) -> None:
    gql, fake, tickets = mcp.gql, mcp.fake_openai, mcp.tickets
    model_id = await limited_model(factories, fake, 1)
    await watch_peak(engine)
    writer, run_a, approval = await parked_on_a_write(mcp, model_id)
    # The parked run holds no slot: another agent's run of the model starts, and its model call
    # takes as long as the test wants.
    other = await mcp.fake_agent(model_id=model_id)
    other_owner = int(other["user_id"])
    fake.hold()
    fake.enqueue(text_reply("the other one"))
    run_b = await gql.start(other["id"], as_user=other_owner)
    await model_answering(mcp, 1)
    fake.enqueue(text_reply("ticket opened"))  # the writer's reply once it goes on

    decided = await gql.data(DECIDE, {"id": approval, "approve": True}, as_user=writer.owner)
    assert decided["decideToolCall"]["status"] == "APPROVED"
    for _ in range(3):  # re-sent or redelivered messages change nothing either
        enqueue_execute(int(run_a))
    await messages_settled(broker, worker)

    # Every message was handled while the slot was taken: the writer still waits, uncalled.
    row = await run_row(engine, int(run_a))
    assert row["state"] == "running" and row["parked_at"] is not None
    assert runs_in_flight() == 1
    assert tickets.calls_of("create_ticket") == []
    assert await peak(engine, model_id) == 1

    fake.release()
    finished_b = await gql.finished_run(run_b, as_user=other_owner)
    # The other run's finish handed the slot to the writer: it goes on now, not at a reaper pass.
    finished_a = await gql.finished_run(run_a, as_user=writer.owner)

    assert finished_b["state"] == "SUCCEEDED"
    assert (finished_a["state"], finished_a["output"]) == ("SUCCEEDED", "ticket opened")
    [call] = tickets.calls_of("create_ticket")
    assert call.arguments == {"title": "Renew the TLS certificate"}
    assert await peak(engine, model_id) == 1


async def test_a_resumed_run_hands_its_slot_on_when_it_finishes(
    mcp: Scene,
    engine: AsyncEngine,
    factories: Factories,
    broker: dramatiq.Broker,
    worker: EngineWorker,
) -> None:
    gql, fake = mcp.gql, mcp.fake_openai
    model_id = await limited_model(factories, fake, 1)
    writer, run_a, approval = await parked_on_a_write(mcp, model_id)
    # Approved while the slot is free: the writer resumes, makes its call and asks the model
    # again, which answers when the test says.
    fake.hold()
    fake.enqueue(text_reply("ticket opened"))
    await gql.data(DECIDE, {"id": approval, "approve": True}, as_user=writer.owner)
    await model_answering(mcp, 1)
    assert len(mcp.tickets.calls_of("create_ticket")) == 1
    # Another run of the model is requested meanwhile: it waits for the slot.
    other = await mcp.fake_agent(model_id=model_id)
    other_owner = int(other["user_id"])
    run_c = await gql.start(other["id"], as_user=other_owner)
    await messages_settled(broker, worker)
    assert (await run_row(engine, int(run_c)))["state"] == "queued"

    fake.release()
    finished_a = await gql.finished_run(run_a, as_user=writer.owner)
    # The resumed run's finish handed its slot on: the waiting run starts without a reaper pass.
    finished_c = await gql.finished_run(run_c, as_user=other_owner)

    assert finished_a["state"] == "SUCCEEDED"
    assert finished_c["state"] == "SUCCEEDED"
    started = await fetch(
        engine,
        "SELECT (SELECT started_at FROM agent_runs WHERE id = :c)"
        " >= (SELECT finished_at FROM agent_runs WHERE id = :a) AS after",
        a=int(run_a),
        c=int(run_c),
    )
    assert started[0]["after"]
