from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from agent_engine.runtime.loop import Runtime
from agent_engine.testing import FakeOpenAIServer


@pytest.fixture
async def fake_openai() -> AsyncIterator[FakeOpenAIServer]:
    async with FakeOpenAIServer() as server:
        yield server


@pytest.fixture
async def runtime(engine: AsyncEngine) -> AsyncIterator[Runtime]:
    async with Runtime(engine, model_timeout_seconds=5.0) as runtime:
        yield runtime
