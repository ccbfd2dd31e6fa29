"""The database holds the seed's invariants by itself: exercised directly in SQL."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime

import asyncpg
import pytest
from sqlalchemy import text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine

from agent_engine.settings import to_libpq_url
from tests.support.factories import Factories

DUE = datetime(2030, 1, 1, tzinfo=UTC)
SCHEDULE = {"type": "interval", "every_hours": 6}


async def scalar(engine: AsyncEngine, sql: str, **params: object) -> object:
    async with engine.begin() as conn:
        return (await conn.execute(text(sql), params)).scalar()


async def test_second_unfinished_run_is_refused_but_skipped_is_accepted(
    engine: AsyncEngine, factories: Factories
) -> None:
    agent = await factories.agent()
    await factories.run(agent["id"], state="queued")
    with pytest.raises(IntegrityError, match="uq_agent_runs_one_unfinished"):
        await factories.run(agent["id"], state="running")
    with pytest.raises(IntegrityError, match="uq_agent_runs_one_unfinished"):
        await factories.run(agent["id"], state="queued")
    skipped = await factories.run(agent["id"], state="skipped", reason="already_running")
    assert skipped["tokens_used"] == 0
    assert await scalar(engine, "SELECT count(*) FROM agent_runs") == 2


@pytest.mark.parametrize(
    ("values", "constraint"),
    [
        ({"state": "paused"}, "ck_agent_runs_state"),
        ({"trigger": "webhook"}, "ck_agent_runs_trigger"),
        ({"state": "skipped", "reason": "stale"}, "ck_agent_runs_reason_fits_state"),
        ({"state": "skipped"}, "ck_agent_runs_reason_fits_state"),
        ({"state": "failed", "reason": "budget_exceeded"}, "ck_agent_runs_reason_fits_state"),
        ({"state": "failed"}, "ck_agent_runs_reason_fits_state"),
        ({"state": "succeeded", "reason": "error"}, "ck_agent_runs_reason_fits_state"),
        ({"state": "queued", "reason": "already_running"}, "ck_agent_runs_reason_fits_state"),
        ({"state": "failed", "reason": "gremlins"}, "ck_agent_runs_reason"),
        ({"state": "skipped", "reason": "token_cap"}, "ck_agent_runs_reason_fits_state"),
        ({"state": "failed", "reason": "agent_budget_exceeded"}, "ck_agent_runs_reason_fits_state"),
    ],
)
async def test_bad_state_trigger_or_reason_is_refused(
    factories: Factories, values: dict[str, str], constraint: str
) -> None:
    agent = await factories.agent()
    with pytest.raises(IntegrityError, match=constraint):
        await factories.run(agent["id"], **values)


@pytest.mark.parametrize(
    ("state", "reason"),
    [
        ("skipped", "budget_exceeded"),
        ("skipped", "already_running"),
        ("failed", "iteration_cap"),
        ("failed", "error"),
        ("failed", "stale"),
        ("failed", "token_cap"),
        ("skipped", "agent_budget_exceeded"),
        ("succeeded", None),
        ("running", None),
    ],
)
async def test_reasons_that_fit_their_state_are_accepted(
    factories: Factories, state: str, reason: str | None
) -> None:
    agent = await factories.agent()
    row = await factories.run(agent["id"], state=state, reason=reason)
    assert (row["state"], row["reason"]) == (state, reason)


async def test_deleting_an_agent_cascades_to_runs_and_tool_links(
    engine: AsyncEngine, factories: Factories
) -> None:
    agent = await factories.agent()
    tool = await factories.tool("calculator")
    await factories.run(agent["id"], state="succeeded")
    async with engine.begin() as conn:
        await conn.execute(
            text("INSERT INTO agent_tools (agent_id, tool_id) VALUES (:a, :t)"),
            {"a": agent["id"], "t": tool["id"]},
        )
        await conn.execute(text("DELETE FROM agents WHERE id = :a"), {"a": agent["id"]})
    assert await scalar(engine, "SELECT count(*) FROM agent_runs") == 0
    assert await scalar(engine, "SELECT count(*) FROM agent_tools") == 0
    assert await scalar(engine, "SELECT count(*) FROM tools") == 1


async def test_deleting_a_tool_removes_only_the_link(
    engine: AsyncEngine, factories: Factories
) -> None:
    agent = await factories.agent()
    tool = await factories.tool("calculator")
    async with engine.begin() as conn:
        await conn.execute(
            text("INSERT INTO agent_tools (agent_id, tool_id) VALUES (:a, :t)"),
            {"a": agent["id"], "t": tool["id"]},
        )
        await conn.execute(text("DELETE FROM tools WHERE id = :t"), {"t": tool["id"]})
    assert await scalar(engine, "SELECT count(*) FROM agent_tools") == 0
    assert await scalar(engine, "SELECT count(*) FROM agents") == 1


async def test_duplicate_tool_link_is_refused(engine: AsyncEngine, factories: Factories) -> None:
    agent = await factories.agent()
    tool = await factories.tool("calculator")
    insert = text("INSERT INTO agent_tools (agent_id, tool_id) VALUES (:a, :t)")
    async with engine.begin() as conn:
        await conn.execute(insert, {"a": agent["id"], "t": tool["id"]})
    with pytest.raises(IntegrityError, match="uq_agent_tools_agent_id_tool_id"):
        async with engine.begin() as conn:
            await conn.execute(insert, {"a": agent["id"], "t": tool["id"]})


async def test_deleting_a_user_cascades_to_their_agents(
    engine: AsyncEngine, factories: Factories
) -> None:
    agent = await factories.agent()
    async with engine.begin() as conn:
        await conn.execute(text("DELETE FROM users WHERE id = :u"), {"u": agent["user_id"]})
    assert await scalar(engine, "SELECT count(*) FROM agents") == 0


async def test_deleting_the_model_clears_model_id_and_next_run_at(
    engine: AsyncEngine, factories: Factories
) -> None:
    agent = await factories.agent(schedule=SCHEDULE, next_run_at=DUE)
    assert agent["next_run_at"] is not None
    async with engine.begin() as conn:
        await conn.execute(text("DELETE FROM agent_models WHERE id = :m"), {"m": agent["model_id"]})
    async with engine.begin() as conn:
        row = (
            await conn.execute(
                text("SELECT model_id, next_run_at FROM agents WHERE id = :a"), {"a": agent["id"]}
            )
        ).one()
    assert tuple(row) == (None, None)


@pytest.mark.parametrize(
    "change",
    ["enabled = false", "admin_paused = true", "model_id = NULL", "schedule = NULL"],
)
async def test_closing_the_gate_clears_next_run_at(
    engine: AsyncEngine, factories: Factories, change: str
) -> None:
    agent = await factories.agent(schedule=SCHEDULE, next_run_at=DUE)
    async with engine.begin() as conn:
        await conn.execute(text(f"UPDATE agents SET {change} WHERE id = :a"), {"a": agent["id"]})
    assert (
        await scalar(engine, "SELECT next_run_at FROM agents WHERE id = :a", a=agent["id"]) is None
    )


async def test_next_run_at_cannot_be_set_while_the_gate_is_closed(
    engine: AsyncEngine, factories: Factories
) -> None:
    disabled = await factories.agent(schedule=SCHEDULE, enabled=False, next_run_at=DUE)
    paused = await factories.agent(schedule=SCHEDULE, admin_paused=True)
    assert disabled["next_run_at"] is None
    async with engine.begin() as conn:
        await conn.execute(
            text("UPDATE agents SET next_run_at = :due WHERE id = :a"),
            {"due": DUE, "a": paused["id"]},
        )
    assert (
        await scalar(engine, "SELECT next_run_at FROM agents WHERE id = :a", a=paused["id"]) is None
    )


async def test_updated_at_moves_on_edit_but_not_on_scheduler_bookkeeping(
    engine: AsyncEngine, factories: Factories
) -> None:
    agent = await factories.agent(schedule=SCHEDULE)
    async with engine.begin() as conn:
        await conn.execute(
            text("UPDATE agents SET updated_at = now() - interval '1 hour' WHERE id = :a"),
            {"a": agent["id"]},
        )
    before = await scalar(engine, "SELECT updated_at FROM agents WHERE id = :a", a=agent["id"])
    async with engine.begin() as conn:
        await conn.execute(
            text("UPDATE agents SET next_run_at = :due WHERE id = :a"),
            {"due": DUE, "a": agent["id"]},
        )
    assert (
        await scalar(engine, "SELECT updated_at FROM agents WHERE id = :a", a=agent["id"]) == before
    )
    async with engine.begin() as conn:
        await conn.execute(
            text("UPDATE agents SET prompt = 'new' WHERE id = :a"), {"a": agent["id"]}
        )
    after = await scalar(engine, "SELECT updated_at FROM agents WHERE id = :a", a=agent["id"])
    assert after > before  # type: ignore[operator]


async def test_notify_on_insert_and_state_change_but_not_on_heartbeat(
    database_url: str, factories: Factories, engine: AsyncEngine
) -> None:
    agent = await factories.agent()
    received: asyncio.Queue[dict[str, object]] = asyncio.Queue()
    listener = await asyncpg.connect(to_libpq_url(database_url))
    await listener.add_listener(
        "agent_run_events", lambda *args: received.put_nowait(json.loads(args[3]))
    )
    try:
        run = await factories.run(agent["id"], state="queued")
        first = await asyncio.wait_for(received.get(), 5)
        assert first == {
            "run_id": run["id"],
            "agent_id": agent["id"],
            "owner_id": agent["user_id"],
            "state": "queued",
            "previous_state": None,
        }
        async with engine.begin() as conn:
            await conn.execute(
                text("UPDATE agent_runs SET state = 'running', started_at = now() WHERE id = :r"),
                {"r": run["id"]},
            )
        second = await asyncio.wait_for(received.get(), 5)
        assert (second["state"], second["previous_state"]) == ("running", "queued")
        async with engine.begin() as conn:
            await conn.execute(
                text("UPDATE agent_runs SET heartbeat_at = now(), tokens_used = 5 WHERE id = :r"),
                {"r": run["id"]},
            )
            await conn.execute(
                text("UPDATE agent_runs SET state = 'running' WHERE id = :r"), {"r": run["id"]}
            )
        # A marker insert after the heartbeat: if the heartbeat had notified, it would come first.
        other = await factories.agent(user_id=agent["user_id"])
        marker = await factories.run(other["id"], state="skipped", reason="budget_exceeded")
        third = await asyncio.wait_for(received.get(), 5)
        assert third["run_id"] == marker["id"]
        assert received.empty()
    finally:
        await listener.close()


async def test_a_run_is_retried_at_most_once_and_caps_are_positive(factories: Factories) -> None:
    agent = await factories.agent()
    failed = await factories.run(agent["id"], state="failed", reason="error")
    retry = await factories.run(
        agent["id"], state="failed", reason="error", trigger="retry", retry_of=failed["id"]
    )
    assert retry["retry_of"] == failed["id"]
    with pytest.raises(IntegrityError, match="uq_agent_runs_retry_of"):
        await factories.run(agent["id"], state="succeeded", trigger="retry", retry_of=failed["id"])
    for column in ("weekly_token_cap", "max_tokens_per_run"):
        with pytest.raises(IntegrityError, match=f"ck_agents_{column}_positive"):
            await factories.agent(**{column: 0})
