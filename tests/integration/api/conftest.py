from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from agent_engine.settings import Settings
from tests.integration.api.support import Api, Clock, running_server


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
async def api(settings: Settings, clock: Clock) -> AsyncIterator[Api]:
    with running_server(settings, clock) as url:
        async with httpx.AsyncClient(timeout=30.0) as client:
            yield Api(url=url, settings=settings, http=client, clock=clock)
