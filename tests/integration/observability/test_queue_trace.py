"""The trace goes through the queue (`workers/tracing.py`) on the real broker (Valkey here, RabbitMQ
when BROKER_URL says amqp://): the consumer's `process <actor>` span is the producer's child and is
current inside the actor; a retry is a sibling of the first attempt; a failure and a skip end the
span; a delayed message keeps its delay."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import dramatiq
import pytest
from dramatiq.brokers.redis import RedisBroker
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from agent_engine.observability import tracing
from agent_engine.settings import Settings
from agent_engine.workers.tracing import TraceContextMiddleware

QUEUE = "trace_test"
JOIN_TIMEOUT_MS = 20_000
DELAY_MS = 300
WORKER_TIMEOUT_MS = 50


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    tracing.configure_tracing("agent-engine-test", exporter=exporter, set_global=False)
    try:
        yield exporter
    finally:
        tracing.shutdown_tracing()


def make_broker(settings: Settings) -> dramatiq.Broker:
    url = settings.effective_broker_url or ""
    if url.startswith(("amqp://", "amqps://")):
        from dramatiq.brokers.rabbitmq import RabbitmqBroker

        return RabbitmqBroker(url=url)
    return RedisBroker(url=url)


class Seen:
    """What the actors saw: the current span inside each attempt, by message id."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.inside: list[tuple[str, int, int, float]] = []

    def record(self, label: str) -> None:
        context = trace.get_current_span().get_span_context()
        with self.lock:
            self.inside.append((label, context.trace_id, context.span_id, time.monotonic()))


@pytest.fixture
def queue(settings: Settings, spans: InMemorySpanExporter) -> Iterator[tuple[Any, Seen]]:
    broker = make_broker(settings)
    broker.add_middleware(TraceContextMiddleware(), before=type(broker.middleware[0]))
    seen = Seen()
    attempts: dict[str, int] = {}

    def flaky(label: str) -> None:
        seen.record(label)
        attempts[label] = attempts.get(label, 0) + 1
        if attempts[label] == 1:
            raise RuntimeError("first attempt fails (secret content that must not be exported)")

    def steady(label: str) -> None:
        seen.record(label)

    def broken(label: str) -> None:
        seen.record(label)
        raise ValueError("always fails")

    actors = {
        "flaky": dramatiq.actor(
            flaky, broker=broker, queue_name=QUEUE, max_retries=1, min_backoff=10, max_backoff=10
        ),
        "steady": dramatiq.actor(steady, broker=broker, queue_name=QUEUE),
        "broken": dramatiq.actor(broken, broker=broker, queue_name=QUEUE, max_retries=0),
        # Older than its age limit by the time a worker takes it: AgeLimit skips it.
        "stale": dramatiq.actor(
            steady, actor_name="stale", broker=broker, queue_name=QUEUE, max_age=1
        ),
    }
    worker = dramatiq.Worker(broker, worker_threads=2, worker_timeout=WORKER_TIMEOUT_MS)
    worker.start()
    try:
        yield actors, seen
    finally:
        worker.stop()
        broker.close()


def process_spans(exporter: InMemorySpanExporter, actor: str) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name == f"process {actor}"]


def join(actors: dict[str, Any]) -> None:
    actors["steady"].broker.join(QUEUE, timeout=JOIN_TIMEOUT_MS)


def test_a_retry_is_a_sibling_of_the_first_attempt_under_the_producer(
    queue: tuple[dict[str, Any], Seen], spans: InMemorySpanExporter
) -> None:
    actors, seen = queue
    with tracing.tracer().start_as_current_span("producer") as producer:
        actors["flaky"].send("a")
    join(actors)

    attempts = process_spans(spans, "flaky")
    assert len(attempts) == 2
    for span in attempts:
        assert span.kind is SpanKind.CONSUMER
        assert span.context.trace_id == producer.get_span_context().trace_id
        assert span.parent is not None
        assert span.parent.span_id == producer.get_span_context().span_id
        assert span.attributes is not None
        assert span.attributes["messaging.destination.name"] == QUEUE
    failed, succeeded = sorted(attempts, key=lambda s: s.start_time or 0)
    assert failed.status.status_code is StatusCode.ERROR
    assert failed.attributes is not None and failed.attributes["error.type"] == "RuntimeError"
    # The exception is recorded by its type only: its text may hold content.
    [event] = [e for e in failed.events if e.name == "exception"]
    assert dict(event.attributes or {}) == {"exception.type": "RuntimeError"}
    assert succeeded.status.status_code is StatusCode.UNSET
    # Inside the actor, the consumer's span is the current one (each attempt its own).
    assert {(t, s) for _, t, s, _ in seen.inside} == {
        (span.context.trace_id, span.context.span_id) for span in attempts
    }


def test_a_failure_a_skip_and_a_delay_each_end_their_span(
    queue: tuple[dict[str, Any], Seen], spans: InMemorySpanExporter
) -> None:
    actors, seen = queue
    with tracing.tracer().start_as_current_span("producer") as producer:
        actors["broken"].send("b")
        actors["stale"].send_with_options(args=("c",), delay=DELAY_MS)
        sent_at = time.monotonic()
        actors["steady"].send_with_options(args=("d",), delay=DELAY_MS)
    join(actors)
    trace_id = producer.get_span_context().trace_id

    [broken] = process_spans(spans, "broken")
    assert broken.status.status_code is StatusCode.ERROR
    [stale] = process_spans(spans, "stale")
    assert [e.name for e in stale.events] == [tracing.SKIPPED_EVENT]
    assert "c" not in [label for label, *_ in seen.inside]
    [delayed] = process_spans(spans, "steady")
    assert {broken.context.trace_id, stale.context.trace_id, delayed.context.trace_id} == {trace_id}
    # The delay held: the actor ran no sooner than asked.
    [(_, _, _, ran_at)] = [entry for entry in seen.inside if entry[0] == "d"]
    assert ran_at - sent_at >= DELAY_MS / 1000 * 0.9
    # Nothing is left current on the worker's threads: a message sent outside any span starts
    # its own trace.
    actors["steady"].send("e")
    join(actors)
    [fresh] = [
        s
        for s in process_spans(spans, "steady")
        if s is not delayed and s.context != delayed.context
    ]
    assert fresh.parent is None and fresh.context.trace_id != trace_id


def test_while_tracing_is_off_messages_carry_no_trace_context(settings: Settings) -> None:
    broker = make_broker(settings)
    broker.add_middleware(TraceContextMiddleware(), before=type(broker.middleware[0]))
    try:
        actor = dramatiq.actor(lambda: None, actor_name="quiet", broker=broker, queue_name=QUEUE)
        message = actor.send()
        assert "traceparent" not in message.options
    finally:
        broker.close()
