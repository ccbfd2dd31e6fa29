"""Fixtures shared across the integration folders: the api under Uvicorn on the real clock, a
GraphQL client of it, the real broker and worker in this process, and the fake OpenAI server
behind agents' models."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import dramatiq
import httpx
import pytest

from agent_engine.settings import Settings
from agent_engine.testing.fake_openai import FakeOpenAIServer
from agent_engine.workers.broker import close_broker, configure_broker
from agent_engine.workers.main import EngineWorker, start_worker, stop_worker
from tests.integration.api.subscriptions.support import Server, running_api
from tests.integration.runs.support import FAKE_KEY_ENV, FakeAgent
from tests.integration.runs.transcript.support import Gql
from tests.support.factories import Factories

WORKER_THREADS = 4
WORKER_STOP_GRACE_SECONDS = 5


@pytest.fixture
def server(settings: Settings) -> Iterator[Server]:
    with running_api(settings) as running:
        yield running


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=30.0) as client:
        yield client


@pytest.fixture
def gql(server: Server, http: httpx.AsyncClient, settings: Settings) -> Gql:
    """GraphQL over HTTP against `server`, as any user."""
    return Gql(url=server.url, settings=settings, http=http)


@pytest.fixture
def broker(settings: Settings) -> Iterator[dramatiq.Broker]:
    """The real broker (Valkey) configured in this process, to send messages with."""
    configured = configure_broker(settings)
    try:
        yield configured
    finally:
        close_broker()


@pytest.fixture
def worker(broker: dramatiq.Broker, settings: Settings) -> Iterator[EngineWorker]:
    """The real Dramatiq workers (runs and ticks) in this process (threads), running the actors."""
    started = start_worker(settings, threads=WORKER_THREADS)
    try:
        yield started
    finally:
        stop_worker(started, grace_seconds=WORKER_STOP_GRACE_SECONDS)


@pytest.fixture
async def fake_openai(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[FakeOpenAIServer]:
    monkeypatch.setenv(FAKE_KEY_ENV, "test-key")
    async with FakeOpenAIServer() as fake:
        yield fake


@pytest.fixture
def fake_agent(factories: Factories, fake_openai: FakeOpenAIServer) -> FakeAgent:
    """`await fake_agent(**agent_values)`: an agent whose model is the fake OpenAI server."""

    async def make(**values: Any) -> dict[str, Any]:
        model = await factories.model(
            name="Fake",
            provider="openai",
            model="fake-model",
            base_url=fake_openai.base_url,
            api_key_env=FAKE_KEY_ENV,
        )
        values.setdefault("model_id", model["id"])
        return await factories.agent(**values)

    return make
