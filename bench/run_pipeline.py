"""Scenario 2 — run pipeline: manual runs through one `agent-engine worker --processes 1
--threads 8` against an instantly answering model server (FakeOpenAIServer in its own process).

Throughput: N runs requested with `runs.request.request_run` (16 at a time) while the worker
runs; from the first request to the last `finished_at`. Baseline: the same number of messages (at
least 2,000) sent to a no-op async Dramatiq actor on the same broker, 1 process x 8 threads,
until the queue is drained. Engine overhead per run: sequential runs on an idle worker, journal
`finished_at - started_at` (claim, context load, runtime) minus the model call itself, measured
with the engine's own `OpenAIProvider` against the same server.
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from typing import Any

import asyncpg
import dramatiq
import psutil
import redis
from dramatiq.brokers.redis import RedisBroker

from agent_engine.db.engine import create_engine
from agent_engine.domain.runs import RunTrigger
from agent_engine.runs.request import request_run
from agent_engine.runtime.providers.base import ModelRequest
from agent_engine.runtime.providers.openai_provider import OpenAIProvider
from agent_engine.workers.broker import close_broker, configure_broker, enqueue_execute
from bench.common import (
    FAKE_KEY_ENV,
    Bench,
    Process,
    Row,
    ScenarioResult,
    agent_engine_command,
    eventually,
    profiled,
    python_module_command,
    read_port_line,
    summary_ms,
)

TITLE = "Run pipeline: manual runs through one worker process (8 threads)"
NAME = "run_pipeline"
TARGET_RUNS_PER_S = 300
TARGET_OVERHEAD_MS = 5.0
TARGET_RATIO = 0.15
TARGET_CPU_MS_PER_RUN = 2.5  # issue 25
REQUEST_CONCURRENCY = 16
THREADS = 8
AGENTS_PER_OWNER = 50
MIN_NOOP_MESSAGES = 2_000
LATENCY_POLL_SECONDS = 0.002


async def seed(url: str, *, agents: int, base_url: str) -> None:
    owners = max(agents // AGENTS_PER_OWNER, 1)
    conn = await asyncpg.connect(url)
    try:
        await conn.execute(
            f"""
            INSERT INTO users (id, email, timezone)
            SELECT g, 'u' || g || '@example.com', 'UTC' FROM generate_series(1, {owners}) g;
            INSERT INTO agent_models (id, name, provider, model, base_url, api_key_env)
            VALUES (1, 'Fake', 'openai', 'fake-model', '{base_url}', '{FAKE_KEY_ENV}');
            INSERT INTO platform_settings (key, value) VALUES
                ('agent_weekly_token_cap', '1000000000000'::jsonb),
                ('agent_platform_prompt', '"Be brief."'::jsonb);
            INSERT INTO agents (id, user_id, name, prompt, model_id)
            OVERRIDING SYSTEM VALUE
            SELECT g, 1 + g % {owners}, 'agent ' || g, 'Summarise what changed.', 1
            FROM generate_series(1, {agents}) g
            """
        )
        await conn.execute("VACUUM ANALYZE")
    finally:
        await conn.close()


async def _wait_finished(conn: asyncpg.Connection, agent_ids: list[int], *, within: float) -> int:
    async def done() -> int | None:
        count = await conn.fetchval(
            "SELECT count(*) FROM agent_runs WHERE agent_id = ANY($1::bigint[])"
            " AND state NOT IN ('queued', 'running')",
            agent_ids,
        )
        return int(count) if count == len(agent_ids) else None

    result: int = await eventually(done, within=within, what="the runs to finish", poll=0.05)
    return result


async def engine_phase(
    bench: Bench, url: str, *, runs: int, latency_runs: int, model_base_url: str
) -> dict[str, Any]:
    redis_url = bench.redis_url()
    settings = bench.settings(url, redis_url)
    configure_broker(settings)
    engine = create_engine(settings, pool_size=REQUEST_CONCURRENCY)
    conn = await asyncpg.connect(url)
    worker = Process(
        agent_engine_command("worker", "--processes", "1", "--threads", str(THREADS)),
        env=bench.env(settings),
        log_path=bench.work_dir / "run_pipeline-worker.log",
    )
    try:
        # Warm-up: the worker is ready once a run went through; also warms its pool and client.
        warm = list(range(runs + 1, runs + 1 + 2 * THREADS))
        for agent_id in warm:
            await request_run(
                engine,
                agent_id,
                trigger=RunTrigger.MANUAL,
                now=datetime.now(UTC),
                enqueue=enqueue_execute,
            )
        await _wait_finished(conn, warm, within=60)

        # Throughput.
        throughput_agents = list(range(1, runs + 1))
        proc = psutil.Process(worker.pid)
        cpu_before = proc.cpu_times()
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

        with profiled(worker.pid, "run_pipeline-worker"):
            started_wall = datetime.now(UTC)
            started = time.perf_counter()
            await asyncio.gather(*(request(a) for a in throughput_agents))
            requested_seconds = time.perf_counter() - started
            await _wait_finished(conn, throughput_agents, within=max(60.0, runs / 20))
            cpu_after = proc.cpu_times()
        stats = await conn.fetchrow(
            "SELECT max(finished_at) AS last, count(*) FILTER (WHERE state = 'succeeded') AS ok,"
            " percentile_cont(0.5) WITHIN GROUP"
            "   (ORDER BY extract(epoch FROM finished_at - started_at)) AS busy_p50"
            " FROM agent_runs WHERE agent_id = ANY($1::bigint[])",
            throughput_agents,
        )
        seconds = (stats["last"] - started_wall).total_seconds()
        cpu_seconds = (cpu_after.user - cpu_before.user) + (cpu_after.system - cpu_before.system)

        # Latency on an idle worker: one run at a time on one agent.
        latency_agent = runs + 2 * THREADS + 1
        run_ids = []
        for _ in range(latency_runs):
            row = await request_run(
                engine,
                latency_agent,
                trigger=RunTrigger.MANUAL,
                now=datetime.now(UTC),
                enqueue=enqueue_execute,
            )
            run_ids.append(row.id)

            async def finished(run_id: int = row.id) -> bool:
                state = await conn.fetchval("SELECT state FROM agent_runs WHERE id = $1", run_id)
                return state not in ("queued", "running")

            await eventually(finished, within=30, what="a run", poll=LATENCY_POLL_SECONDS)
        journal = await conn.fetch(
            "SELECT extract(epoch FROM started_at - created_at) AS wait,"
            " extract(epoch FROM finished_at - started_at) AS busy,"
            " extract(epoch FROM finished_at - created_at) AS total, state"
            " FROM agent_runs WHERE id = ANY($1::bigint[])",
            run_ids,
        )
    finally:
        worker.stop()
        await conn.close()
        await engine.dispose()
        close_broker()
    return {
        "runs": runs,
        "succeeded": int(stats["ok"]),
        "seconds": seconds,
        "per_s": runs / seconds,
        "request_seconds": requested_seconds,
        "requests_per_s": runs / requested_seconds,
        "worker_cpu_ms_per_run": cpu_seconds * 1000 / runs,
        "busy_p50_ms_under_load": float(stats["busy_p50"]) * 1000,
        "latency_runs": len(journal),
        "latency_succeeded": sum(1 for r in journal if r["state"] == "succeeded"),
        "idle_wait": summary_ms([float(r["wait"]) for r in journal]),
        "idle_busy": summary_ms([float(r["busy"]) for r in journal]),
        "idle_total": summary_ms([float(r["total"]) for r in journal]),
    }


async def model_call_latency(base_url: str, calls: int) -> dict[str, float]:
    """The model call alone, with the engine's provider (SDK + HTTP + the fake server)."""
    import os

    os.environ.setdefault(FAKE_KEY_ENV, "bench-key")
    provider = OpenAIProvider(base_url=base_url, api_key_env=FAKE_KEY_ENV, timeout_seconds=30)
    request = ModelRequest(
        model="fake-model",
        messages=[
            {"role": "system", "content": "Be brief.\n\nSummarise what changed."},
            {"role": "user", "content": "Run now."},
        ],
        tools=[],
    )
    try:
        for _ in range(5):
            await provider.complete(request)
        times = []
        for _ in range(calls):
            started = time.perf_counter()
            await provider.complete(request)
            times.append(time.perf_counter() - started)
    finally:
        await provider.aclose()
    return summary_ms(times)


async def noop_phase(bench: Bench, *, messages: int) -> dict[str, Any]:
    redis_url = bench.redis_url()
    worker = Process(
        python_module_command(
            "bench._noop_worker", "--redis-url", redis_url, "--threads", str(THREADS)
        ),
        env=bench.env(bench.settings(bench.database_url("postgres"), redis_url)),
        log_path=bench.work_dir / "run_pipeline-noop.log",
    )
    broker = RedisBroker(url=redis_url)  # type: ignore[no-untyped-call]
    client = redis.Redis.from_url(redis_url)

    async def execute_run(run_id: int) -> None:
        return None

    actor: Any = dramatiq.actor(broker=broker, actor_name="execute_run", queue_name="runs")(
        execute_run
    )

    async def drained() -> bool:
        return client.hlen("dramatiq:runs.msgs") == 0 and client.llen("dramatiq:runs") == 0

    try:
        await asyncio.to_thread(read_port_line, worker)
        for i in range(50):
            actor.send(i)
        await eventually(drained, within=60, what="the no-op warm-up")
        proc = psutil.Process(worker.pid)
        cpu_before = proc.cpu_times()

        def send_all() -> float:
            begun = time.perf_counter()
            for i in range(messages):
                actor.send(i)
            return time.perf_counter() - begun

        started = time.perf_counter()
        send_seconds = await asyncio.to_thread(send_all)
        await eventually(drained, within=120, what="the no-op drain", poll=0.005)
        seconds = time.perf_counter() - started
        cpu_after = proc.cpu_times()
    finally:
        worker.stop()
        broker.close()
        client.close()
    cpu_seconds = (cpu_after.user - cpu_before.user) + (cpu_after.system - cpu_before.system)
    return {
        "messages": messages,
        "seconds": seconds,
        "per_s": messages / seconds,
        "send_seconds": send_seconds,
        "worker_cpu_ms_per_message": cpu_seconds * 1000 / messages,
    }


async def run(bench: Bench) -> ScenarioResult:
    runs = 300 if bench.quick else 2_000
    latency_runs = 30 if bench.quick else 200
    result = ScenarioResult(NAME, TITLE)
    fake = Process(
        python_module_command("bench._fake_model"),
        env=bench.env(bench.settings(bench.database_url("postgres"), bench.redis_base_url)),
        log_path=bench.work_dir / "run_pipeline-fake.log",
    )
    try:
        port = await asyncio.to_thread(read_port_line, fake)
        base_url = f"http://127.0.0.1:{port}/v1"
        url = await bench.create_database("pipeline")
        await seed(url, agents=runs + 2 * THREADS + 1, base_url=base_url)
        engine = await engine_phase(
            bench, url, runs=runs, latency_runs=latency_runs, model_base_url=base_url
        )
        model = await model_call_latency(base_url, latency_runs)
    finally:
        fake.stop()
    noop = await noop_phase(bench, messages=max(runs, MIN_NOOP_MESSAGES))
    overhead_ms = engine["idle_busy"]["p50_ms"] - model["p50_ms"]
    complete = engine["succeeded"] == runs and engine["latency_succeeded"] == latency_runs
    result.add(
        Row(
            f"runs/s end to end, {runs:,} manual runs",
            engine["per_s"],
            "runs/s",
            target=f"≥ {TARGET_RUNS_PER_S}",
            ok=engine["per_s"] >= TARGET_RUNS_PER_S and complete,
            note=f"{engine['succeeded']}/{runs} succeeded; requests sent at "
            f"{engine['requests_per_s']:.0f}/s",
        ),
        Row(
            "engine ÷ no-op Dramatiq actor (1 x 8 threads)",
            engine["per_s"],
            "runs/s",
            baseline=noop["per_s"],
            baseline_label="no-op msg/s",
            target=f"ratio ≥ {TARGET_RATIO}",
            ok=engine["per_s"] / noop["per_s"] >= TARGET_RATIO,
        ),
        Row(
            "engine overhead per run, p50 (idle worker)",
            overhead_ms,
            "ms",
            baseline=model["p50_ms"],
            baseline_label="model call p50",
            target=f"≤ {TARGET_OVERHEAD_MS:g} ms",
            ok=overhead_ms <= TARGET_OVERHEAD_MS,
            note=f"journal started→finished p50 {engine['idle_busy']['p50_ms']:.1f} ms minus the "
            f"model call p50 {model['p50_ms']:.1f} ms; request→finished p50 "
            f"{engine['idle_total']['p50_ms']:.1f} ms (includes Dramatiq's idle poll backoff)",
        ),
        Row(
            "worker CPU per run vs per no-op message",
            engine["worker_cpu_ms_per_run"],
            "ms CPU",
            baseline=noop["worker_cpu_ms_per_message"],
            baseline_label="no-op",
            target=f"≤ {TARGET_CPU_MS_PER_RUN:g} ms",
            ok=engine["worker_cpu_ms_per_run"] <= TARGET_CPU_MS_PER_RUN,
        ),
    )
    result.details = {"engine": engine, "model_call": model, "noop": noop}
    return result
