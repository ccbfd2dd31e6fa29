"""Scenario 3 - budget gate: the owner's budget gate production runs
(`runs.budget.owners_over_budget` for one owner: the request's, the claim's and the retry's gate,
which reads the week's `budget_weeks` row, `db.spend.owner_week_tokens`) for an owner with 50
agents, with a small and big `agent_runs` (quick: 10k and 200k rows; full: 10k, 1M and 5M).

Every database holds the same current week for the measured owner (50 agents x 20 finished runs)
and differs only in history: older weeks of all owners and this week of the other owners, spread
over 200 owners x 50 agents and five years. Rows come from INSERT ... SELECT generate_series with
triggers off (no NOTIFY storm); the non-primary indexes are dropped and re-created around the load
(same definitions, read from pg_indexes), then VACUUM ANALYZE, as autovacuum would leave them. The
`budget_weeks` rows the `agent_runs_week_tokens` trigger would have written (one per owner and
week with counted runs, migration e0008) are written after the load from the same runs.

The sizes are measured interleaved (one call on each database in turn) so they share the moment.
Baseline: the same gate statement through raw asyncpg on the small database.

Forecast row: the API's `Budget.forecast` (a real api process) for one more owner with 200
scheduled agents (a third hourly, a third daily, a third weekly; 10 finished runs of history
each; zone Europe/Berlin) on the small database, with a cap the forecast reaches mid-week (so
`exhausts_at` is searched for). Baseline: the same request without the forecast field, interleaved.
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo

import asyncpg
import httpx
import psutil

from agent_engine.api.auth import mint_token
from agent_engine.db.engine import create_engine_for_url
from agent_engine.db.platform import load_platform_settings
from agent_engine.db.spend import owner_week_tokens, spent_tokens
from agent_engine.domain.budget import week_window
from agent_engine.runs.budget import owners_over_budget
from bench.common import (
    JWT_SECRET,
    Bench,
    Process,
    Row,
    ScenarioResult,
    python_module_command,
    read_port_line,
    summary_ms,
)

TITLE = "Budget gate: the owner's week gate with a small and a big run journal"
NAME = "budget_gate"
OWNERS = 200
AGENTS_PER_OWNER = 50
OWNER_ID = 1
THIS_WEEK_RUNS_PER_AGENT = 20
HISTORY_WEEKS = 260
TARGET_P50_MS = 2.0
TARGET_GROWTH = 1.5
FORECAST_OWNER_ID = OWNERS + 1
FORECAST_AGENTS = 200
FORECAST_HISTORY_RUNS = 10
FORECAST_CAP = 1_000_000
FORECAST_TARGET_P50_MS = 20.0

# The gate's statement as production sends it (`db.spend.spent_tokens` for one owner), with
# asyncpg's positional parameters: the week's `budget_weeks` row, the sum when there is none.
_SPENT = "SELECT " + owner_week_tokens("$1::bigint").replace(":start", "$2").replace(":end", "$3")

# The rows the `agent_runs_week_tokens` trigger keeps (it was off during the load): each owner's
# counted tokens per Sunday-to-Sunday week. The bench's platform zone is UTC (no `timezone`
# setting), so the week is computed in UTC as `budget_week_of` would.
_WEEK_ROWS = """
    INSERT INTO budget_weeks (user_id, window_start, window_end, tokens_used)
    SELECT a.user_id, w.start, w.start + interval '7 days', SUM(r.tokens_used)
    FROM agent_runs r JOIN agents a ON a.id = r.agent_id,
         LATERAL (SELECT ((r.finished_at AT TIME ZONE 'UTC')::date
                          - extract(dow FROM r.finished_at AT TIME ZONE 'UTC')::int)::timestamp
                         AT TIME ZONE 'UTC' AS start) w
    WHERE r.finished_at IS NOT NULL AND r.tokens_used <> 0
    GROUP BY a.user_id, w.start
"""


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
            # An index behind a constraint (the retry's unique `retry_of`) stays: it cannot be
            # dropped on its own, and it holds no rows of the load (no run is a retry).
            " AND indexname NOT IN (SELECT conname FROM pg_constraint)"
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
        await conn.execute(_WEEK_ROWS)
        await conn.execute("VACUUM ANALYZE")
    finally:
        await conn.close()
    return time.perf_counter() - started


async def build_forecast_owner(url: str, now: datetime) -> None:
    """One owner with 200 scheduled agents and their history; a cap the forecast reaches."""
    conn = await asyncpg.connect(url)
    try:
        first_agent = OWNERS * AGENTS_PER_OWNER + 1
        await conn.execute(
            f"""
            INSERT INTO users (id, email, timezone)
                VALUES ({FORECAST_OWNER_ID}, 'forecast@example.com', 'Europe/Berlin');
            UPDATE platform_settings SET value = '{FORECAST_CAP}'::jsonb
                WHERE key = 'agent_weekly_token_cap';
            INSERT INTO agents (id, user_id, name, prompt, model_id, schedule, next_run_at)
                OVERRIDING SYSTEM VALUE
            SELECT {first_agent} + g, {FORECAST_OWNER_ID}, 'forecast ' || g, 'p', 1,
                   CASE g % 3
                       WHEN 0 THEN '{{"type": "interval", "every_hours": 1}}'::jsonb
                       WHEN 1 THEN '{{"type": "calendar", "cadence": "daily", "time": "09:00"}}'
                       ELSE '{{"type": "calendar", "cadence": "weekly", "weekday": 4,
                               "time": "14:30"}}'
                   END::jsonb,
                   $1::timestamptz + g * interval '1 minute'
            FROM generate_series(0, {FORECAST_AGENTS - 1}) g;
            """.replace("$1::timestamptz", f"'{now.isoformat()}'::timestamptz")
        )
        await conn.execute(
            """
            INSERT INTO agent_runs (agent_id, trigger, state, tokens_used, prompt_tokens,
                                    started_at, finished_at, heartbeat_at, created_at)
            SELECT a.id, 'scheduled', 'succeeded', 200 + (a.id * 7 + h * 13) % 600,
                   200 + (a.id * 7 + h * 13) % 600,
                   f, f, f, f
            FROM agents a, generate_series(1, $1::int) h,
                 LATERAL (SELECT $2::timestamptz - interval '8 days' + h * interval '1 hour') t(f)
            WHERE a.user_id = $3
            """,
            FORECAST_HISTORY_RUNS,
            now,
            FORECAST_OWNER_ID,
        )
        await conn.execute("VACUUM ANALYZE agents, agent_runs")
        # Once more: an autovacuum ANALYZE started by the load can hold back the visibility map,
        # and the pace is read index-only from `ix_agent_runs_pace` as on a settled journal.
        await conn.execute("VACUUM agent_runs")
    finally:
        await conn.close()


FORECAST_QUERY = (
    "{ viewer { budget { usedTokens forecast { projectedTokens exhaustsAt agentsWithoutHistory }"
    " } } }"
)
BUDGET_QUERY = "{ viewer { budget { usedTokens } } }"


async def measure_forecast(bench: Bench, url: str, iterations: int) -> dict[str, Any]:
    """The API's own forecast (the `Budget.forecast` field, as a dashboard asks for it) against
    the same request without it, interleaved, from one client of a real api process."""
    server = Process(
        python_module_command("bench._api_server"),
        env=bench.env(bench.settings(url, bench.redis_url())),
        log_path=bench.work_dir / "budget_gate-api.log",
    )
    headers = {"Authorization": f"Bearer {mint_token(JWT_SECRET, user_id=FORECAST_OWNER_ID)}"}
    times: dict[str, list[float]] = {"forecast": [], "budget": []}
    try:
        port = await asyncio.to_thread(read_port_line, server)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60) as client:

            async def ask(query: str) -> dict[str, Any]:
                started = time.perf_counter()
                response = await client.post("/graphql", json={"query": query}, headers=headers)
                elapsed = time.perf_counter() - started
                body = response.json()
                if "errors" in body:
                    raise RuntimeError(f"forecast query failed: {body['errors']}")
                body["elapsed"] = elapsed
                return dict(body)

            for _ in range(20):  # warm: connections, prepared statements, caches
                await ask(FORECAST_QUERY)
                await ask(BUDGET_QUERY)
            cpu_before = _cpu_seconds(server.pid)
            for _ in range(iterations):
                answer = await ask(FORECAST_QUERY)
                times["forecast"].append(answer["elapsed"])
                times["budget"].append((await ask(BUDGET_QUERY))["elapsed"])
            cpu = _cpu_seconds(server.pid) - cpu_before
    finally:
        server.stop()
    return {
        "forecast": answer["data"]["viewer"]["budget"]["forecast"],
        "forecast_ms": summary_ms(times["forecast"]),
        "budget_ms": summary_ms(times["budget"]),
        # The api's CPU per pair of requests: on a loaded machine the wall time is mostly
        # waiting for a core, and this says how much of it is the api's own work.
        "cpu_ms": cpu / iterations * 1000,
    }


def _cpu_seconds(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return float(times.user + times.system)


async def explain(url: str, now: datetime) -> dict[str, Any]:
    window = week_window(now, ZoneInfo("UTC"))
    conn = await asyncpg.connect(url)
    try:
        plan = await conn.fetchval(
            "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + _SPENT,
            OWNER_ID,
            window.start,
            window.end,
        )
        text_plan = await conn.fetch(
            "EXPLAIN (ANALYZE, BUFFERS) " + _SPENT, OWNER_ID, window.start, window.end
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
            platform = await load_platform_settings(conns[sizes[0]])
            await conns[sizes[0]].rollback()
            for conn in conns.values():  # warm: prepared statements, caches
                for _ in range(20):
                    await owners_over_budget(conn, [OWNER_ID], now=now, platform=platform)
                    await conn.rollback()
            for _ in range(20):
                await raw.fetch(_SPENT, OWNER_ID, window.start, window.end)
            for _ in range(iterations):
                for size, conn in conns.items():
                    started = time.perf_counter()
                    spent = await owners_over_budget(conn, [OWNER_ID], now=now, platform=platform)
                    times[size].append(time.perf_counter() - started)
                    if spent:
                        raise RuntimeError("the measured owner's week reached the bench's cap")
                    await conn.rollback()
                started = time.perf_counter()
                await raw.fetch(_SPENT, OWNER_ID, window.start, window.end)
                times["raw"].append(time.perf_counter() - started)
            for size, conn in conns.items():  # the week each gate read, to compare across sizes
                used[size] = (await spent_tokens(conn, [OWNER_ID], window=window))[OWNER_ID]
                await conn.rollback()
        finally:
            for conn in conns.values():
                await conn.close()
    finally:
        await raw.close()
        for engine in engines.values():
            await engine.dispose()
    plans = {size: await explain(url, now) for size, url in urls.items()}
    await build_forecast_owner(urls[sizes[0]], now)
    forecasting = await measure_forecast(bench, urls[sizes[0]], iterations)
    stats = {key: summary_ms(values) for key, values in times.items()}
    small, big = sizes[0], sizes[-1]
    same_sum = len(set(used.values())) == 1
    for size in sizes:
        result.add(
            Row(
                f"owners_over_budget p50, {plans[size]['rows']:,} rows",
                stats[size]["p50_ms"],
                "ms",
                baseline=stats["raw"]["p50_ms"],
                baseline_label="raw asyncpg gate statement, small",
                target=f"≤ {TARGET_P50_MS:g} ms",
                ok=stats[size]["p50_ms"] <= TARGET_P50_MS,
                note=f"the gate statement executes in {plans[size]['execution_ms']:.2f} ms in the"
                " server "
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
    forecast = forecasting["forecast"]
    forecast_p50 = forecasting["forecast_ms"]["p50_ms"]
    result.add(
        Row(
            f"Budget.forecast request p50, {FORECAST_AGENTS} scheduled agents",
            forecast_p50,
            "ms",
            baseline=forecasting["budget_ms"]["p50_ms"],
            baseline_label="the same request without forecast",
            target=f"≤ {FORECAST_TARGET_P50_MS:g} ms",
            ok=forecast_p50 <= FORECAST_TARGET_P50_MS and forecast["exhaustsAt"] is not None,
            note=f"projected {forecast['projectedTokens']:,} tokens, cap {FORECAST_CAP:,} reached"
            f" at {forecast['exhaustsAt']}; p99 {forecasting['forecast_ms']['p99_ms']:.2f} ms; "
            f"{forecasting['cpu_ms']:.1f} ms of api CPU per pair of requests",
        )
    )
    result.details = {
        "forecast": {
            "latency": forecasting["forecast_ms"],
            "budget_latency": forecasting["budget_ms"],
            "cpu_ms": forecasting["cpu_ms"],
            "projected_tokens": forecast["projectedTokens"],
            "exhausts_at": forecast["exhaustsAt"],
            "agents_without_history": forecast["agentsWithoutHistory"],
        },
        "iterations": iterations,
        "build_seconds": build_seconds,
        "latency": {str(k): v for k, v in stats.items()},
        "explain": {str(k): v for k, v in plans.items()},
        "cap": platform.weekly_token_cap,
    }
    for url in urls.values():
        await bench.drop_database(url)
    return result
