"""`budget_weeks`: each owner's week as a running total kept by the database, which the budget gate
reads instead of summing the week (migration `e0008_budget_weeks`).

A row may be missing (the reader sums), never wrong: after every kind of write — finishes racing
each other for an owner's first row of the week, bulk inserts, edited and deleted runs, a zone
changed mid-week, TRUNCATE — each row equals the sum of its own window's runs.
"""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from agent_engine.db.platform import TIMEZONE
from agent_engine.db.spend import spent_tokens
from agent_engine.domain.budget import week_window
from agent_engine.domain.runs import RunState
from agent_engine.domain.zones import zone_or_utc
from agent_engine.runs.finish import finish
from tests.integration.db.support import rows_read_from_runs, week_sum_plan
from tests.support.factories import Factories

# Each row against the sum of its own window, recomputed from the journal.
_DRIFT = text(
    "SELECT b.user_id, b.window_start, b.tokens_used, COALESCE(s.used, 0) AS summed"
    " FROM budget_weeks b LEFT JOIN LATERAL ("
    "   SELECT SUM(r.tokens_used) AS used FROM agents a JOIN agent_runs r ON r.agent_id = a.id"
    "   WHERE a.user_id = b.user_id"
    "   AND r.finished_at >= b.window_start AND r.finished_at < b.window_end) s ON true"
    " WHERE b.tokens_used <> COALESCE(s.used, 0)"
)
_ROWS = text("SELECT user_id, window_start, window_end, tokens_used FROM budget_weeks")


async def _assert_exact(engine: AsyncEngine) -> list[dict[str, Any]]:
    """Every row equals its window's sum; the rows."""
    async with engine.connect() as conn:
        drift = [dict(r._mapping) for r in await conn.execute(_DRIFT)]
        rows = [dict(r._mapping) for r in await conn.execute(_ROWS)]
    assert drift == [], drift
    return rows


async def _running(factories: Factories, agent_id: int) -> int:
    now = datetime.now(UTC)
    run = await factories.run(
        agent_id, state="running", created_at=now, started_at=now, heartbeat_at=now
    )
    return int(run["id"])


async def test_racing_first_finishes_of_a_week_count_every_run_once(
    engine: AsyncEngine, factories: Factories
) -> None:
    owners = [await factories.user() for _ in range(4)]
    runs: list[tuple[int, int]] = []  # (owner, run)
    for owner in owners:
        for i in range(6):
            agent = await factories.agent(owner["id"], name=f"agent {i}")
            runs.append((owner["id"], await _running(factories, agent["id"])))

    # Every owner's first finishes of the week at once: each one may find no row yet.
    async def one(index: int, run_id: int) -> None:
        await finish(
            engine,
            run_id,
            state=RunState.SUCCEEDED,
            reason=None,
            tokens=100 + index,
            prompt_tokens=60 + index,
            completion_tokens=40,
            output="done",
        )

    await asyncio.gather(*(one(i, run_id) for i, (_, run_id) in enumerate(runs)))

    rows = await _assert_exact(engine)
    window = week_window(datetime.now(UTC), ZoneInfo("UTC"))
    expected = {
        owner["id"]: sum(100 + i for i, (o, _) in enumerate(runs) if o == owner["id"])
        for owner in owners
    }
    assert {r["user_id"]: r["tokens_used"] for r in rows} == expected
    assert {(r["window_start"], r["window_end"]) for r in rows} == {(window.start, window.end)}
    async with engine.connect() as conn:
        assert await spent_tokens(conn, [o["id"] for o in owners], window=window) == expected


async def test_bulk_inserts_edits_and_deletes_keep_each_row_exact(
    engine: AsyncEngine, factories: Factories
) -> None:
    owner, other = await factories.user(), await factories.user()
    mine = [await factories.agent(owner["id"], name=f"mine {i}") for i in range(3)]
    theirs = await factories.agent(other["id"])
    now = datetime.now(UTC)
    week = week_window(now, ZoneInfo("UTC"))
    async with engine.begin() as conn:
        # Several finished runs in one statement (each row's trigger sees the ones before it),
        # one of them a week earlier.
        await conn.execute(
            text(
                "INSERT INTO agent_runs (agent_id, trigger, state, tokens_used, created_at,"
                " started_at, finished_at)"
                " SELECT a, 'manual', 'succeeded', 10 * g, t, t, t"
                " FROM unnest(CAST(:agents AS bigint[])) a, generate_series(1, 4) g,"
                " LATERAL (SELECT CAST(:t AS timestamptz)"
                "   - make_interval(days => 7 * (g % 2)) AS t) w"
            ),
            {"agents": [a["id"] for a in (*mine, theirs)], "t": now},
        )
    rows = await _assert_exact(engine)
    assert len(rows) == 4  # two weeks of two owners

    run = await factories.run(mine[0]["id"], state="succeeded", tokens_used=500, finished_at=now)
    await _assert_exact(engine)
    async with engine.begin() as conn:
        # An edited finished run: its tokens, then its finish moved back a week.
        await conn.execute(
            text("UPDATE agent_runs SET tokens_used = 700 WHERE id = :id"), {"id": run["id"]}
        )
        await conn.execute(
            text(
                "UPDATE agent_runs SET finished_at = finished_at - interval '7 days' WHERE id = :id"
            ),
            {"id": run["id"]},
        )
    await _assert_exact(engine)
    async with engine.begin() as conn:
        # A finished run no longer finished, and several runs deleted in one statement.
        await conn.execute(
            text("UPDATE agent_runs SET finished_at = NULL, state = 'running' WHERE id = :id"),
            {"id": run["id"]},
        )
        await conn.execute(
            text("DELETE FROM agent_runs WHERE agent_id = :a AND tokens_used IN (10, 30)"),
            {"a": mine[1]["id"]},
        )
    rows = await _assert_exact(engine)
    by_week = {(r["user_id"], r["window_start"]): r["tokens_used"] for r in rows}
    last = week.start - timedelta(days=7)
    # This week 20 + 40 per agent; last week 10 + 30 per agent, less agent 1's deleted runs.
    assert by_week == {
        (owner["id"], week.start): 180,
        (other["id"], week.start): 60,
        (owner["id"], last): 80,
        (other["id"], last): 40,
    }


async def test_a_zone_changed_mid_week_keeps_the_old_row_exact_and_starts_the_new_one(
    engine: AsyncEngine, factories: Factories
) -> None:
    owner = await factories.user()
    agent = await factories.agent(owner["id"])
    for tokens in (100, 200):
        await finish(
            engine,
            await _running(factories, agent["id"]),
            state=RunState.SUCCEEDED,
            reason=None,
            tokens=tokens,
            prompt_tokens=tokens,
        )
    await factories.setting(TIMEZONE, "Pacific/Auckland")
    await finish(
        engine,
        await _running(factories, agent["id"]),
        state=RunState.SUCCEEDED,
        reason=None,
        tokens=40,
        prompt_tokens=40,
    )

    rows = await _assert_exact(engine)
    now = datetime.now(UTC)
    utc = week_window(now, ZoneInfo("UTC"))
    auckland = week_window(now, ZoneInfo("Pacific/Auckland"))
    windows = {(r["window_start"], r["window_end"]): r["tokens_used"] for r in rows}
    # The UTC week counted the later finish too; Auckland's week was made from its own sum.
    assert windows[(utc.start, utc.end)] == 340
    assert (auckland.start, auckland.end) in windows


# Zones where local midnight moves (DST at midnight, half- and quarter-hour offsets, a day
# skipped), instants around their changes; and names only one side could read.
_ZONES = (
    "UTC",
    "Europe/Berlin",
    "America/New_York",
    "America/Santiago",
    "America/Havana",
    "Asia/Kathmandu",
    "Australia/Lord_Howe",
    "Pacific/Apia",
    "Asia/Beirut",
)
_INSTANTS = tuple(
    datetime(2026, 1, 1, tzinfo=UTC) + timedelta(hours=h) for h in range(0, 365 * 24, 53)
)


@pytest.mark.parametrize("zone", [*_ZONES, "Not/A_Zone", ""])
async def test_the_database_keys_a_week_as_the_gate_computes_it(
    engine: AsyncEngine, factories: Factories, zone: str
) -> None:
    await factories.setting(TIMEZONE, zone)
    async with engine.connect() as conn:
        keyed = (
            await conn.execute(
                text(
                    "SELECT w.window_start, w.window_end"
                    " FROM unnest(CAST(:at AS timestamptz[])) t CROSS JOIN LATERAL"
                    " budget_week_of(t) w"
                ),
                {"at": list(_INSTANTS)},
            )
        ).all()
    expected = [week_window(at, zone_or_utc(zone)) for at in _INSTANTS]
    mismatched = [
        (at, tuple(got), (want.start, want.end))
        for at, got, want in zip(_INSTANTS, keyed, expected, strict=True)
        if tuple(got) != (want.start, want.end)
    ]
    assert mismatched == []


async def test_truncate_and_moved_or_deleted_agents_forget_the_rows(
    engine: AsyncEngine, factories: Factories
) -> None:
    owner, other = await factories.user(), await factories.user()
    agent = await factories.agent(owner["id"])
    kept = await factories.agent(other["id"])
    now = datetime.now(UTC)
    for a in (agent, kept):
        await factories.run(a["id"], state="succeeded", tokens_used=50, finished_at=now)
    async with engine.begin() as conn:
        await conn.execute(
            text("UPDATE agents SET user_id = :u WHERE id = :a"),
            {"u": other["id"], "a": agent["id"]},
        )
    assert await _assert_exact(engine) == []  # both owners' rows forgotten, to be made again
    await factories.run(kept["id"], state="succeeded", tokens_used=5, finished_at=now)
    assert [r["tokens_used"] for r in await _assert_exact(engine)] == [105]

    async with engine.begin() as conn:
        await conn.execute(text("DELETE FROM agents WHERE id = :a"), {"a": agent["id"]})
    assert await _assert_exact(engine) == []
    await factories.run(kept["id"], state="succeeded", tokens_used=5, finished_at=now)
    assert [r["tokens_used"] for r in await _assert_exact(engine)] == [60]

    async with engine.begin() as conn:
        await conn.execute(text("TRUNCATE agent_runs CASCADE"))
    assert await _assert_exact(engine) == []
    async with engine.connect() as conn:
        window = week_window(now, ZoneInfo("UTC"))
        assert await spent_tokens(conn, [other["id"]], window=window) == {other["id"]: 0}


async def test_the_gate_reads_the_row_and_not_the_week(
    engine: AsyncEngine, factories: Factories
) -> None:
    owner = await factories.user()
    agents = [await factories.agent(owner["id"], name=f"agent {i}") for i in range(20)]
    now = datetime.now(UTC)
    for agent in agents:
        for _ in range(3):
            await factories.run(agent["id"], state="succeeded", tokens_used=7, finished_at=now)
    window = week_window(now, ZoneInfo("UTC"))
    async with engine.connect() as conn:
        plan = await week_sum_plan(conn, owner["id"], window)
        used = await spent_tokens(conn, [owner["id"]], window=window)
    assert used == {owner["id"]: 420}
    assert rows_read_from_runs(plan) == 0, json.dumps(plan, indent=1)
