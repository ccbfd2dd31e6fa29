"""Fixtures: a worker with threads enough for the budget races (the api, broker and fake model
are the integration suite's)."""

from __future__ import annotations

from collections.abc import Iterator

import dramatiq
import pytest

from agent_engine.settings import Settings
from agent_engine.testing.fake_openai import FakeOpenAIServer
from agent_engine.workers.main import EngineWorker, start_worker, stop_worker
from tests.integration.conftest import WORKER_STOP_GRACE_SECONDS

WORKER_THREADS = 8


@pytest.fixture
def worker(
    broker: dramatiq.Broker, settings: Settings, fake_openai: FakeOpenAIServer
) -> Iterator[EngineWorker]:
    started = start_worker(settings, threads=WORKER_THREADS)
    try:
        yield started
    finally:
        stop_worker(started, grace_seconds=WORKER_STOP_GRACE_SECONDS)
