"""Retrying a run whose worker was SIGKILLed mid-run (reaped STALE): real processes (api, worker,
clock), the real MCP ticket server.

What the user sees: the approved WRITE call that was on its way to the server when the worker
died is never made again -- the retry tells the model its outcome is unknown -- the model is not
asked again for the answer it gave before the crash, and the retry's tokens are only its own.
"""

from __future__ import annotations

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from agent_engine.runs.retry import UNKNOWN_OUTCOME
from agent_engine.testing.fake_openai import FakeOpenAIServer
from agent_engine.testing.mcp_tickets import TicketServer
from tests.e2e.support import (  # noqa: F401 (fixtures)
    Stack,
    all_terminal,
    eventually,
    fake_openai,
    invariant_violations,
    stack,
)
from tests.e2e.test_approval_crashes import (  # noqa: F401 (fixture)
    CREATE,
    DECIDE,
    _parked_run,
    _run,
    tickets,
)
from tests.support.factories import Factories

pytestmark = pytest.mark.slow

RETRY = "mutation($id: ID!) { retryRun(runId: $id) { id state trigger } }"
RUN = """
query($id: ID!) {
  run(id: $id) {
    state reason tokensUsed retryOf { id }
    steps { kind name output error reused }
  }
}
"""


async def test_a_run_reaped_stale_during_an_approved_write_is_retried_without_a_second_call(
    engine: AsyncEngine,
    factories: Factories,
    fake_openai: FakeOpenAIServer,  # noqa: F811
    stack: Stack,  # noqa: F811
    tickets: TicketServer,  # noqa: F811
) -> None:
    victim = stack.worker(threads=2)
    stack.clock()
    client, run_id, approval_id = await _parked_run(stack, factories, fake_openai, tickets)
    try:
        tickets.hold()  # the server takes the call and does not answer
        await client.data(DECIDE, {"id": approval_id})

        async def reached() -> bool:
            return len(tickets.calls_of("create_ticket")) == 1

        await eventually(reached, within=30, what="the call to reach the server")
        victim.kill()
        tickets.release()
        stack.worker(threads=2)
        await eventually(lambda: all_terminal(engine, [int(run_id)]), within=60, what="the reap")
        assert (await _run(engine, run_id))["reason"] == "stale"
        asked_before = fake_openai.request_count

        # The script's "Opened." reply is still queued: the retry's one model call takes it.
        retried = (await client.data(RETRY, {"id": run_id}))["retryRun"]
        assert (retried["state"], retried["trigger"]) == ("QUEUED", "RETRY")
        await eventually(
            lambda: all_terminal(engine, [int(retried["id"])]), within=60, what="the retry"
        )
        run = (await client.data(RUN, {"id": retried["id"]}))["run"]

        assert (run["state"], run["reason"]) == ("SUCCEEDED", None)
        assert run["retryOf"] == {"id": run_id}
        # The write was never made a second time; the model heard that its outcome is unknown.
        assert len(tickets.calls_of("create_ticket")) == 1
        heard = fake_openai.requests[-1]["messages"]
        assert [m["content"] for m in heard if m["role"] == "tool"] == [UNKNOWN_OUTCOME]
        # One new model call: the answer given before the crash was not asked for again.
        assert fake_openai.request_count == asked_before + 1
        assert [(s["kind"], s["name"], s["reused"]) for s in run["steps"]] == [
            ("MODEL_CALL", "fake-model", True),
            ("TOOL_CALL", CREATE, True),
            ("MODEL_CALL", "fake-model", False),
        ]
        assert "outcome unknown" in run["steps"][1]["error"]
        assert run["tokensUsed"] == 15  # the new call's 10 + 5 only
        assert await invariant_violations(engine) == []
    finally:
        await client.aclose()
