"""Delivery survives a crash: a worker SIGKILLed after the run finished and before the delivery
was sent. The outbox row was written in the run's finishing transaction, so a new worker (and the
clock's delivery tick) sends it: the receiver gets it once, signed."""

from __future__ import annotations

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from agent_engine.delivery.receiver import WebhookReceiver
from agent_engine.delivery.signing import new_secret
from agent_engine.testing.fake_openai import FakeOpenAIServer, text_reply
from tests.e2e.support import (  # noqa: F401 (fixtures)
    Client,
    Stack,
    eventually,
    fake_model,
    fake_openai,
    fetch,
    stack,
    token,
)
from tests.support.factories import Factories

pytestmark = pytest.mark.slow

SECRET_ENV = "E2E_HOOK_SECRET"  # not AGENT_ENGINE_*: the stack passes it to its processes
START = "mutation($id: ID!) { startRun(agentId: $id) { id state } }"
UPSERT = """
mutation($input: DeliveryTargetInput!) { upsertDeliveryTarget(input: $input) { id } }
"""
ATTACH = """
mutation($agent: ID!, $targets: [ID!]!) {
  setAgentDeliveryTargets(agentId: $agent, targetIds: $targets) { id }
}
"""
DELIVERIES = "query($id: ID!) { run(id: $id) { state deliveries { status attempts webhookId } } }"


async def test_a_worker_killed_before_the_send_loses_no_delivery(
    engine: AsyncEngine,
    factories: Factories,
    fake_openai: FakeOpenAIServer,  # noqa: F811
    stack: Stack,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    secret = new_secret()
    monkeypatch.setenv(SECRET_ENV, secret)
    stack.settings = stack.settings.model_copy(
        update={"delivery_tick_seconds": 0.3, "delivery_lease_seconds": 3.0}
    )
    fake_openai.enqueue(text_reply("Weekly digest: all quiet."))
    owner = (await factories.user())["id"]
    admin = (await factories.user())["id"]
    model = await fake_model(factories, fake_openai)
    agent = await factories.agent(user_id=owner, model_id=model["id"], name="Digest")
    api = await stack.api()
    as_owner = Client(api.url or "", bearer=token(stack.settings, owner))
    as_admin = Client(api.url or "", bearer=token(stack.settings, admin, admin=True))

    with WebhookReceiver(secret) as receiver:
        target = (
            await as_admin.data(
                UPSERT,
                {"input": {"name": "Ops", "url": receiver.url, "secretEnv": SECRET_ENV}},
            )
        )["upsertDeliveryTarget"]["id"]
        await as_owner.data(ATTACH, {"agent": str(agent["id"]), "targets": [target]})

        # A worker but no clock: the run finishes, nothing dispatches its delivery.
        worker = stack.worker(threads=2)
        run_id = (await as_owner.data(START, {"id": str(agent["id"])}))["startRun"]["id"]

        async def finished() -> bool:
            run = (await as_owner.data(DELIVERIES, {"id": run_id}))["run"]
            return bool(run["state"] == "SUCCEEDED")

        await eventually(finished, within=30, what="the run to succeed")
        pending = await fetch(engine, "SELECT status FROM run_deliveries")
        assert [r["status"] for r in pending] == ["pending"]
        worker.kill()

        stack.worker(threads=2)
        stack.clock()

        async def delivered() -> dict[str, object] | None:
            run = (await as_owner.data(DELIVERIES, {"id": run_id}))["run"]
            (delivery,) = run["deliveries"]
            return delivery if delivery["status"] == "DELIVERED" else None

        delivery = await eventually(delivered, within=40, what="the delivery to arrive")
        (received,) = receiver.received

    assert delivery["attempts"] == 1
    assert received.verified and received.webhook_id == delivery["webhookId"]
    assert received.payload["data"]["output"] == "Weekly digest: all quiet."
    await as_owner.aclose()
    await as_admin.aclose()
