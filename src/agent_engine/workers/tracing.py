"""Dramatiq middleware carrying the trace through the queue (there is no official instrumentation,
and the one on the package index loses message options and never makes its span current).

On enqueue, the current span's W3C `traceparent`/`tracestate` go into the message's options, which
are part of the encoded message on Redis and RabbitMQ alike; `delay` (the `eta` option) is not
touched. A message that already carries them keeps them: a retry (Dramatiq re-enqueues a copy of
the message) is a sibling of the first attempt, under the same producer, never its child.

On processing, a CONSUMER span `process <actor>` starts with the producer's span as its parent and
is made current for the actor (its tasks inherit it), then ends and is detached on success,
failure and skip. While tracing is off (`observability.tracing.ENABLED`) every hook returns at once.
"""

from __future__ import annotations

import threading
from typing import Any

import dramatiq
from dramatiq.broker import MessageProxy
from dramatiq.middleware import Middleware

from agent_engine.observability import genai_spans as spans
from agent_engine.observability import tracing

TRACE_OPTIONS = ("traceparent", "tracestate")
MESSAGING_SYSTEM = "dramatiq"


class TraceContextMiddleware(Middleware):
    """Puts the producer's trace context into each message and runs each message's actor inside
    a `process <actor>` span (add it first, so a skip by any later middleware still ends it)."""

    def __init__(self) -> None:
        self._local = threading.local()

    def before_enqueue(
        self, broker: dramatiq.Broker, message: dramatiq.Message[Any], delay: int
    ) -> None:
        if not tracing.ENABLED or "traceparent" in message.options:
            return
        carrier: dict[str, str] = {}
        tracing.inject(carrier)
        for key in TRACE_OPTIONS:
            if key in carrier:
                message.options[key] = carrier[key]

    def before_process_message(self, broker: dramatiq.Broker, message: MessageProxy) -> None:
        if not tracing.ENABLED:
            return
        from opentelemetry import context as otel_context
        from opentelemetry import trace
        from opentelemetry.trace import SpanKind

        carrier = {k: str(message.options[k]) for k in TRACE_OPTIONS if k in message.options}
        parent = tracing.extract(carrier)
        span = tracing.tracer().start_span(
            f"{tracing.PROCESS} {message.actor_name}",
            context=parent,
            kind=SpanKind.CONSUMER,
            attributes={
                tracing.MESSAGING_SYSTEM: MESSAGING_SYSTEM,
                tracing.MESSAGING_OPERATION_TYPE: tracing.PROCESS,
                tracing.MESSAGING_DESTINATION_NAME: message.queue_name,
                tracing.MESSAGING_MESSAGE_ID: message.message_id,
            },
        )
        token = otel_context.attach(trace.set_span_in_context(span))
        self._open()[message.message_id] = (span, token)

    def after_process_message(
        self,
        broker: dramatiq.Broker,
        message: MessageProxy,
        *,
        result: Any = None,
        exception: BaseException | None = None,
    ) -> None:
        self._end(message, exception=exception)

    def after_skip_message(self, broker: dramatiq.Broker, message: MessageProxy) -> None:
        self._end(message, skipped=True)

    def _open(self) -> dict[str, Any]:
        spans: dict[str, Any] | None = getattr(self._local, "spans", None)
        if spans is None:
            spans = self._local.spans = {}
        return spans

    def _end(
        self,
        message: MessageProxy,
        *,
        exception: BaseException | None = None,
        skipped: bool = False,
    ) -> None:
        if not tracing.ENABLED and not getattr(self._local, "spans", None):
            return
        opened = self._open().pop(message.message_id, None)
        if opened is None:
            return
        from opentelemetry import context as otel_context

        span, token = opened
        try:
            if exception is not None:
                spans.record_error(span, exception)
            if skipped:
                span.add_event(tracing.SKIPPED_EVENT)
            span.end()
        finally:
            otel_context.detach(token)
