"""What the database does when a run ends, whichever path ends it (e0004): open steps are
closed, the token split adds up, and the outbox gets one delivery per enabled target."""

from __future__ import annotations

import pytest
from sqlalchemy import text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.integration.runs.support import fetch
from tests.support.factories import Factories


async def _execute(engine: AsyncEngine, sql: str, **params: object) -> None:
    async with engine.begin() as conn:
        await conn.execute(text(sql), params)


async def _targets(engine: AsyncEngine, agent_id: int, *enabled: bool) -> None:
    for index, on in enumerate(enabled):
        async with engine.begin() as conn:
            target = (
                await conn.execute(
                    text(
                        "INSERT INTO delivery_targets (name, url, secret_env, enabled)"
                        " VALUES (:n, 'https://h.example.com/', 'S', :on) RETURNING id"
                    ),
                    {"n": f"t{index}", "on": on},
                )
            ).scalar_one()
            await conn.execute(
                text("INSERT INTO agent_delivery_targets (agent_id, target_id) VALUES (:a, :t)"),
                {"a": agent_id, "t": target},
            )


async def test_a_reaped_run_closes_its_open_step_and_splits_its_tokens(
    engine: AsyncEngine, factories: Factories
) -> None:
    agent = await factories.agent(name="Digest")
    run = await factories.run(agent["id"], state="running", tokens_used=0)
    await _execute(
        engine,
        "INSERT INTO agent_run_steps (run_id, index, kind, name, prompt_tokens, completion_tokens,"
        " started_at, finished_at) VALUES (:r, 0, 'model_call', 'm', 100, 10, now(), now()),"
        " (:r, 1, 'tool_call', 'calculator', NULL, NULL, now(), NULL)",
        r=run["id"],
    )
    # The heartbeat counted a second model call the transcript never saw finish.
    await _execute(engine, "UPDATE agent_runs SET tokens_used = 150 WHERE id = :r", r=run["id"])
    await _execute(
        engine,
        "UPDATE agent_runs SET state = 'failed', reason = 'stale', finished_at = now()"
        " WHERE id = :r",
        r=run["id"],
    )

    (row,) = await fetch(engine, "SELECT * FROM agent_runs WHERE id = :r", r=run["id"])
    assert (row["tokens_used"], row["prompt_tokens"], row["completion_tokens"]) == (150, 100, 50)
    steps = await fetch(engine, "SELECT * FROM agent_run_steps ORDER BY index")
    assert steps[1]["finished_at"] == row["finished_at"]
    assert steps[1]["error"] == "the run ended (failed/stale) during this step"
    assert steps[0]["error"] is None


async def test_every_terminal_path_writes_one_delivery_per_enabled_target(
    engine: AsyncEngine, factories: Factories
) -> None:
    agent = await factories.agent(name="Digest")
    await _targets(engine, agent["id"], True, True, False)
    skipped = await factories.run(agent["id"], state="skipped", reason="budget_exceeded")
    running = await factories.run(agent["id"], state="running")
    await _execute(
        engine,
        "UPDATE agent_runs SET state = 'failed', reason = 'cancelled', finished_at = now()"
        " WHERE id = :r",
        r=running["id"],
    )
    rows = await fetch(engine, "SELECT * FROM run_deliveries ORDER BY run_id, target_id")
    assert [(r["run_id"], r["event_type"], r["status"]) for r in rows] == [
        (skipped["id"], "run.skipped", "pending"),
        (skipped["id"], "run.skipped", "pending"),
        (running["id"], "run.failed", "pending"),
        (running["id"], "run.failed", "pending"),
    ]
    assert len({r["webhook_id"] for r in rows}) == 4
    data = rows[2]["payload"]["data"]
    assert (data["runId"], data["agentName"], data["reason"]) == (
        str(running["id"]),
        "Digest",
        "cancelled",
    )
    # A queued → running transition is not an end: nothing more is written.
    queued = await factories.run(agent["id"], state="queued")
    await _execute(engine, "UPDATE agent_runs SET state = 'running' WHERE id = :r", r=queued["id"])
    assert len(await fetch(engine, "SELECT id FROM run_deliveries")) == 4


async def test_cancelled_fits_only_failed(factories: Factories) -> None:
    agent = await factories.agent()
    await factories.run(agent["id"], state="failed", reason="cancelled")
    with pytest.raises(IntegrityError, match="ck_agent_runs_reason_fits_state"):
        await factories.run(agent["id"], state="skipped", reason="cancelled")


async def test_a_step_index_is_unique_per_run(engine: AsyncEngine, factories: Factories) -> None:
    agent = await factories.agent()
    run = await factories.run(agent["id"], state="running")
    insert = (
        "INSERT INTO agent_run_steps (run_id, index, kind, name, started_at)"
        " VALUES (:r, 0, :kind, 'm', now())"
    )
    await _execute(engine, insert, r=run["id"], kind="model_call")
    with pytest.raises(IntegrityError, match="pk_agent_run_steps"):
        await _execute(engine, insert, r=run["id"], kind="model_call")
    with pytest.raises(IntegrityError, match="ck_agent_run_steps_kind"):
        await _execute(engine, insert.replace(":r, 0", ":r, 1"), r=run["id"], kind="thought")
