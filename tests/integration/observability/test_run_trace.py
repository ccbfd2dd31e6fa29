"""One trace per run: the API request, the queue, the worker, each model and tool call, a park and
its resume on another worker, and the delivery, exported by the real engine (api under Uvicorn,
Dramatiq workers on Valkey, the MCP ticket server, the fake model, a webhook receiver) to the
SDK's in-memory exporter."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import dramatiq
import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from agent_engine.delivery.receiver import WebhookReceiver
from agent_engine.delivery.signing import new_secret
from agent_engine.observability import tracing
from agent_engine.settings import Settings
from agent_engine.testing.fake_openai import FakeOpenAIServer, FakeToolCall, text_reply, tool_reply
from agent_engine.testing.mcp_tickets import TicketServer
from agent_engine.workers.broker import close_broker, send_delivery_tick
from agent_engine.workers.main import start_worker, stop_worker
from tests.integration.api.subscriptions.support import Server, running_api
from tests.integration.runs.support import FakeAgent, eventually
from tests.integration.runs.transcript.support import Gql
from tests.integration.tool_sources.conftest import (  # noqa: F401 (fixtures)
    Admin,
    Scene,
    admin,
    tickets,
)

CREATE = "tickets__create_ticket"
SECRET_ENV = "AGENT_ENGINE_TEST_TRACE_HOOK_SECRET"
WORKER_THREADS = 2
WORKER_STOP_GRACE_SECONDS = 5
DELIVERY_TICK_SECONDS = 0.2
RUN = "query($id: ID!) { run(id: $id) { id state traceId pendingApproval { id } } }"
DECIDE = "mutation($id: ID!) { decideToolCall(approvalId: $id, approve: true) { status } }"
UPSERT_TARGET = """
mutation($input: DeliveryTargetInput!) { upsertDeliveryTarget(input: $input) { id } }
"""
ATTACH_TARGET = """
mutation($agent: ID!, $targets: [ID!]!) {
  setAgentDeliveryTargets(agentId: $agent, targetIds: $targets) { id }
}
"""

CHAT_ATTRIBUTES = {
    "gen_ai.operation.name",
    "gen_ai.provider.name",
    "gen_ai.request.model",
    "gen_ai.response.model",
    "gen_ai.usage.input_tokens",
    "gen_ai.usage.output_tokens",
    "gen_ai.response.finish_reasons",
}
AGENT_ATTRIBUTES = {
    "gen_ai.operation.name",
    "gen_ai.agent.id",
    "gen_ai.agent.name",
    "gen_ai.conversation.id",
    "user.id",
    "session.id",
}
TOOL_ATTRIBUTES = {
    "gen_ai.operation.name",
    "gen_ai.tool.name",
    "gen_ai.tool.call.id",
    "gen_ai.tool.type",
    "agent_engine.approval.id",
    "agent_engine.tool.authority",
}
CONTENT_ATTRIBUTES = {
    "gen_ai.input.messages",
    "gen_ai.output.messages",
    "gen_ai.tool.call.arguments",
    "gen_ai.tool.call.result",
}


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """Tracing on for this test, every span kept in memory as it ends."""
    exporter = InMemorySpanExporter()
    tracing.configure_tracing("agent-engine-test", exporter=exporter, set_global=False)
    try:
        yield exporter
    finally:
        tracing.shutdown_tracing()


@pytest.fixture
def server(spans: InMemorySpanExporter, settings: Settings) -> Iterator[Server]:
    """The api made after tracing is on (its middleware list reads the flag)."""
    with running_api(settings) as running:
        yield running


def hex_id(value: int, digits: int) -> str:
    return format(value, f"0{digits}x")


def named(spans: list[ReadableSpan], prefix: str) -> list[ReadableSpan]:
    return [s for s in spans if s.name.startswith(prefix)]


def parent_of(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


async def test_a_parked_run_resumed_on_another_worker_and_delivered_is_one_trace(
    spans: InMemorySpanExporter,
    settings: Settings,
    broker: dramatiq.Broker,
    admin: Admin,  # noqa: F811
    gql: Gql,
    tickets: TicketServer,  # noqa: F811
    fake_openai: FakeOpenAIServer,
    fake_agent: FakeAgent,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(SECRET_ENV, secret := new_secret())
    scene = Scene(admin, gql, tickets, fake_openai, fake_agent)
    agent = await scene.agent(name="Ticket clerk")
    owner = agent.owner
    first = start_worker(settings, threads=WORKER_THREADS)
    with WebhookReceiver(secret) as receiver:
        target = await gql.data(
            UPSERT_TARGET,
            {"input": {"name": "Ops hook", "url": receiver.url, "secretEnv": SECRET_ENV}},
            as_user=admin.id,
            admin=True,
        )
        await gql.data(
            ATTACH_TARGET,
            {"agent": agent.id, "targets": [target["upsertDeliveryTarget"]["id"]]},
            as_user=owner,
        )
        fake_openai.enqueue(
            tool_reply(FakeToolCall(CREATE, {"title": "Renew the certificate"}), prompt_tokens=30),
            text_reply("Ticket made.", prompt_tokens=40),
        )
        try:
            run_id = await scene.start(agent)

            async def parked() -> dict[str, Any] | None:
                run: dict[str, Any] = (await gql.data(RUN, {"id": run_id}, as_user=owner))["run"]
                return run if run["pendingApproval"] else None

            waiting = await eventually(parked, what="the run to park")
        finally:
            # The run is parked: no worker holds it. The resume goes to another one: a new
            # broker connection and worker context, as in another process.
            stop_worker(first, grace_seconds=WORKER_STOP_GRACE_SECONDS)
            close_broker()
        second = start_worker(settings, threads=WORKER_THREADS)
        try:
            await gql.data(DECIDE, {"id": waiting["pendingApproval"]["id"]}, as_user=owner)
            finished = await gql.finished_run(run_id, as_user=owner)
            assert finished["state"] == "SUCCEEDED"

            async def delivered() -> bool:
                await asyncio.to_thread(send_delivery_tick)
                await asyncio.sleep(DELIVERY_TICK_SECONDS)
                return bool(named(list(spans.get_finished_spans()), tracing.DELIVER_SPAN))

            await eventually(delivered, what="the delivery's span")
        finally:
            stop_worker(second, grace_seconds=WORKER_STOP_GRACE_SECONDS)
        assert [r.status for r in receiver.received] == [204]
        traced = (await gql.data(RUN, {"id": run_id}, as_user=owner))["run"]

    finished_spans = list(spans.get_finished_spans())
    [started, resumed] = named(finished_spans, f"invoke_agent {'Ticket clerk'}")
    trace_id = started.context.trace_id
    # Run.traceId is the run's trace, as a backend shows it (32 hex digits).
    assert traced["traceId"] == hex_id(trace_id, 32)

    # The API request that started the run is in the trace; the message's consumer span is its
    # child, and the run's span the consumer's.
    [consumer] = [
        s
        for s in finished_spans
        if s.name == "process execute_run" and s.context.trace_id == trace_id
    ]
    assert consumer.kind is SpanKind.CONSUMER
    assert parent_of(started) == consumer.context.span_id
    request = next(s for s in finished_spans if s.context.span_id == parent_of(consumer))
    # (Its parent is the caller's span: the test's HTTP client is instrumented too.)
    assert request.kind is SpanKind.SERVER and request.name == "POST /graphql"

    # The park ends the run's span with an event naming the approval (nothing held open).
    [park] = [e for e in started.events if e.name == tracing.PARKED_EVENT]
    assert park.attributes is not None
    assert park.attributes["agent_engine.approval.id"] == waiting["pendingApproval"]["id"]
    assert park.attributes["gen_ai.tool.name"] == CREATE
    assert started.end_time is not None and resumed.start_time is not None
    assert started.end_time <= resumed.start_time

    # The resume: a new span in the run's trace, its parent the run's first span, linked to
    # the decision's request (its own trace, through the decision's message).
    assert resumed.context.trace_id == trace_id
    assert parent_of(resumed) == started.context.span_id
    [link] = resumed.links
    decision = next(s for s in finished_spans if s.context.span_id == link.context.span_id)
    assert decision.name == "process execute_run"
    assert decision.context.trace_id != trace_id
    decision_request = next(s for s in finished_spans if s.context.span_id == parent_of(decision))
    assert decision_request.kind is SpanKind.SERVER

    # Each model call is a `chat` span of its stretch; the approved call an `execute_tool` span.
    [chat_before] = [
        s for s in named(finished_spans, "chat ") if parent_of(s) == started.context.span_id
    ]
    [tool] = named(finished_spans, f"execute_tool {CREATE}")
    [chat_after] = [
        s for s in named(finished_spans, "chat ") if parent_of(s) == resumed.context.span_id
    ]
    assert parent_of(tool) == resumed.context.span_id
    for span in (chat_before, chat_after):
        assert span.name == "chat fake-model" and span.kind is SpanKind.CLIENT
        assert span.attributes is not None
        assert set(span.attributes) >= CHAT_ATTRIBUTES
        assert span.attributes["gen_ai.provider.name"] == "openai"
        assert span.attributes["gen_ai.request.model"] == "fake-model"
    assert chat_before.attributes is not None and chat_after.attributes is not None
    assert chat_before.attributes["gen_ai.response.finish_reasons"] == ("tool_calls",)
    assert chat_before.attributes["gen_ai.usage.input_tokens"] == 30
    assert chat_after.attributes["gen_ai.response.finish_reasons"] == ("stop",)
    assert tool.attributes is not None
    assert set(tool.attributes) >= TOOL_ATTRIBUTES
    assert tool.attributes["gen_ai.tool.name"] == CREATE
    assert tool.attributes["agent_engine.approval.id"] == waiting["pendingApproval"]["id"]
    for span in (started, resumed):
        assert span.attributes is not None
        assert set(span.attributes) >= AGENT_ATTRIBUTES
        assert span.attributes["gen_ai.conversation.id"] == run_id
        assert span.attributes["gen_ai.agent.id"] == agent.id
        assert span.attributes["user.id"] == str(owner)

    # HTTP to the MCP server (httpx) and SQL (asyncpg) join the trace under the run's spans.
    tool_http = [
        s
        for s in finished_spans
        if s.kind is SpanKind.CLIENT and parent_of(s) == tool.context.span_id
    ]
    assert tool_http, "no HTTP span under the tool call"
    sql = [
        s
        for s in finished_spans
        if s.context.trace_id == trace_id and s.attributes and "db.system" in s.attributes
    ]
    assert sql, "no SQL span in the run's trace"

    # The delivery joins the run's trace.
    [deliver] = named(finished_spans, tracing.DELIVER_SPAN)
    assert deliver.context.trace_id == trace_id
    assert parent_of(deliver) == started.context.span_id

    # Content is off unless enabled: no prompt, output, arguments or result anywhere.
    for span in finished_spans:
        assert not CONTENT_ATTRIBUTES & set(span.attributes or {}), span.name
