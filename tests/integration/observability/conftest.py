from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime

import httpx
import pytest

from agent_engine.settings import Settings
from tests.integration.api.support import Api, Clock, running_server


@pytest.fixture
async def api(settings: Settings) -> AsyncIterator[Api]:
    """The real api under Uvicorn, on the real clock (metrics are read on the database's)."""
    clock = Clock(now=datetime.now(UTC))
    with running_server(settings, clock) as url:
        async with httpx.AsyncClient(timeout=30.0) as client:
            yield Api(url=url, settings=settings, http=client, clock=clock)
