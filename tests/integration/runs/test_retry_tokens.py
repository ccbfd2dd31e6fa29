"""A retry's carried-over steps in the database: copied with their fallback model, and counted in
none of the run's token sums, its cost or its owner's budget week."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from agent_engine.runs.budget import owners_budgets
from agent_engine.runs.retry import retry_run
from tests.integration.runs.support import fetch, run_row
from tests.support.factories import Factories


async def _sql(engine: AsyncEngine, sql: str, **params: Any) -> None:
    async with engine.begin() as conn:
        await conn.execute(text(sql), params)


async def test_reused_steps_keep_their_fallback_and_count_in_no_sum(
    engine: AsyncEngine, factories: Factories
) -> None:
    primary = await factories.model(
        name="Primary", input_price_per_million=1, output_price_per_million=2
    )
    backup = await factories.model(
        name="Backup", input_price_per_million=10, output_price_per_million=20
    )
    owner = await factories.user()
    agent = await factories.agent(user_id=owner["id"], model_id=primary["id"])
    now = datetime.now(UTC)
    failed = await factories.run(
        agent["id"],
        state="failed",
        reason="error",
        model_id=primary["id"],
        tokens_used=150,
        prompt_tokens=100,
        completion_tokens=50,
        finished_at=now - timedelta(minutes=5),
    )
    await _sql(
        engine,
        "INSERT INTO agent_run_steps (run_id, index, kind, name, input, output, error,"
        " prompt_tokens, completion_tokens, started_at, finished_at, fallback, model_id) VALUES"
        " (:r, 0, 'model_call', 'Backup', NULL, '', NULL, 100, 50, :t, :t, true, :m),"
        " (:r, 1, 'tool_call', 'search_knowledge', '{}', 'found', NULL, NULL, NULL, :t, :t,"
        "  false, NULL),"
        " (:r, 2, 'model_call', 'Primary', NULL, NULL, 'Primary failed: HTTP 500', NULL, NULL,"
        "  :t, :t, false, NULL)",
        r=failed["id"],
        t=now - timedelta(minutes=6),
        m=backup["id"],
    )

    retry = await retry_run(engine, failed["id"], now=now, enqueue=lambda _: None)

    copied = await fetch(
        engine,
        "SELECT index, name, fallback, model_id, reused, prompt_tokens FROM agent_run_steps"
        " WHERE run_id = :r ORDER BY index",
        r=retry.id,
    )
    assert copied == [
        {
            "index": 0,
            "name": "Backup",
            "fallback": True,
            "model_id": backup["id"],
            "reused": True,
            "prompt_tokens": 100,
        },
        {
            "index": 1,
            "name": "search_knowledge",
            "fallback": False,
            "model_id": None,
            "reused": True,
            "prompt_tokens": None,
        },
    ]
    # The retry runs one new call on its own model (40 + 10 tokens) and succeeds.
    await _sql(
        engine,
        "UPDATE agent_runs SET state = 'running', started_at = now(), heartbeat_at = now()"
        " WHERE id = :r",
        r=retry.id,
    )
    await _sql(
        engine,
        "INSERT INTO agent_run_steps (run_id, index, kind, name, output, prompt_tokens,"
        " completion_tokens, started_at, finished_at) VALUES"
        " (:r, 2, 'model_call', 'Primary', 'done', 40, 10, now(), now())",
        r=retry.id,
    )
    await _sql(
        engine,
        "UPDATE agent_runs SET state = 'succeeded', tokens_used = 50, prompt_tokens = 40,"
        " completion_tokens = 10, finished_at = now() WHERE id = :r",
        r=retry.id,
    )

    row = await run_row(engine, retry.id)
    assert (row["tokens_used"], row["prompt_tokens"], row["completion_tokens"]) == (50, 40, 10)
    assert row["cost"] == Decimal("0.00006")  # 40 x 1 + 10 x 2 per million: no backup tokens
    async with engine.connect() as conn:
        budget = (await owners_budgets(conn, [owner["id"]], now=now))[owner["id"]]
    assert budget.used_tokens == 150 + 50
