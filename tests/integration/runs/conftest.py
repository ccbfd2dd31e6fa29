"""Fixtures for the run lifecycle: the fake OpenAI server and agents whose model points at it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import dramatiq
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from agent_engine.runtime.loop import Runtime
from agent_engine.settings import Settings
from agent_engine.testing.fake_openai import FakeOpenAIServer
from agent_engine.workers.broker import close_broker, configure_broker
from agent_engine.workers.main import EngineWorker, start_worker, stop_worker
from tests.integration.runs.support import FAKE_KEY_ENV
from tests.support.factories import Factories

FakeAgent = Callable[..., Awaitable[dict[str, Any]]]


@pytest.fixture
async def fake_openai(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[FakeOpenAIServer]:
    monkeypatch.setenv(FAKE_KEY_ENV, "test-key")
    async with FakeOpenAIServer() as server:
        yield server


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


@pytest.fixture
async def runtime(engine: AsyncEngine) -> AsyncIterator[Runtime]:
    async with Runtime(engine, model_timeout_seconds=10) as rt:
        yield rt


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
    """The real Dramatiq workers (runs and ticks) in this process, running the actors."""
    started = start_worker(settings, threads=4)
    try:
        yield started
    finally:
        stop_worker(started, grace_seconds=5)
