"""Signed deliveries of finished runs to a real local receiver, through the public API and a real
worker: retries on the schedule, one webhook-id, a failure that never touches the run."""

from __future__ import annotations

from typing import Any

import dramatiq
import httpx
from standardwebhooks.webhooks import Webhook
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from agent_engine.db.platform import WEEKLY_TOKEN_CAP
from agent_engine.delivery.receiver import WebhookReceiver
from agent_engine.embedded import free_port
from agent_engine.server_thread import ServerThread
from agent_engine.testing.fake_openai import FakeOpenAIServer, text_reply
from tests.integration.api.subscriptions.support import Server
from tests.integration.delivery.conftest import SECRET_ENV
from tests.integration.runs.support import FakeAgent, eventually
from tests.integration.runs.transcript.support import START, Gql
from tests.support.factories import Factories

UPSERT = """
mutation($input: DeliveryTargetInput!) {
  upsertDeliveryTarget(input: $input) { id name url secretEnv enabled }
}
"""
ATTACH = """
mutation($agent: ID!, $targets: [ID!]!) {
  setAgentDeliveryTargets(agentId: $agent, targetIds: $targets) { id deliveryTargets { id name } }
}
"""


async def _target(gql: Gql, admin: int, url: str, secret_env: str = SECRET_ENV) -> str:
    created = await gql.data(
        UPSERT,
        {"input": {"name": "Ops hook", "url": url, "secretEnv": secret_env}},
        as_user=admin,
        admin=True,
    )
    target_id: str = created["upsertDeliveryTarget"]["id"]
    return target_id


async def _agent_delivering_to(
    gql: Gql, fake_agent: FakeAgent, factories: Factories, url: str, secret_env: str = SECRET_ENV
) -> tuple[dict[str, Any], int]:
    admin = (await factories.user())["id"]
    target = await _target(gql, admin, url, secret_env)
    agent = await fake_agent(name="Weekly digest")
    owner = int(agent["user_id"])
    attached = await gql.data(
        ATTACH, {"agent": str(agent["id"]), "targets": [target]}, as_user=owner
    )
    assert [t["id"] for t in attached["setAgentDeliveryTargets"]["deliveryTargets"]] == [target]
    return agent, owner


async def _settled_delivery(gql: Gql, run_id: str, owner: int) -> dict[str, Any]:
    async def settled() -> dict[str, Any] | None:
        run = await gql.run(run_id, as_user=owner)
        deliveries = run["deliveries"]
        return run if deliveries and deliveries[0]["status"] != "PENDING" else None

    run: dict[str, Any] = await eventually(settled, within=30, what="the delivery to settle")
    return run


async def test_a_receiver_that_fails_twice_gets_the_delivery_on_the_third_attempt(
    gql: Gql,
    factories: Factories,
    fake_openai: FakeOpenAIServer,
    fake_agent: FakeAgent,
    worker: dramatiq.Worker,
    delivery_ticks: None,
    secret: str,
) -> None:
    with WebhookReceiver(secret, statuses=[500, 503]) as receiver:
        agent, owner = await _agent_delivering_to(gql, fake_agent, factories, receiver.url)
        fake_openai.enqueue(text_reply("Three documents changed.", prompt_tokens=30))
        run_id = await gql.start(agent["id"], as_user=owner)
        run = await _settled_delivery(gql, run_id, owner)
        received = receiver.received

    (delivery,) = run["deliveries"]
    assert delivery["status"] == "DELIVERED"
    assert (delivery["attempts"], delivery["lastStatusCode"]) == (3, 204)
    assert delivery["deliveredAt"] is not None
    assert [r.status for r in received] == [500, 503, 204]
    assert all(r.verified for r in received)
    assert {r.webhook_id for r in received} == {delivery["webhookId"]}
    assert delivery["webhookId"].startswith("msg_")
    # Every attempt carries the same body; an independent Standard Webhooks verifier accepts it.
    assert len({r.body for r in received}) == 1
    payload = Webhook(secret).verify(received[-1].body, received[-1].headers)
    assert payload["type"] == "run.succeeded"
    assert payload["data"] == {
        "runId": run_id,
        "agentId": str(agent["id"]),
        "agentName": "Weekly digest",
        "ownerId": str(owner),
        "trigger": "manual",
        "state": "succeeded",
        "reason": None,
        "output": "Three documents changed.",
        "tokensUsed": 35,
        "cost": None,
        "finishedAt": payload["timestamp"],
    }
    # The owner sees the delivery, not the target's URL or secret variable.
    assert (delivery["target"]["url"], delivery["target"]["secretEnv"]) == (None, None)


async def test_a_receiver_that_is_down_ends_failed_with_the_last_error(
    gql: Gql,
    factories: Factories,
    fake_openai: FakeOpenAIServer,
    fake_agent: FakeAgent,
    worker: dramatiq.Worker,
    delivery_ticks: None,
    secret: str,
) -> None:
    nobody = f"http://127.0.0.1:{free_port()}/hooks"
    agent, owner = await _agent_delivering_to(gql, fake_agent, factories, nobody)
    fake_openai.enqueue(text_reply("Done."))
    run_id = await gql.start(agent["id"], as_user=owner)
    run = await _settled_delivery(gql, run_id, owner)

    assert run["state"] == "SUCCEEDED"
    (delivery,) = run["deliveries"]
    # The schedule has two waits: three attempts, then failed.
    assert (delivery["status"], delivery["attempts"]) == ("FAILED", 3)
    assert delivery["lastStatusCode"] is None
    # The owner reads which target and what kind of failure; never where it lives.
    assert delivery["lastError"] == "target 'Ops hook' is unreachable"
    port = nobody.split(":")[2].split("/")[0]
    for leak in ("127.0.0.1", port, "/hooks", "http"):
        assert leak not in delivery["lastError"]


class _LeakyReceiver(ServerThread):
    """A receiver that fails with internals in its body (a stack trace, a token)."""

    def app(self) -> Starlette:
        async def hook(request: Request) -> Response:
            return PlainTextResponse(LEAKY_BODY, status_code=500)

        return Starlette(routes=[Route("/hooks", hook, methods=["POST"])])


LEAKY_BODY = "Traceback: db password=hunter2 at internal-db.corp:5432"


async def test_an_error_answer_shows_the_owner_the_status_not_the_body(
    gql: Gql,
    factories: Factories,
    fake_openai: FakeOpenAIServer,
    fake_agent: FakeAgent,
    worker: dramatiq.Worker,
    delivery_ticks: None,
    secret: str,
) -> None:
    with _LeakyReceiver() as receiver:
        url = f"http://127.0.0.1:{receiver.port}/hooks"
        agent, owner = await _agent_delivering_to(gql, fake_agent, factories, url)
        fake_openai.enqueue(text_reply("Done."))
        run = await _settled_delivery(gql, await gql.start(agent["id"], as_user=owner), owner)

    (delivery,) = run["deliveries"]
    assert (delivery["status"], delivery["lastStatusCode"]) == ("FAILED", 500)
    assert delivery["lastError"] == "target 'Ops hook' answered HTTP 500"


async def test_a_missing_secret_fails_the_delivery_and_never_the_run(
    gql: Gql,
    factories: Factories,
    fake_openai: FakeOpenAIServer,
    fake_agent: FakeAgent,
    worker: dramatiq.Worker,
    delivery_ticks: None,
    secret: str,
) -> None:
    with WebhookReceiver(secret) as receiver:
        agent, owner = await _agent_delivering_to(
            gql, fake_agent, factories, receiver.url, secret_env="AGENT_ENGINE_TEST_UNSET_SECRET"
        )
        fake_openai.enqueue(text_reply("Done."))
        run_id = await gql.start(agent["id"], as_user=owner)
        run = await _settled_delivery(gql, run_id, owner)
        assert receiver.received == []

    assert (run["state"], run["output"]) == ("SUCCEEDED", "Done.")
    (delivery,) = run["deliveries"]
    assert delivery["status"] == "FAILED"
    # The variable's name is the admin's: the owner reads that the target is misconfigured.
    assert delivery["lastError"] == (
        "target 'Ops hook': its signing secret is not configured on the workers (an admin must"
        " fix it; details in the worker log)"
    )


async def test_a_skipped_run_is_delivered_too(
    gql: Gql,
    factories: Factories,
    fake_agent: FakeAgent,
    worker: dramatiq.Worker,
    delivery_ticks: None,
    secret: str,
) -> None:
    await factories.setting(WEEKLY_TOKEN_CAP, 0)
    with WebhookReceiver(secret) as receiver:
        agent, owner = await _agent_delivering_to(gql, fake_agent, factories, receiver.url)
        started = (await gql.data(START, {"id": str(agent["id"])}, as_user=owner))["startRun"]
        assert (started["state"], started["reason"]) == ("SKIPPED", "BUDGET_EXCEEDED")
        run = await _settled_delivery(gql, started["id"], owner)
        (received,) = receiver.received

    assert run["deliveries"][0]["status"] == "DELIVERED"
    assert received.payload["type"] == "run.skipped"
    assert received.payload["data"]["reason"] == "budget_exceeded"


async def test_metrics_count_deliveries_by_outcome(
    server: Server,
    gql: Gql,
    http: httpx.AsyncClient,
    factories: Factories,
    fake_openai: FakeOpenAIServer,
    fake_agent: FakeAgent,
    worker: dramatiq.Worker,
    delivery_ticks: None,
    secret: str,
) -> None:
    agent, owner = await _agent_delivering_to(
        gql, fake_agent, factories, "http://127.0.0.1:9/", secret_env="AGENT_ENGINE_TEST_UNSET"
    )
    run_id = await gql.start(agent["id"], as_user=owner)
    await _settled_delivery(gql, run_id, owner)

    text = (await http.get(f"{server.url}/metrics")).text
    assert 'agent_engine_deliveries_finished_recent{status="failed"} 1.0' in text
    assert 'agent_engine_deliveries_finished_recent{status="delivered"} 0.0' in text
    assert "agent_engine_deliveries_pending 0.0" in text
