"""A scheduled run's trace starts at the schedule tick: the tick's message, the tick's span, the
run's message under it, the run under that; and the run's log lines carry the trace's ids."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import dramatiq
import pytest
import structlog
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from agent_engine.observability import tracing
from agent_engine.observability.logging import configure_logging
from agent_engine.settings import Settings
from agent_engine.testing.fake_openai import FakeOpenAIServer, text_reply
from agent_engine.workers.broker import send_schedule_tick
from tests.integration.runs.support import FakeAgent, eventually

EVERY_6H = {"type": "interval", "every_hours": 6}


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    tracing.configure_tracing("agent-engine-test", exporter=exporter, set_global=False)
    try:
        yield exporter
    finally:
        tracing.shutdown_tracing()


@pytest.fixture
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        yield
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
        structlog.reset_defaults()


def only(spans: list[ReadableSpan], name: str) -> ReadableSpan:
    [found] = [s for s in spans if s.name == name]
    return found


async def test_a_scheduled_run_is_one_trace_from_its_tick_and_its_logs_carry_the_ids(
    spans: InMemorySpanExporter,
    restore_logging: None,
    settings: Settings,
    engine: AsyncEngine,
    fake_openai: FakeOpenAIServer,
    fake_agent: FakeAgent,
    worker: dramatiq.Worker,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # In the test's body: pytest installs its own log capture after the fixtures.
    configure_logging(settings.model_copy(update={"log_format": "json"}))
    agent = await fake_agent(
        name="Nightly", schedule=EVERY_6H, next_run_at=datetime.now(UTC) - timedelta(minutes=1)
    )
    fake_openai.enqueue(text_reply("All quiet."))
    await asyncio.to_thread(send_schedule_tick)

    async def finished() -> int | None:
        async with engine.connect() as conn:
            row = (
                await conn.execute(
                    text("SELECT id FROM agent_runs WHERE agent_id = :a AND state = 'succeeded'"),
                    {"a": agent["id"]},
                )
            ).first()
        return None if row is None else int(row.id)

    run_id = await eventually(finished, what="the scheduled run to succeed")

    async def run_span_ended() -> bool:
        return any(s.name == "invoke_agent Nightly" for s in spans.get_finished_spans())

    await eventually(run_span_ended, what="the run's span to end")
    ended = list(spans.get_finished_spans())
    run = only(ended, "invoke_agent Nightly")
    tick = only(ended, tracing.SCHEDULE_TICK_SPAN)
    consumers = {s.context.span_id: s for s in ended if s.name.startswith("process ")}
    assert run.parent is not None
    run_message = consumers[run.parent.span_id]
    assert run_message.name == "process execute_run"
    assert run_message.parent is not None and run_message.parent.span_id == tick.context.span_id
    assert tick.parent is not None
    assert consumers[tick.parent.span_id].name == "process schedule_due_agents"
    assert {run.context.trace_id, tick.context.trace_id} == {run_message.context.trace_id}

    lines = [json.loads(x) for x in capsys.readouterr().err.splitlines() if x.startswith("{")]
    of_run = [line for line in lines if line.get("run_id") == run_id]
    assert of_run, "the run logged nothing"
    for line in of_run:
        assert line["trace_id"] == format(run.context.trace_id, "032x"), line
        assert len(line["span_id"]) == 16
