"""Fixtures for the run lifecycle; the broker, worker and fake model are the integration suite's."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from agent_engine.runtime.loop import Runtime


@pytest.fixture
async def runtime(engine: AsyncEngine) -> AsyncIterator[Runtime]:
    async with Runtime(engine, model_timeout_seconds=10) as rt:
        yield rt
