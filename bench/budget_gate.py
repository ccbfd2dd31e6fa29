"""Scenario 3 - budget gate: `runs.budget.owner_budget` for an owner with 50 agents, with a small
and big `agent_runs` (quick: 10k and 200k rows; full: 10k, 1M and 5M).

Every database holds the same current week for the measured owner (50 agents x 20 finished runs)
and differs only in history: older weeks of all owners and this week of the other owners, spread
over 200 owners x 50 agents and five years. Rows come from INSERT ... SELECT generate_series with
triggers off (no NOTIFY storm); the non-primary indexes are dropped and re-created around the load
(same definitions, read from pg_indexes), then VACUUM ANALYZE, as autovacuum would leave them.

The sizes are measured interleaved (one call on each database in turn) so they share the moment.
Baseline: the same SUM statement through raw asyncpg on the small database.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo

import asyncpg

from agent_engine.db.engine import create_engine_for_url
from agent_engine.db.platform import load_platform_settings
from agent_engine.domain.budget import week_window
from agent_engine.runs.budget import owner_budget
from bench.common import Bench, Row, ScenarioResult, summary_ms

TITLE = "Budget gate: owner_budget with a small and a big run journal"
NAME = "budget_gate"
OWNERS = 200
AGENTS_PER_OWNER = 50
OWNER_ID = 1
THIS_WEEK_RUNS_PER_AGENT = 20
HISTORY_WEEKS = 260
TARGET_P50_MS = 2.0
TARGET_GROWTH = 1.5

_SPENT = (
    "SELECT a.user_id, COALESCE(SUM(r.tokens_used), 0) AS used"
    " FROM agents a JOIN agent_runs r ON r.agent_id = a.id"
    " WHERE a.user_id = ANY($1::bigint[])"
    " AND r.finished_at >= $2 AND r.finished_at < $3"
    " GROUP BY a.user_id"
)


async def build(url: str, rows: int, now: datetime) -> float:
    """Fill a database; returns the seconds it took."""
    started = time.perf_counter()
    window = week_window(now, ZoneInfo("UTC"))
    agents = OWNERS * AGENTS_PER_OWNER
    this_week = AGENTS_PER_OWNER * THIS_WEEK_RUNS_PER_AGENT
    history = max(rows - this_week, 0)
    conn = await asyncpg.connect(url)
    try:
        await conn.execute(
            f"""
            INSERT INTO users (id, email, timezone)
            SELECT g, 'u' || g || '@example.com', 'UTC' FROM generate_series(1, {OWNERS}) g;
            INSERT INTO agent_models (id, name, provider, model) VALUES (1, 'b', 'builtin', 'b');
            INSERT INTO platform_settings (key, value) VALUES
                ('agent_weekly_token_cap', '1000000000'::jsonb);
            INSERT INTO agents (id, user_id, name, prompt, model_id) OVERRIDING SYSTEM VALUE
            SELECT g, 1 + (g - 1) / {AGENTS_PER_OWNER}, 'agent ' || g, 'p', 1
            FROM generate_series(1, {agents}) g
            """
        )
        indexes = await conn.fetch(
            "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'agent_runs'"
            " AND indexname <> 'pk_agent_runs'"
        )
        await conn.execute("SET session_replication_role = replica")  # no triggers, no FK checks
        await conn.execute("SET maintenance_work_mem = '512MB'")
        for index in indexes:
            await conn.execute(f'DROP INDEX "{index["indexname"]}"')
        # The measured owner's week: agents 1..50, finished between the week's start and now.
        await conn.execute(
            """
            INSERT INTO agent_runs (agent_id, trigger, state, tokens_used, started_at,
                                    finished_at, heartbeat_at, created_at)
            SELECT 1 + g % $1::int, 'scheduled', 'succeeded', 100 + g % 900,
                   f - interval '20 seconds', f, f, f - interval '21 seconds'
            FROM (SELECT g, $2::timestamptz + ($3::timestamptz - $2::timestamptz)
                                * (g::float8 / $4::int) AS f
                  FROM generate_series(1, $4::int) g) s
            """,
            AGENTS_PER_OWNER,
            window.start,
            now,
            this_week,
        )
        # History: every agent; the measured owner's agents only before this week.
        await conn.execute(
            """
            INSERT INTO agent_runs (agent_id, trigger, state, reason, tokens_used, started_at,
                                    finished_at, heartbeat_at, created_at)
            SELECT agent_id, 'scheduled',
                   CASE WHEN g % 20 = 0 THEN 'skipped' ELSE 'succeeded' END,
                   CASE WHEN g % 20 = 0 THEN 'budget_exceeded' END,
                   CASE WHEN g % 20 = 0 THEN 0 ELSE 50 + (g * 37) % 5000 END,
                   f - interval '30 seconds', f, f, f - interval '31 seconds'
            FROM (SELECT g, 1 + (g::bigint * 7919) % $1::int AS agent_id,
                         CASE WHEN 1 + (g::bigint * 7919) % $1::int <= $2::int
                              THEN $3::timestamptz - random() * $4::int * interval '1 week'
                              ELSE $5::timestamptz - random() * ($4::int + 1) * interval '1 week'
                         END AS f
                  FROM generate_series(1, $6::int) g) s
            """,
            agents,
            AGENTS_PER_OWNER,
            window.start,
            HISTORY_WEEKS,
            now,
            history,
        )
        for index in indexes:
            await conn.execute(index["indexdef"])
        await conn.execute("RESET session_replication_role")
        await conn.execute("VACUUM ANALYZE")
    finally:
        await conn.close()
    return time.perf_counter() - started


async def explain(url: str, now: datetime) -> dict[str, Any]:
    window = week_window(now, ZoneInfo("UTC"))
    conn = await asyncpg.connect(url)
    try:
        plan = await conn.fetchval(
            "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + _SPENT,
            [OWNER_ID],
            window.start,
            window.end,
        )
        text_plan = await conn.fetch(
            "EXPLAIN (ANALYZE, BUFFERS) " + _SPENT, [OWNER_ID], window.start, window.end
        )
        rows = await conn.fetchval("SELECT count(*) FROM agent_runs")
    finally:
        await conn.close()
    import json

    top = json.loads(plan)[0] if isinstance(plan, str) else plan[0]
    return {
        "rows": int(rows),
        "execution_ms": top["Execution Time"],
        "planning_ms": top["Planning Time"],
        "plan": [r[0] for r in text_plan],
    }


async def run(bench: Bench) -> ScenarioResult:
    sizes = [10_000, 200_000] if bench.quick else [10_000, 1_000_000, 5_000_000]
    iterations = 300 if bench.quick else 1_000
    result = ScenarioResult(NAME, TITLE)
    now = datetime.now(UTC)
    urls: dict[int, str] = {}
    build_seconds: dict[int, float] = {}
    for size in sizes:
        urls[size] = await bench.create_database(f"budget_{size}")
        build_seconds[size] = await build(urls[size], size, now)
    engines = {size: create_engine_for_url(url, pool_size=1) for size, url in urls.items()}
    raw = await asyncpg.connect(urls[sizes[0]])
    times: dict[Any, list[float]] = {size: [] for size in sizes}
    times["raw"] = []
    used: dict[int, int] = {}
    window = week_window(now, ZoneInfo("UTC"))
    try:
        conns = {size: await engine.connect() for size, engine in engines.items()}
        try:
            for conn in conns.values():  # warm: prepared statements, caches
                for _ in range(20):
                    await owner_budget(conn, OWNER_ID, now=now)
                    await conn.rollback()
            for _ in range(20):
                await raw.fetch(_SPENT, [OWNER_ID], window.start, window.end)
            for _ in range(iterations):
                for size, conn in conns.items():
                    started = time.perf_counter()
                    budget = await owner_budget(conn, OWNER_ID, now=now)
                    times[size].append(time.perf_counter() - started)
                    used[size] = budget.used_tokens
                    await conn.rollback()
                started = time.perf_counter()
                await raw.fetch(_SPENT, [OWNER_ID], window.start, window.end)
                times["raw"].append(time.perf_counter() - started)
            platform = await load_platform_settings(conns[sizes[0]])
        finally:
            for conn in conns.values():
                await conn.close()
    finally:
        await raw.close()
        for engine in engines.values():
            await engine.dispose()
    plans = {size: await explain(url, now) for size, url in urls.items()}
    stats = {key: summary_ms(values) for key, values in times.items()}
    small, big = sizes[0], sizes[-1]
    same_sum = len(set(used.values())) == 1
    for size in sizes:
        result.add(
            Row(
                f"owner_budget p50, {plans[size]['rows']:,} rows",
                stats[size]["p50_ms"],
                "ms",
                baseline=stats["raw"]["p50_ms"],
                baseline_label="raw asyncpg SUM, small",
                target=f"≤ {TARGET_P50_MS:g} ms",
                ok=stats[size]["p50_ms"] <= TARGET_P50_MS,
                note=f"SUM executes in {plans[size]['execution_ms']:.2f} ms in the server "
                f"(EXPLAIN ANALYZE); p99 {stats[size]['p99_ms']:.2f} ms",
            )
        )
    growth = stats[big]["p50_ms"] / stats[small]["p50_ms"]
    result.add(
        Row(
            f"history growth: p50 at {big:,} ÷ at {small:,} rows",
            stats[big]["p50_ms"],
            "ms",
            baseline=stats[small]["p50_ms"],
            baseline_label=f"{small:,} rows",
            target=f"ratio ≤ {TARGET_GROWTH}",
            ok=growth <= TARGET_GROWTH and same_sum,
            note=f"same week sum everywhere: {same_sum} ({sorted(set(used.values()))})",
        )
    )
    result.details = {
        "iterations": iterations,
        "build_seconds": build_seconds,
        "latency": {str(k): v for k, v in stats.items()},
        "explain": {str(k): v for k, v in plans.items()},
        "cap": platform.weekly_token_cap,
    }
    for url in urls.values():
        await bench.drop_database(url)
    return result
