"""Tracing's rules without a server: when the OTEL_* variables turn it on, what the GenAI spans
carry (content only when asked), exceptions without their text, trace ids in log lines, the
trace URL template, and nothing at all while it is off."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from pydantic import ValidationError

from agent_engine.observability import genai_spans, tracing, tracing_page
from agent_engine.runtime.providers.base import ModelReply, ModelRequest, ToolCall
from agent_engine.runtime.tools.spec import ToolCallContext, ToolSpec
from agent_engine.settings import Settings

SECRET_TEXT = "the owner's private note"


async def no_handler(ctx: ToolCallContext, arguments: dict[str, Any]) -> str:
    raise AssertionError("the span test calls no tool")


def traced(capture: bool = False) -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    environ = {tracing.CAPTURE_CONTENT_ENV: "true"} if capture else {}
    tracing.configure_tracing("test", environ=environ, exporter=exporter, set_global=False)
    try:
        yield exporter
    finally:
        tracing.shutdown_tracing()


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    yield from traced()


@pytest.fixture
def content_spans() -> Iterator[InMemorySpanExporter]:
    yield from traced(capture=True)


@pytest.mark.parametrize(
    ("environ", "on"),
    [
        ({}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"}, True),
        ({"OTEL_TRACES_EXPORTER": "otlp"}, True),
        ({"OTEL_TRACES_EXPORTER": "console"}, True),
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, False),
        ({"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "  "}, False),
    ],
)
def test_tracing_is_on_only_when_the_otel_variables_ask_for_it(
    environ: dict[str, str], on: bool
) -> None:
    assert tracing.tracing_requested(environ) is on


def test_off_by_default_every_hook_is_the_shared_no_op() -> None:
    assert tracing.configure_tracing("test", environ={}) is False
    assert tracing.ENABLED is False
    request = ModelRequest(model="m", messages=[{"role": "user", "content": SECRET_TEXT}], tools=[])
    with genai_spans.chat_span("openai", request) as span:
        assert span is genai_spans.NO_SPAN
    assert genai_spans.agent_span(agent_name="a", agent_id=1, run_id=2, owner_id=3) is (
        genai_spans.chat_span("openai", request)
    )
    assert tracing.current_traceparent() is None
    assert tracing.add_trace_ids(None, "info", {"event": "x"}) == {"event": "x"}


def test_a_chat_span_has_the_conventions_names_and_no_content_by_default(
    spans: InMemorySpanExporter,
) -> None:
    request = ModelRequest(
        model="gpt-x", messages=[{"role": "user", "content": SECRET_TEXT}], tools=[]
    )
    with genai_spans.chat_span("openai", request) as span:
        genai_spans.model_reply(
            span,
            ModelReply(
                content=SECRET_TEXT,
                tokens_used=12,
                raw_usage={"prompt_tokens": 10, "completion_tokens": 2},
            ),
        )
    [chat] = spans.get_finished_spans()
    assert chat.name == "chat gpt-x"
    assert dict(chat.attributes or {}) == {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "openai",
        "gen_ai.request.model": "gpt-x",
        "gen_ai.response.model": "gpt-x",
        "gen_ai.usage.input_tokens": 10,
        "gen_ai.usage.output_tokens": 2,
        "gen_ai.response.finish_reasons": ("stop",),
    }


def test_content_is_recorded_only_when_enabled(content_spans: InMemorySpanExporter) -> None:
    request = ModelRequest(
        model="gpt-x", messages=[{"role": "user", "content": SECRET_TEXT}], tools=[]
    )
    call = ToolCall(id="call_1", name="search", arguments='{"q": "tls"}')
    with genai_spans.chat_span("openai", request) as span:
        genai_spans.model_reply(span, ModelReply(content=None, tool_calls=(call,), tokens_used=3))
    spec = ToolSpec(name="search", description="", parameters={}, handler=no_handler)
    with genai_spans.tool_span(spec, call) as span:
        span.result("found 2 documents")
    chat, tool = content_spans.get_finished_spans()
    assert chat.attributes is not None and tool.attributes is not None
    assert SECRET_TEXT in str(chat.attributes["gen_ai.input.messages"])
    assert '"tool_call"' in str(chat.attributes["gen_ai.output.messages"])
    assert chat.attributes["gen_ai.response.finish_reasons"] == ("tool_calls",)
    assert tool.name == "execute_tool search"
    assert tool.attributes["gen_ai.tool.call.id"] == "call_1"
    assert tool.attributes["gen_ai.tool.type"] == "function"
    assert tool.attributes["gen_ai.tool.call.arguments"] == '{"q": "tls"}'
    assert tool.attributes["gen_ai.tool.call.result"] == "found 2 documents"


def test_an_exception_is_recorded_by_its_type_never_its_text(
    content_spans: InMemorySpanExporter,
) -> None:
    request = ModelRequest(model="gpt-x", messages=[], tools=[])
    with pytest.raises(RuntimeError), genai_spans.chat_span("openai", request):
        raise RuntimeError(f"provider said: {SECRET_TEXT} at https://internal.example")
    [chat] = content_spans.get_finished_spans()
    assert chat.attributes is not None and chat.attributes["error.type"] == "RuntimeError"
    assert [(e.name, dict(e.attributes or {})) for e in chat.events] == [
        ("exception", {"exception.type": "RuntimeError"})
    ]
    assert SECRET_TEXT not in repr(chat.to_json())
    assert chat.status.description is None


def test_log_lines_inside_a_span_carry_its_trace_and_span_ids(
    spans: InMemorySpanExporter,
) -> None:
    with tracing.tracer().start_as_current_span("work") as span:
        line = tracing.add_trace_ids(None, "info", {"event": "hello"})
        traceparent = tracing.current_traceparent()
    context = span.get_span_context()
    assert line["trace_id"] == format(context.trace_id, "032x")
    assert line["span_id"] == format(context.span_id, "016x")
    assert tracing.trace_id_of(traceparent) == line["trace_id"]
    assert "trace_id" not in tracing.add_trace_ids(None, "info", {"event": "outside"})


@pytest.mark.parametrize(
    "value", ["", "00-abc-def-01", "00-" + "a" * 31 + "-" + "b" * 16 + "-01", None]
)
def test_a_malformed_traceparent_has_no_trace_id(value: str | None) -> None:
    assert tracing.trace_id_of(value) is None


@pytest.mark.parametrize(
    ("template", "rule"),
    [
        ("ftp://tempo/{trace_id}", "http:// or https://"),
        ("javascript:alert({trace_id})", "http:// or https://"),
        ("https://grafana.example/explore", "must contain {trace_id}"),
    ],
)
def test_a_trace_url_template_must_be_http_with_the_placeholder(template: str, rule: str) -> None:
    with pytest.raises(ValidationError) as raised:
        Settings(trace_url_template=template)
    assert "AGENT_ENGINE_TRACE_URL_TEMPLATE" in str(raised.value)
    assert rule in str(raised.value)


def test_the_dashboard_page_carries_the_template_escaped() -> None:
    settings = Settings(trace_url_template='https://jaeger.example/trace/{trace_id}?a="b"')
    page = tracing_page.with_trace_url("<html><body><p>x</p></body>", settings.trace_url_template)
    assert page == (
        '<html><body data-trace-url-template="https://jaeger.example/trace/{trace_id}?a=&quot;b&quot;">'
        "<p>x</p></body>"
    )
    assert tracing_page.with_trace_url("<body>", None) == "<body>"
