"""One trace per run: the API request, the queue, the worker, each model and tool call, a park and
its resume on another worker, and the delivery, exported by the real engine (api under Uvicorn,
Dramatiq workers on Valkey, the MCP ticket server, the fake model, a webhook receiver) to the
SDK's in-memory exporter and, once, over OTLP/HTTP to a receiver decoding the protobuf."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import dramatiq
import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from agent_engine.delivery.receiver import WebhookReceiver
from agent_engine.delivery.signing import new_secret
from agent_engine.observability import tracing
from agent_engine.settings import Settings
from agent_engine.testing.fake_openai import FakeOpenAIServer, FakeToolCall, text_reply, tool_reply
from agent_engine.testing.mcp_tickets import TicketServer
from agent_engine.testing.otlp_receiver import OtlpReceiver, ReceivedSpan
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


class Sink:
    """Where the test's spans go: the SDK's in-memory exporter, or real OTLP/HTTP to a receiver
    that decodes the protobuf; read back the same way (`ReceivedSpan`)."""

    def __init__(self, exporter: InMemorySpanExporter | None, receiver: OtlpReceiver | None):
        self.exporter = exporter
        self.receiver = receiver

    def spans(self) -> list[ReceivedSpan]:
        tracing.force_flush()
        if self.receiver is not None:
            return self.receiver.spans
        assert self.exporter is not None
        return [received(span) for span in self.exporter.get_finished_spans()]


def received(span: ReadableSpan) -> ReceivedSpan:
    """An in-memory span as the receiver would have decoded it."""
    return ReceivedSpan(
        name=span.name,
        kind=span.kind.name,
        trace_id=hex_id(span.context.trace_id, 32),
        span_id=hex_id(span.context.span_id, 16),
        parent_id=hex_id(span.parent.span_id, 16) if span.parent is not None else None,
        attributes=dict(span.attributes or {}),
        events=[(e.name, dict(e.attributes or {})) for e in span.events],
        links=[
            (hex_id(link.context.trace_id, 32), hex_id(link.context.span_id, 16))
            for link in span.links
        ],
        error=span.status.status_code is StatusCode.ERROR,
        start_ns=span.start_time or 0,
        end_ns=span.end_time or 0,
    )


@pytest.fixture(params=["memory", "otlp"])
def sink(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[Sink]:
    """Tracing on for this test: to the in-memory exporter, or over OTLP/HTTP (the standard
    variable, as an operator sets it) to a local receiver."""
    if request.param == "memory":
        exporter = InMemorySpanExporter()
        tracing.configure_tracing("agent-engine-test", exporter=exporter, set_global=False)
        try:
            yield Sink(exporter, None)
        finally:
            tracing.shutdown_tracing()
        return
    with OtlpReceiver() as receiver:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
        assert tracing.configure_tracing("agent-engine-test", set_global=False)
        try:
            yield Sink(None, receiver)
        finally:
            tracing.shutdown_tracing()


@pytest.fixture
def server(sink: Sink, settings: Settings) -> Iterator[Server]:
    """The api made after tracing is on (its middleware list reads the flag)."""
    with running_api(settings) as running:
        yield running


def hex_id(value: int, digits: int) -> str:
    return format(value, f"0{digits}x")


def named(spans: list[ReceivedSpan], prefix: str) -> list[ReceivedSpan]:
    return [s for s in spans if s.name.startswith(prefix)]


def by_id(spans: list[ReceivedSpan], span_id: str | None) -> ReceivedSpan:
    [found] = [s for s in spans if s.span_id == span_id]
    return found


async def test_a_parked_run_resumed_on_another_worker_and_delivered_is_one_trace(
    sink: Sink,
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
                return bool(named(sink.spans(), tracing.DELIVER_SPAN))

            await eventually(delivered, what="the delivery's span")
        finally:
            stop_worker(second, grace_seconds=WORKER_STOP_GRACE_SECONDS)
        assert [r.status for r in receiver.received] == [204]
        traced = (await gql.data(RUN, {"id": run_id}, as_user=owner))["run"]

    spans = sink.spans()
    [started, resumed] = named(spans, "invoke_agent Ticket clerk")
    trace_id = started.trace_id
    # Run.traceId is the run's trace, as a backend shows it (32 hex digits).
    assert traced["traceId"] == trace_id

    # The API request that started the run is in the trace; the message's consumer span is its
    # child, and the run's span the consumer's.
    [consumer] = [s for s in named(spans, "process execute_run") if s.trace_id == trace_id]
    assert consumer.kind == "CONSUMER"
    assert started.parent_id == consumer.span_id
    request = by_id(spans, consumer.parent_id)
    # (Its parent is the caller's span: the test's HTTP client is instrumented too.)
    assert (request.kind, request.name) == ("SERVER", "POST /graphql")

    # The park ends the run's span with an event naming the approval (nothing held open).
    [park] = [attrs for name, attrs in started.events if name == tracing.PARKED_EVENT]
    assert park["agent_engine.approval.id"] == waiting["pendingApproval"]["id"]
    assert park["gen_ai.tool.name"] == CREATE
    assert started.end_ns <= resumed.start_ns

    # The resume: a new span in the run's trace, its parent the run's first span, linked to
    # the decision's request (its own trace, through the decision's message).
    assert resumed.trace_id == trace_id
    assert resumed.parent_id == started.span_id
    [(link_trace, link_span)] = resumed.links
    decision = by_id(spans, link_span)
    assert decision.name == "process execute_run"
    assert decision.trace_id == link_trace != trace_id
    assert by_id(spans, decision.parent_id).kind == "SERVER"

    # Each model call is a `chat` span of its stretch; the approved call an `execute_tool` span.
    chats = named(spans, "chat ")
    [chat_before] = [s for s in chats if s.parent_id == started.span_id]
    [chat_after] = [s for s in chats if s.parent_id == resumed.span_id]
    [tool] = named(spans, f"execute_tool {CREATE}")
    assert tool.parent_id == resumed.span_id
    for span in (chat_before, chat_after):
        assert (span.name, span.kind) == ("chat fake-model", "CLIENT")
        assert set(span.attributes) >= CHAT_ATTRIBUTES
        assert span.attributes["gen_ai.operation.name"] == "chat"
        assert span.attributes["gen_ai.provider.name"] == "openai"
        assert span.attributes["gen_ai.request.model"] == "fake-model"
    assert tuple(chat_before.attributes["gen_ai.response.finish_reasons"]) == ("tool_calls",)
    assert chat_before.attributes["gen_ai.usage.input_tokens"] == 30
    assert tuple(chat_after.attributes["gen_ai.response.finish_reasons"]) == ("stop",)
    assert chat_after.attributes["gen_ai.usage.input_tokens"] == 40
    assert set(tool.attributes) >= TOOL_ATTRIBUTES
    assert tool.attributes["gen_ai.operation.name"] == "execute_tool"
    assert tool.attributes["gen_ai.tool.name"] == CREATE
    assert tool.attributes["agent_engine.approval.id"] == waiting["pendingApproval"]["id"]
    assert tool.attributes["agent_engine.tool.authority"] == "SHARED"
    for span in (started, resumed):
        assert set(span.attributes) >= AGENT_ATTRIBUTES
        assert span.attributes["gen_ai.operation.name"] == "invoke_agent"
        assert span.attributes["gen_ai.conversation.id"] == run_id
        assert span.attributes["gen_ai.agent.id"] == agent.id
        assert span.attributes["user.id"] == str(owner)

    # HTTP to the MCP server (httpx) and SQL (asyncpg) join the trace under the run's spans.
    assert [s for s in spans if s.kind == "CLIENT" and s.parent_id == tool.span_id], (
        "no HTTP span under the tool call"
    )
    assert [s for s in spans if s.trace_id == trace_id and "db.system" in s.attributes], (
        "no SQL span in the run's trace"
    )

    # The delivery joins the run's trace.
    [deliver] = named(spans, tracing.DELIVER_SPAN)
    assert deliver.trace_id == trace_id
    assert deliver.parent_id == started.span_id

    # Content is off unless enabled: no prompt, output, arguments or result anywhere.
    for span in spans:
        assert not CONTENT_ATTRIBUTES & set(span.attributes), span.name
