"""Fixtures: the api under Uvicorn (real clock: runs finish in this week), a real Dramatiq worker,
and the fake OpenAI server behind models an admin creates through the API."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import dramatiq
import httpx
import pytest

from agent_engine.settings import Settings
from agent_engine.testing.fake_openai import FakeOpenAIServer
from agent_engine.workers.broker import close_broker, configure_broker
from agent_engine.workers.main import start_worker, stop_worker
from tests.integration.api.subscriptions.support import Server, running_api
from tests.integration.runs.spend.support import Client
from tests.integration.runs.support import FAKE_KEY_ENV

WORKER_STOP_GRACE_SECONDS = 5


@pytest.fixture
def server(settings: Settings) -> Iterator[Server]:
    with running_api(settings) as running:
        yield running


@pytest.fixture
async def client(server: Server, settings: Settings) -> AsyncIterator[Client]:
    async with httpx.AsyncClient(timeout=30.0) as http:
        yield Client(http=http, server=server, settings=settings)


@pytest.fixture
async def fake_openai(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[FakeOpenAIServer]:
    monkeypatch.setenv(FAKE_KEY_ENV, "test-key")
    async with FakeOpenAIServer() as fake:
        yield fake


@pytest.fixture
def worker(settings: Settings, fake_openai: FakeOpenAIServer) -> Iterator[dramatiq.Worker]:
    """A real Dramatiq worker in this process (threads) on the real broker (Valkey)."""
    configure_broker(settings)
    started = start_worker(settings, threads=8)
    try:
        yield started
    finally:
        stop_worker(started, grace_seconds=WORKER_STOP_GRACE_SECONDS)
        close_broker()
