"""Retries of one failed run racing each other: the database lets exactly one through."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from sqlalchemy.ext.asyncio import AsyncEngine

from agent_engine.runs.retry import AlreadyRetried, retry_run
from tests.integration.runs.support import fetch
from tests.support.factories import Factories


async def test_simultaneous_retries_of_one_run_queue_one_and_refuse_the_rest(
    engine: AsyncEngine, factories: Factories
) -> None:
    agent = await factories.agent()
    failed = await factories.run(
        agent["id"], state="failed", reason="error", finished_at=datetime.now(UTC)
    )
    sent: list[int] = []

    results = await asyncio.gather(
        *(
            retry_run(engine, failed["id"], now=datetime.now(UTC), enqueue=sent.append)
            for _ in range(8)
        ),
        return_exceptions=True,
    )

    queued = [r for r in results if not isinstance(r, BaseException)]
    refused = [r for r in results if isinstance(r, BaseException)]
    assert [(r.state, r.trigger, r.retry_of) for r in queued] == [("queued", "retry", failed["id"])]
    assert len(refused) == 7 and all(isinstance(r, AlreadyRetried) for r in refused), refused
    assert sent == [queued[0].id]
    rows = await fetch(
        engine, "SELECT count(*) AS n FROM agent_runs WHERE agent_id = :a", a=agent["id"]
    )
    assert rows == [{"n": 2}]  # the failed run and its one retry: no skipped rows either
