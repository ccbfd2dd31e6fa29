"""Scenario 1 — scheduler tick: N due agents → N `queued` journal rows and N execute messages.

Engine: `runs.scheduler.schedule_due_agents` with the settings' batch size, sending through
`workers.broker.enqueue_execute` (the real RedisBroker). Baseline, on an identical clone of the
same seeded database: a minimal asyncpg loop doing, per batch of the same size, `SELECT … FOR NO
KEY UPDATE SKIP LOCKED` + `INSERT … RETURNING id` + `UPDATE … FROM unnest(…)` in one transaction,
then a plain Dramatiq `send` per run. Rounds alternate baseline/engine; medians are reported.
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import dramatiq
import redis
from dramatiq.brokers.redis import RedisBroker

from agent_engine.db.engine import create_engine
from agent_engine.runs.scheduler import schedule_due_agents
from agent_engine.workers.broker import close_broker, configure_broker, enqueue_execute
from bench.common import Bench, Row, ScenarioResult, median

TITLE = "Scheduler tick: due agents → queued runs + messages"
NAME = "scheduler_tick"
AGENTS_PER_OWNER = 10
TARGET_AGENTS_PER_S = 5_000
TARGET_RATIO = 0.5
INTERVAL = timedelta(hours=6)

_CLAIM = (
    "SELECT id, next_run_at FROM agents WHERE next_run_at <= $1"
    " ORDER BY next_run_at LIMIT $2 FOR NO KEY UPDATE SKIP LOCKED"
)
_INSERT = (
    "INSERT INTO agent_runs (agent_id, trigger, state, tokens_used, created_at)"
    " SELECT t.id, 'scheduled', 'queued', 0, $2 FROM unnest($1::bigint[]) AS t(id)"
    " RETURNING id"
)
_ADVANCE = (
    "UPDATE agents AS a SET next_run_at = t.n"
    " FROM unnest($1::bigint[], $2::timestamptz[]) AS t(id, n) WHERE a.id = t.id"
)


async def seed(url: str, agents: int) -> None:
    conn = await asyncpg.connect(url)
    try:
        owners = max(agents // AGENTS_PER_OWNER, 1)
        await conn.execute(
            f"""
            INSERT INTO users (id, email, display_name, timezone)
            SELECT g, 'u' || g || '@example.com', 'User ' || g,
                   (ARRAY['UTC', 'Europe/Berlin', 'America/New_York', 'Asia/Tokyo'])[1 + g % 4]
            FROM generate_series(1, {owners}) g;
            INSERT INTO agent_models (id, name, provider, model) VALUES (1, 'b', 'builtin', 'b');
            INSERT INTO platform_settings (key, value) VALUES
                ('agent_weekly_token_cap', '1000000000000'::jsonb);
            INSERT INTO agents (user_id, name, prompt, schedule, model_id, next_run_at)
            SELECT 1 + g % {owners}, 'agent ' || g, 'Summarise.',
                   CASE WHEN g % 3 = 0
                        THEN '{{"type": "calendar", "cadence": "daily", "time": "09:00"}}'::jsonb
                        ELSE '{{"type": "interval", "every_hours": 6}}'::jsonb END,
                   1, now() - (g % 600) * interval '1 second'
            FROM generate_series(1, {agents}) g
            """
        )
        await conn.execute("VACUUM ANALYZE")
    finally:
        await conn.close()


async def engine_round(bench: Bench, url: str, agents: int) -> dict[str, Any]:
    redis_url = bench.redis_url()
    settings = bench.settings(url, redis_url)
    configure_broker(settings)
    engine = create_engine(settings)
    try:
        async with engine.connect() as conn:  # open the pool's first connection untimed
            await conn.exec_driver_sql("SELECT 1")
        send_seconds = 0.0

        class TimedEnqueue:
            """The same sends (one, or a batch pipelined), timed: how much of the tick is the
            broker."""

            def __call__(self, run_id: int) -> None:
                nonlocal send_seconds
                begun = time.perf_counter()
                enqueue_execute(run_id)
                send_seconds += time.perf_counter() - begun

            def many(self, run_ids: list[int]) -> None:
                nonlocal send_seconds
                begun = time.perf_counter()
                enqueue_execute.many(run_ids)
                send_seconds += time.perf_counter() - begun

        timed_enqueue = TimedEnqueue()
        now = datetime.now(UTC)
        started = time.perf_counter()
        claimed = await schedule_due_agents(
            engine, now=now, batch_size=settings.schedule_batch_size, enqueue=timed_enqueue
        )
        seconds = time.perf_counter() - started
    finally:
        await engine.dispose()
        close_broker()
    queued, messages = await _check(url, redis_url, "runs")
    return {
        "claimed": claimed,
        "queued": queued,
        "messages": messages,
        "seconds": seconds,
        "send_seconds": send_seconds,
        "per_s": agents / seconds,
        "batch_size": settings.schedule_batch_size,
    }


async def baseline_round(bench: Bench, url: str, agents: int, batch_size: int) -> dict[str, Any]:
    redis_url = bench.redis_url()
    broker = RedisBroker(url=redis_url)  # type: ignore[no-untyped-call]

    def execute_run(run_id: int) -> None:
        return None

    actor: Any = dramatiq.actor(broker=broker, actor_name="execute_run", queue_name="runs")(
        execute_run
    )
    conn = await asyncpg.connect(url)
    try:
        now = datetime.now(UTC)
        started = time.perf_counter()
        claimed = 0
        send_seconds = 0.0
        while True:
            async with conn.transaction():
                rows = await conn.fetch(_CLAIM, now, batch_size)
                ids = [r["id"] for r in rows]
                run_ids = [r["id"] for r in await conn.fetch(_INSERT, ids, now)] if ids else []
                if ids:
                    await conn.execute(_ADVANCE, ids, [r["next_run_at"] + INTERVAL for r in rows])
            begun = time.perf_counter()
            for run_id in run_ids:
                actor.send(run_id)
            send_seconds += time.perf_counter() - begun
            claimed += len(rows)
            if len(rows) < batch_size:
                break
        seconds = time.perf_counter() - started
    finally:
        await conn.close()
        broker.close()
    queued, messages = await _check(url, redis_url, "runs")
    return {
        "claimed": claimed,
        "queued": queued,
        "messages": messages,
        "seconds": seconds,
        "send_seconds": send_seconds,
        "per_s": agents / seconds,
    }


async def _check(url: str, redis_url: str, queue: str) -> tuple[int, int]:
    conn = await asyncpg.connect(url)
    try:
        queued = await conn.fetchval("SELECT count(*) FROM agent_runs WHERE state = 'queued'")
    finally:
        await conn.close()
    client = redis.Redis.from_url(redis_url)
    try:
        messages = int(client.llen(f"dramatiq:{queue}"))
    finally:
        client.close()
    return int(queued), messages


async def run(bench: Bench) -> ScenarioResult:
    agents = 2_000 if bench.quick else 10_000
    rounds = 2 if bench.quick else 3
    result = ScenarioResult(NAME, TITLE)
    seed_url = await bench.create_database("sched_seed")
    await seed(seed_url, agents)
    seed_name = bench.database_name(seed_url)
    batch_size = bench.settings(seed_url, bench.redis_base_url).schedule_batch_size
    engine_runs: list[dict[str, Any]] = []
    baseline_runs: list[dict[str, Any]] = []
    for _ in range(rounds):
        url = await bench.create_database("sched_base", template=seed_name)
        baseline_runs.append(await baseline_round(bench, url, agents, batch_size))
        await bench.drop_database(url)
        url = await bench.create_database("sched_engine", template=seed_name)
        engine_runs.append(await engine_round(bench, url, agents))
        await bench.drop_database(url)
        await asyncio.sleep(0)
    complete = all(
        r["claimed"] == agents and r["queued"] == agents and r["messages"] == agents
        for r in engine_runs
    )
    engine_rate = median([r["per_s"] for r in engine_runs])
    baseline_rate = median([r["per_s"] for r in baseline_runs])
    send_ceiling = bench.ceilings.get("dramatiq_enqueue_per_s")
    result.add(
        Row(
            f"agents/s, {agents:,} due agents, batch {batch_size}",
            engine_rate,
            "agents/s",
            target=f"≥ {TARGET_AGENTS_PER_S:,}",
            ok=engine_rate >= TARGET_AGENTS_PER_S and complete,
        ),
        Row(
            "engine ÷ bare asyncpg + Dramatiq loop",
            engine_rate,
            "agents/s",
            baseline=baseline_rate,
            baseline_label="bare loop",
            target=f"ratio ≥ {TARGET_RATIO}",
            ok=engine_rate / baseline_rate >= TARGET_RATIO,
        ),
        Row(
            "all journaled queued with a message sent",
            float(complete),
            "bool",
            ok=complete,
            note=f"engine rounds: {[(r['queued'], r['messages']) for r in engine_runs]}",
        ),
    )
    if send_ceiling:
        result.add(
            Row(
                "engine ÷ Dramatiq one-thread enqueue ceiling",
                engine_rate,
                "agents/s",
                baseline=send_ceiling,
                baseline_label="ceiling",
            )
        )
    result.details = {
        "agents": agents,
        "rounds": rounds,
        "engine": engine_runs,
        "baseline": baseline_runs,
    }
    return result
