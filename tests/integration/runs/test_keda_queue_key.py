"""What the Kubernetes deployment relies on from Dramatiq, on a real Valkey: the Redis list KEDA
scales the workers on (deploy/k8s/base/worker.yaml) is where unclaimed `runs` messages wait, and
a worker process starts its two Dramatiq workers without Dramatiq's duplicate-middleware warning.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from pathlib import Path

import dramatiq
import pytest
import redis
import yaml
from sqlalchemy.ext.asyncio import AsyncEngine

from agent_engine.domain.runs import RunTrigger
from agent_engine.runs.request import request_run
from agent_engine.settings import Settings
from agent_engine.testing.fake_openai import FakeOpenAIServer, text_reply
from agent_engine.workers.broker import enqueue_execute
from agent_engine.workers.main import start_worker, stop_worker
from tests.integration.runs.support import FakeAgent, eventually, run_row

WORKER_YAML = Path(__file__).resolve().parents[3] / "deploy" / "k8s" / "base" / "worker.yaml"


@pytest.fixture
def settings(settings: Settings) -> Settings:
    """KEDA reads the Redis list: these tests use the Redis broker even when the suite runs on
    RabbitMQ (BROKER_URL), as .ci/run's last pass does."""
    return settings.model_copy(update={"broker_url": None})


def _keda_list_name() -> str:
    [scaled] = [
        doc
        for doc in yaml.safe_load_all(WORKER_YAML.read_text())
        if doc and doc["kind"] == "ScaledObject"
    ]
    [trigger] = scaled["spec"]["triggers"]
    name: str = trigger["metadata"]["listName"]
    return name


async def test_the_keda_list_holds_the_unclaimed_runs(
    engine: AsyncEngine,
    settings: Settings,
    broker: dramatiq.Broker,
    fake_openai: FakeOpenAIServer,
    fake_agent: FakeAgent,
) -> None:
    client = redis.Redis.from_url(settings.redis_url or "")
    list_name = _keda_list_name()
    agents = [await fake_agent(name=f"backlog {n}") for n in range(3)]
    runs = [
        await request_run(
            engine,
            agent["id"],
            trigger=RunTrigger.MANUAL,
            now=datetime.now(UTC),
            enqueue=enqueue_execute,
        )
        for agent in agents
    ]
    # No worker yet: the backlog KEDA reads is the three runs' messages.
    assert client.llen(list_name) == 3
    for _ in runs:
        fake_openai.enqueue(text_reply("done"))
    started = start_worker(settings, threads=2)
    try:
        for row in runs:

            async def succeeded(run_id: int = row.id) -> bool:
                return bool((await run_row(engine, run_id))["state"] == "succeeded")

            await eventually(succeeded, what=f"run {row.id} to succeed")
        # Claimed runs leave the list: a drained backlog reads 0 and KEDA may scale down.
        assert client.llen(list_name) == 0
    finally:
        stop_worker(started, grace_seconds=5)
        client.close()


def test_a_worker_process_starts_without_dramatiqs_duplicate_middleware_warning(
    settings: Settings, broker: dramatiq.Broker, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="dramatiq")
    for _ in range(2):  # a second start in the same process (tests, a restarted embedder)
        started = start_worker(settings, threads=1)
        try:
            assert started.runs is not None and started.ticks is not None
        finally:
            stop_worker(started, grace_seconds=1)
    warnings = [r.getMessage() for r in caplog.records if "same type twice" in r.getMessage()]
    assert warnings == []
    names = [type(m).__name__ for m in broker.middleware]
    assert len(names) == len(set(names)), names
