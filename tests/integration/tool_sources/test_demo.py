"""The demo of `make run`: the ticket server registered as the `tickets` source, its tools allowed
and attached to the sample agent; the offline builtin model calling the WRITE tool from a `/call`
directive, parked until the owner approves."""

from __future__ import annotations

import json

import dramatiq
from sqlalchemy.ext.asyncio import AsyncEngine

from agent_engine.demo.seed import DEMO_OWNER_ID, seed_demo
from agent_engine.runs.claim import utc_now
from agent_engine.testing.mcp_tickets import TicketServer
from tests.integration.runs.transcript.support import Gql
from tests.integration.tool_sources.test_approvals import DECIDE, parked

AGENT = "{ viewer { agents { id name tools { name agentsAllowed access } } } }"
CREATE = """
mutation($prompt: String!, $tools: [ID!]!) {
  createAgent(input: { name: "Ticket opener", prompt: $prompt, toolIds: $tools }) { id }
}
"""


async def test_the_demo_source_and_a_directive_run_that_waits_for_approval(
    engine: AsyncEngine,
    gql: Gql,
    tickets: TicketServer,
    worker: dramatiq.Worker,
) -> None:
    await seed_demo(engine, now=utc_now(), tickets_url=tickets.url)
    # Idempotent: a second start (a new port, say) keeps one source and the choices made.
    await seed_demo(engine, now=utc_now(), tickets_url=tickets.url)

    [sample] = (await gql.data(AGENT, as_user=DEMO_OWNER_ID))["viewer"]["agents"]
    names = {tool["name"] for tool in sample["tools"] if tool["name"].startswith("tickets__")}
    assert names == {"tickets__search_tickets", "tickets__create_ticket"}
    tool_ids = [
        tool["id"]
        for tool in (await gql.data("{ tools { id name } }", as_user=DEMO_OWNER_ID))["tools"]
        if tool["name"] == "tickets__create_ticket"
    ]
    prompt = "/call tickets__create_ticket " + json.dumps({"title": "Check the release notes"})
    agent = (await gql.data(CREATE, {"prompt": prompt, "tools": tool_ids}, as_user=DEMO_OWNER_ID))[
        "createAgent"
    ]

    run_id = await gql.start(agent["id"], as_user=DEMO_OWNER_ID)
    pending = (await parked(gql, run_id, as_user=DEMO_OWNER_ID))["pendingApproval"]
    assert pending["input"] == {"title": "Check the release notes"}
    await gql.data(DECIDE, {"id": pending["id"], "approve": True}, as_user=DEMO_OWNER_ID)
    finished = await gql.finished_run(run_id, as_user=DEMO_OWNER_ID)

    assert finished["state"] == "SUCCEEDED"
    assert "tickets__create_ticket: created T-3: Check the release notes" in finished["output"]
    assert len(tickets.calls_of("create_ticket")) == 1
