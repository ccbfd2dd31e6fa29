"""Fixtures: fast delivery settings, the target's signing secret and the clock's delivery tick
(the api, worker and fake model are the integration suite's)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import dramatiq
import pytest

from agent_engine.delivery.signing import new_secret
from agent_engine.settings import Settings
from agent_engine.workers.broker import send_delivery_tick

SECRET_ENV = "AGENT_ENGINE_TEST_HOOK_SECRET"
TICK_SECONDS = 0.2


@pytest.fixture
def settings(settings: Settings) -> Settings:
    """Retries a few tenths of a second apart (the real schedule spans hours)."""
    return settings.model_copy(
        update={"delivery_retry_schedule_seconds": [0.3, 0.3], "delivery_lease_seconds": 5.0}
    )


@pytest.fixture
def secret(monkeypatch: pytest.MonkeyPatch) -> str:
    """The target's signing secret, in the environment of the (in-process) worker."""
    value = new_secret()
    monkeypatch.setenv(SECRET_ENV, value)
    return value


@pytest.fixture
async def delivery_ticks(worker: dramatiq.Worker) -> AsyncIterator[None]:
    """What `agent-engine clock` does for deliveries: a dispatch tick every few tenths."""

    async def tick() -> None:
        while True:
            await asyncio.to_thread(send_delivery_tick)
            await asyncio.sleep(TICK_SECONDS)

    task = asyncio.ensure_future(tick())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
