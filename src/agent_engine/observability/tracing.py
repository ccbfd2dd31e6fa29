"""OpenTelemetry tracing: one trace per run, with the GenAI semantic conventions' spans.

Off by default, and free when off: every hook first reads the module flag `ENABLED` and, while it
is false, gets a shared do-nothing handle -- no span (not even a no-op one), no context, no
attribute is made on a hot path. `configure_tracing(service)` (each entry point, once) turns it on
when the standard `OTEL_*` variables ask for traces: `OTEL_EXPORTER_OTLP_ENDPOINT` or
`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` is set, or `OTEL_TRACES_EXPORTER` names `otlp` or `console`
-- and `OTEL_SDK_DISABLED` is not true. Spans go out over OTLP/HTTP (protobuf) in batches; the
exporter, the sampler (`OTEL_TRACES_SAMPLER`) and the resource (`OTEL_SERVICE_NAME`,
`OTEL_RESOURCE_ATTRIBUTES`) read their own variables. SQL (asyncpg, statements without their
parameters) and outgoing HTTP (httpx: models, MCP servers, deliveries) are instrumented; the api
wraps itself in the ASGI middleware (`asgi_middleware`).

Every span and attribute name the engine writes is in this module (the spans themselves are put
together in `genai_spans`), after the conventions
(https://opentelemetry.io/docs/specs/semconv/gen-ai/): `invoke_agent <agent>`, `chat <model>`,
`execute_tool <tool>`. Content -- the messages a model got and gave, a tool's arguments and
result -- is recorded only when `OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT` is true; an
exception is recorded by its type only (its text may hold content, hosts or SQL).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Mapping, MutableMapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter
    from opentelemetry.trace import Tracer

log = logging.getLogger(__name__)

# Read by every hook before it does anything: False means tracing costs one attribute read.
ENABLED = False
# OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT: prompts, outputs, tool arguments, results.
CAPTURE_CONTENT = False

CAPTURE_CONTENT_ENV = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
DISABLED_INSTRUMENTATIONS_ENV = "OTEL_PYTHON_DISABLED_INSTRUMENTATIONS"
TRUE_WORDS = frozenset({"true", "1", "yes", "on"})
INSTRUMENTATION_NAME = "agent_engine"
# service.name of each process (OTEL_SERVICE_NAME overrides).
API_SERVICE = "agent-engine-api"
WORKER_SERVICE = "agent-engine-worker"
CLOCK_SERVICE = "agent-engine-clock"

# --- names: spans ------------------------------------------------------------------------------
INVOKE_AGENT = "invoke_agent"
CHAT = "chat"
EXECUTE_TOOL = "execute_tool"
SCHEDULE_TICK_SPAN = "schedule_tick"
DELIVER_SPAN = "deliver"
PROCESS = "process"  # `process <actor>`: the messaging conventions' consumer span

# --- names: attributes (GenAI conventions, then general ones, then the engine's own) ------------
GEN_AI_OPERATION_NAME = "gen_ai.operation.name"
GEN_AI_PROVIDER_NAME = "gen_ai.provider.name"
GEN_AI_AGENT_ID = "gen_ai.agent.id"
GEN_AI_AGENT_NAME = "gen_ai.agent.name"
GEN_AI_CONVERSATION_ID = "gen_ai.conversation.id"
GEN_AI_REQUEST_MODEL = "gen_ai.request.model"
GEN_AI_RESPONSE_MODEL = "gen_ai.response.model"
GEN_AI_USAGE_INPUT_TOKENS = "gen_ai.usage.input_tokens"
GEN_AI_USAGE_OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
GEN_AI_RESPONSE_FINISH_REASONS = "gen_ai.response.finish_reasons"
GEN_AI_INPUT_MESSAGES = "gen_ai.input.messages"
GEN_AI_OUTPUT_MESSAGES = "gen_ai.output.messages"
GEN_AI_TOOL_NAME = "gen_ai.tool.name"
GEN_AI_TOOL_CALL_ID = "gen_ai.tool.call.id"
GEN_AI_TOOL_TYPE = "gen_ai.tool.type"
GEN_AI_TOOL_CALL_ARGUMENTS = "gen_ai.tool.call.arguments"
GEN_AI_TOOL_CALL_RESULT = "gen_ai.tool.call.result"
ERROR_TYPE = "error.type"
USER_ID = "user.id"
SESSION_ID = "session.id"
EXCEPTION_TYPE = "exception.type"
MESSAGING_SYSTEM = "messaging.system"
MESSAGING_OPERATION_TYPE = "messaging.operation.type"
MESSAGING_DESTINATION_NAME = "messaging.destination.name"
MESSAGING_MESSAGE_ID = "messaging.message.id"
RUN_ID = "agent_engine.run.id"
RUN_RESUMED = "agent_engine.run.resumed"
RUN_OUTCOME = "agent_engine.run.state"
APPROVAL_ID = "agent_engine.approval.id"
TOOL_AUTHORITY = "agent_engine.tool.authority"
TOOL_ACCESS = "agent_engine.tool.access"
DELIVERY_ID = "agent_engine.delivery.id"
DELIVERY_STATUS = "agent_engine.delivery.status"
TICK_DUE_AGENTS = "agent_engine.schedule.due_agents"
# The park: the run's span ends with this event; the resume is a new span linked to the decision.
PARKED_EVENT = "agent_engine.run.parked"
SKIPPED_EVENT = "agent_engine.message.skipped"

PROVIDER_NAMES = {"openai": "openai", "builtin": "agent_engine.builtin"}
TOOL_TYPE_FUNCTION = "function"  # executed by the engine (the conventions' client-side tools)
TOOL_TYPE_EXTENSION = "extension"  # executed by a remote server (an MCP tool)
AUTHORITY_SHARED = "SHARED"

_lock = threading.Lock()
_provider: TracerProvider | None = None
_tracer: Tracer | None = None
_instrumentors: list[Any] = []


def tracing_requested(environ: Mapping[str, str]) -> bool:
    """Whether the `OTEL_*` variables ask for traces (off unless an exporter or endpoint is set)."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() in TRUE_WORDS:
        return False
    exporters = {
        e.strip().lower() for e in environ.get("OTEL_TRACES_EXPORTER", "").split(",") if e.strip()
    }
    if "none" in exporters:
        return False
    if exporters & {"otlp", "console"}:
        return True
    return bool(
        environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
        or environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()
    )


def configure_tracing(
    service_name: str,
    *,
    environ: Mapping[str, str] | None = None,
    exporter: SpanExporter | None = None,
    set_global: bool = True,
) -> bool:
    """Turn tracing on when `environ` (default: the process's) asks for it, or when `exporter`
    is given (the tests' in-memory exporter, exported at once). Returns whether it is on.
    Idempotent; `shutdown_tracing` turns it off again."""
    global ENABLED, CAPTURE_CONTENT, _provider, _tracer
    env = os.environ if environ is None else environ
    if exporter is None and not tracing_requested(env):
        return ENABLED
    with _lock:
        if _provider is not None:
            return True
        from opentelemetry import trace
        from opentelemetry.sdk.resources import SERVICE_NAME, Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import (
            BatchSpanProcessor,
            ConsoleSpanExporter,
            SimpleSpanProcessor,
        )

        # OTEL_SERVICE_NAME (read by Resource.create) wins over the process's own name.
        named = {} if env.get("OTEL_SERVICE_NAME") else {SERVICE_NAME: service_name}
        provider = TracerProvider(resource=Resource.create(named))
        if exporter is not None:
            provider.add_span_processor(SimpleSpanProcessor(exporter))
        else:
            names = env.get("OTEL_TRACES_EXPORTER", "otlp").lower()
            if "console" in names:
                provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter()))
            if "otlp" in names or "console" not in names:
                from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
                    OTLPSpanExporter,
                )

                provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        if set_global:
            trace.set_tracer_provider(provider)
        _provider = provider
        _tracer = provider.get_tracer(INSTRUMENTATION_NAME)
        _instrument(provider, disabled=_disabled_instrumentations(env))
        CAPTURE_CONTENT = env.get(CAPTURE_CONTENT_ENV, "").strip().lower() in TRUE_WORDS
        ENABLED = True
    log.info("tracing is on (OTLP/HTTP); message content %s", "on" if CAPTURE_CONTENT else "off")
    return True


def _disabled_instrumentations(environ: Mapping[str, str]) -> frozenset[str]:
    """OTEL_PYTHON_DISABLED_INSTRUMENTATIONS (the Python SDK's own variable): e.g. `asyncpg` to
    leave SQL out of the traces (most of tracing's cost per run: one span per statement)."""
    raw = environ.get(DISABLED_INSTRUMENTATIONS_ENV, "")
    return frozenset(name.strip().lower() for name in raw.split(",") if name.strip())


def _instrument(provider: TracerProvider, *, disabled: frozenset[str]) -> None:
    from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor

    from agent_engine.observability.sql_spans import AsyncPGInstrumentor

    chosen: dict[str, Any] = {"asyncpg": AsyncPGInstrumentor, "httpx": HTTPXClientInstrumentor}
    for name, make in chosen.items():
        if name in disabled:
            continue
        instrumentor = make()
        if not instrumentor.is_instrumented_by_opentelemetry:
            instrumentor.instrument(tracer_provider=provider)
            _instrumentors.append(instrumentor)


def shutdown_tracing() -> None:
    """Export what is buffered and turn tracing off (process exit, tests)."""
    global ENABLED, CAPTURE_CONTENT, _provider, _tracer
    with _lock:
        provider = _provider
        ENABLED = False
        CAPTURE_CONTENT = False
        _provider = None
        _tracer = None
        while _instrumentors:
            _instrumentors.pop().uninstrument()
    if provider is not None:
        provider.shutdown()


def force_flush() -> None:
    if _provider is not None:
        _provider.force_flush()


def tracer() -> Tracer:
    if _tracer is None:
        raise RuntimeError("tracing is off: call configure_tracing() first")
    return _tracer


def tracer_provider() -> TracerProvider | None:
    return _provider


def asgi_middleware() -> list[Any]:
    """The api's Starlette middleware for tracing: the ASGI instrumentation (one SERVER span per
    request, the caller's `traceparent` honoured; health probes and metrics scrapes left out),
    or none when tracing is off."""
    if not ENABLED:
        return []
    from opentelemetry.instrumentation.asgi import OpenTelemetryMiddleware
    from starlette.middleware import Middleware

    return [
        Middleware(
            OpenTelemetryMiddleware,
            excluded_urls="healthz,readyz,metrics",
            tracer_provider=_provider,
            exclude_spans=["receive", "send"],
        )
    ]


# --- context: W3C traceparent ------------------------------------------------------------------


def inject(carrier: dict[str, str], context: Context | None = None) -> None:
    """The W3C `traceparent` (and `tracestate`) of the current span (or `context`) into
    `carrier`; nothing when there is none."""
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    TraceContextTextMapPropagator().inject(carrier, context=context)


def extract(carrier: Mapping[str, str]) -> Context:
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    return TraceContextTextMapPropagator().extract(carrier)


def current_traceparent() -> str | None:
    """The current span's W3C traceparent, or None (tracing off, or no span)."""
    if not ENABLED:
        return None
    carrier: dict[str, str] = {}
    inject(carrier)
    return carrier.get("traceparent")


def trace_id_of(traceparent: str | None) -> str | None:
    """The 32 hex digits of a W3C traceparent (`00-<trace id>-<span id>-<flags>`), or None."""
    if not traceparent:
        return None
    parts = traceparent.split("-")
    if len(parts) != 4 or len(parts[1]) != 32:
        return None
    return parts[1]


def add_trace_ids(_: Any, __: str, event_dict: MutableMapping[str, Any]) -> Mapping[str, Any]:
    """structlog processor: every line logged inside a span carries its `trace_id` and `span_id`."""
    if ENABLED:
        from opentelemetry import trace

        context = trace.get_current_span().get_span_context()
        if context.is_valid:
            event_dict.setdefault("trace_id", format(context.trace_id, "032x"))
            event_dict.setdefault("span_id", format(context.span_id, "016x"))
    return event_dict
