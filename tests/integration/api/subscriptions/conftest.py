"""Fixtures: the api under Uvicorn (real clock), an HTTP client, and a real Dramatiq worker."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import dramatiq
import httpx
import pytest

from agent_engine.settings import Settings
from agent_engine.workers.broker import close_broker, configure_broker
from agent_engine.workers.main import start_worker, stop_worker
from tests.integration.api.subscriptions.support import Server, running_api

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
def worker(settings: Settings) -> Iterator[dramatiq.Worker]:
    """A real Dramatiq worker in this process (threads) on the real broker (Valkey)."""
    configure_broker(settings)
    started = start_worker(settings, threads=4)
    try:
        yield started
    finally:
        stop_worker(started, grace_seconds=WORKER_STOP_GRACE_SECONDS)
        close_broker()
