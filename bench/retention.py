"""Retention: pruning a large backlog of old runs while the run pipeline runs.

One `agent-engine worker --processes 1 --threads 8` does both, as in a deployment: the run
pipeline of `run_pipeline.py` (manual runs against an instant FakeOpenAIServer in its own process)
and the retention pass, started by a retention tick (`prune_finished_runs` on the ticks queue,
batches of 500). The journal holds old finished runs (quick: 100k, full: 1M) spread over the
pipeline's agents, finished 60 to 400 days ago; retention is set to 30 days.

The machine is shared and its load swings by 2x within a minute, so the pipeline is measured in
alternating windows of the same size, with the pass paused (A) and pruning (B): A B A B ...
The pass is paused by holding an EXCLUSIVE lock on `engine_activity`, whose counter each batch
bumps before it commits: the batch waits there (on rows nobody else uses) until the window ends.
Target: the mean runs/s of the B windows at least 0.8 of the A windows'. Also reported: rows
pruned per second while the pipeline ran, the time to prune the whole backlog (more than one
pass when it takes longer than a pass may run), and what is left of the old runs.
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg

from agent_engine.db.engine import create_engine
from agent_engine.domain.runs import RunTrigger
from agent_engine.runs.request import request_run
from agent_engine.runs.retention import RETENTION_LOCK_KEY
from agent_engine.workers.broker import (
    close_broker,
    configure_broker,
    enqueue_execute,
    send_retention_tick,
)
from bench.common import (
    Bench,
    Process,
    Row,
    ScenarioResult,
    agent_engine_command,
    eventually,
    python_module_command,
    read_port_line,
)
from bench.run_pipeline import REQUEST_CONCURRENCY, THREADS, seed

TITLE = "Retention: pruning old runs while the run pipeline runs (one worker, 8 threads)"
NAME = "retention"
TARGET_RATIO = 0.8
RETENTION_DAYS = 30


async def seed_history(url: str, *, rows: int, agents: int) -> float:
    """`rows` old finished runs over agents 1..agents (triggers off, indexes rebuilt after)."""
    started = time.perf_counter()
    conn = await asyncpg.connect(url)
    try:
        indexes = await conn.fetch(
            "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'agent_runs'"
            " AND indexname <> 'pk_agent_runs'"
        )
        await conn.execute("SET session_replication_role = replica")  # no NOTIFY storm
        await conn.execute("SET maintenance_work_mem = '512MB'")
        for index in indexes:
            await conn.execute(f'DROP INDEX "{index["indexname"]}"')
        await conn.execute(
            """
            INSERT INTO agent_runs (agent_id, trigger, state, reason, tokens_used, started_at,
                                    finished_at, heartbeat_at, created_at)
            SELECT 1 + g % $1::int, 'scheduled',
                   CASE WHEN g % 20 = 0 THEN 'skipped' WHEN g % 50 = 1 THEN 'failed'
                        ELSE 'succeeded' END,
                   CASE WHEN g % 20 = 0 THEN 'budget_exceeded' WHEN g % 50 = 1 THEN 'error' END,
                   CASE WHEN g % 20 = 0 THEN 0 ELSE 100 + g % 900 END,
                   f - interval '30 seconds', f, f, f - interval '31 seconds'
            FROM (SELECT g, now() - interval '400 days' + interval '340 days' * (g::float8 / $2)
                         AS f
                  FROM generate_series(1, $2::int) g) s
            """,
            agents,
            rows,
        )
        for index in indexes:
            await conn.execute(index["indexdef"])
        await conn.execute("RESET session_replication_role")
        await conn.execute("VACUUM ANALYZE agent_runs")
    finally:
        await conn.close()
    return time.perf_counter() - started


async def pruned_so_far(conn: asyncpg.Connection) -> int:
    value = await conn.fetchval("SELECT count FROM engine_activity WHERE name = 'runs_pruned'")
    return int(value or 0)


async def pass_running(conn: asyncpg.Connection) -> bool:
    """The pass holds its session advisory lock from start to end."""
    held = await conn.fetchval(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted"
        " AND classid = $1 AND objid = $2 AND objsubid = 1",
        RETENTION_LOCK_KEY >> 32,
        RETENTION_LOCK_KEY & 0xFFFFFFFF,
    )
    return bool(held)


async def pipeline(engine: Any, conn: asyncpg.Connection, agent_ids: list[int]) -> dict[str, Any]:
    """Request one manual run per agent (16 at a time); runs/s from the first request to the
    last `finished_at`."""
    semaphore = asyncio.Semaphore(REQUEST_CONCURRENCY)

    async def request(agent_id: int) -> None:
        async with semaphore:
            await request_run(
                engine,
                agent_id,
                trigger=RunTrigger.MANUAL,
                now=datetime.now(UTC),
                enqueue=enqueue_execute,
            )

    started_wall = datetime.now(UTC)
    await asyncio.gather(*(request(a) for a in agent_ids))

    async def done() -> bool:
        count = await conn.fetchval(
            "SELECT count(*) FROM agent_runs WHERE agent_id = ANY($1::bigint[])"
            " AND trigger = 'manual' AND created_at >= $2 AND finished_at IS NOT NULL",
            agent_ids,
            started_wall,
        )
        return int(count) == len(agent_ids)

    await eventually(done, within=max(120.0, len(agent_ids) / 10), what="the runs", poll=0.05)
    stats = await conn.fetchrow(
        "SELECT max(finished_at) AS last, count(*) FILTER (WHERE state = 'succeeded') AS ok"
        " FROM agent_runs WHERE agent_id = ANY($1::bigint[]) AND trigger = 'manual'"
        " AND created_at >= $2",
        agent_ids,
        started_wall,
    )
    seconds = (stats["last"] - started_wall).total_seconds()
    return {
        "runs": len(agent_ids),
        "succeeded": int(stats["ok"]),
        "seconds": seconds,
        "per_s": len(agent_ids) / seconds,
        "finished_at": stats["last"],
    }


async def run(bench: Bench) -> ScenarioResult:
    window_runs = 150 if bench.quick else 400
    pairs = 3 if bench.quick else 4
    history_rows = 100_000 if bench.quick else 1_000_000
    result = ScenarioResult(NAME, TITLE)
    fake = Process(
        python_module_command("bench._fake_model"),
        env=bench.env(bench.settings(bench.database_url("postgres"), bench.redis_base_url)),
        log_path=bench.work_dir / "retention-fake.log",
    )
    worker: Process | None = None
    try:
        port = await asyncio.to_thread(read_port_line, fake)
        url = await bench.create_database("retention")
        agents = window_runs + 2 * THREADS
        await seed(url, agents=agents, base_url=f"http://127.0.0.1:{port}/v1")
        seed_seconds = await seed_history(url, rows=history_rows, agents=window_runs)
        settings = bench.settings(url, bench.redis_url())
        configure_broker(settings)
        engine = create_engine(settings, pool_size=REQUEST_CONCURRENCY)
        conn = await asyncpg.connect(url)
        pause = await asyncpg.connect(url)
        worker = Process(
            agent_engine_command("worker", "--processes", "1", "--threads", str(THREADS)),
            env=bench.env(settings),
            log_path=bench.work_dir / "retention-worker.log",
        )
        window_agents = list(range(1, window_runs + 1))
        paused_windows: list[dict[str, Any]] = []
        pruning_windows: list[dict[str, Any]] = []
        try:
            await pipeline(engine, conn, list(range(window_runs + 1, agents + 1)))  # warm-up

            await conn.execute(
                "INSERT INTO platform_settings (key, value) VALUES"
                " ('agent_run_retention_days', $1::text::jsonb)",
                str(RETENTION_DAYS),
            )
            prune_started = time.perf_counter()
            send_retention_tick()

            async def pruning() -> int | None:
                count = await pruned_so_far(conn)
                return count if count > 0 else None

            await eventually(pruning, within=60, what="pruning to start", poll=0.01)
            pruned_in_windows = 0
            pruning_seconds = 0.0
            for _ in range(pairs):
                transaction = pause.transaction()
                await transaction.start()
                await pause.execute("LOCK TABLE engine_activity IN EXCLUSIVE MODE")
                paused_windows.append(await pipeline(engine, conn, window_agents))
                await transaction.commit()
                before = await pruned_so_far(conn)
                started = time.perf_counter()
                pruning_windows.append(await pipeline(engine, conn, window_agents))
                pruning_seconds += time.perf_counter() - started
                pruned_in_windows += await pruned_so_far(conn) - before
            still_running_after_windows = await pass_running(conn)

            async def backlog_gone() -> bool:
                if await pass_running(conn):
                    return False
                left = await conn.fetchval(
                    "SELECT count(*) FROM agent_runs WHERE finished_at < $1",
                    datetime.now(UTC) - timedelta(days=RETENTION_DAYS),
                )
                if int(left) > 2 * window_runs:  # more than each agent's kept runs
                    send_retention_tick()  # the pass ran out of time: the next tick goes on
                    await eventually(
                        lambda: pass_running(conn), within=60, what="the next pass", poll=0.01
                    )
                    return False
                return True

            await eventually(backlog_gone, within=1800, what="the backlog to go", poll=0.2)
            prune_seconds = time.perf_counter() - prune_started
            total = await pruned_so_far(conn)
            left = int(
                await conn.fetchval(
                    "SELECT count(*) FROM agent_runs WHERE finished_at < $1",
                    datetime.now(UTC) - timedelta(days=RETENTION_DAYS),
                )
            )
            agents_with_runs = int(
                await conn.fetchval(
                    "SELECT count(DISTINCT agent_id) FROM agent_runs WHERE agent_id <= $1::int",
                    window_runs,
                )
            )
        finally:
            if worker is not None:
                worker.stop()
            await conn.close()
            await pause.close()
            await engine.dispose()
            close_broker()
    finally:
        fake.stop()

    paused_per_s = sum(w["per_s"] for w in paused_windows) / len(paused_windows)
    pruning_per_s = sum(w["per_s"] for w in pruning_windows) / len(pruning_windows)
    ratio = pruning_per_s / paused_per_s
    expected = window_runs * pairs
    succeeded = sum(w["succeeded"] for w in pruning_windows)
    complete = succeeded == expected and sum(w["succeeded"] for w in paused_windows) == expected
    result.add(
        Row(
            "pipeline runs/s while pruning ÷ paused",
            pruning_per_s,
            "runs/s",
            baseline=paused_per_s,
            baseline_label="pass paused",
            target=f"ratio ≥ {TARGET_RATIO}",
            ok=ratio >= TARGET_RATIO and complete and still_running_after_windows,
            note=f"{pairs} pairs of {window_runs}-run windows; paused "
            + " / ".join(f"{w['per_s']:.0f}" for w in paused_windows)
            + ", pruning "
            + " / ".join(f"{w['per_s']:.0f}" for w in pruning_windows)
            + " runs/s"
            + ("" if still_running_after_windows else "; the pass ended before the windows did"),
        ),
        Row(
            "rows pruned/s while the pipeline ran",
            pruned_in_windows / pruning_seconds,
            "rows/s",
            note=f"{pruned_in_windows:,} rows in {pruning_seconds:.1f} s of pruning windows",
        ),
        Row(
            f"{history_rows:,} old runs pruned (passes of ≤ 240 s, paused windows included)",
            prune_seconds,
            "s",
            note=f"{total:,} deleted ({total / prune_seconds:,.0f} rows/s overall); "
            f"{left:,} old runs left; {agents_with_runs:,}/{window_runs:,} agents keep their "
            f"runs; seeding {seed_seconds:.0f} s",
        ),
    )
    result.details = {
        "paused_windows": paused_windows,
        "pruning_windows": pruning_windows,
        "pruned": {
            "total": total,
            "in_pruning_windows": pruned_in_windows,
            "seconds": prune_seconds,
            "old_left": left,
            "agents_with_runs": agents_with_runs,
        },
    }
    return result
