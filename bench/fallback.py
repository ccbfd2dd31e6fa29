"""Fallback: with the primary model down (connection refused, or 503), runs finish on its fallback.

One `agent-engine worker` process and `bench._fake_model` (a run = two model calls around one tool
call the model makes). Three phases on the same warm worker, each N runs requested at once: the
normal runs (their model answers), then the runs of a primary whose endpoint refuses
connections, then those of a primary answering every call 503 (a second `bench._fake_model
--status 503`), each with the fake model as its fallback. Reported: worker CPU per run of each phase
(the target: the fallback runs at most 1.5 x the normal runs'), how many of the fallback runs'
model calls tried the primary at all (the circuit breaker skips a model known down: only the
calls before it opened, and one probe per AGENT_ENGINE_MODEL_BREAKER_OPEN_SECONDS, try it), and
that every run succeeded on the fallback.

Quick: 200 runs per phase; full: 1,000 (BENCH_FALLBACK_RUNS overrides).
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
from datetime import UTC, datetime

import asyncpg
import psutil
from sqlalchemy.ext.asyncio import AsyncEngine

from agent_engine.db.activity import fallback_labels
from agent_engine.domain.runs import RunTrigger
from agent_engine.runs.request import request_run
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
)

TITLE = "Fallback: the primary model is down (refused, 503), runs finish on its fallback"
NAME = "fallback"
TARGET_CPU_RATIO = 1.5
WARM_UP_RUNS = 20
WORKER_THREADS = 4


def runs_per_phase(quick: bool) -> int:
    return int(os.environ.get("BENCH_FALLBACK_RUNS", 200 if quick else 1_000))


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port  # nothing listens there any more: connections are refused


def _cpu_seconds(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system + times.children_user + times.children_system


async def seed(
    conn: asyncpg.Connection, *, runs: int, fake_port: int, down_port: int, status_port: int
) -> None:
    """Model 1 answers; model 2 (its endpoint refuses connections) and model 3 (503 for every
    call) fall back to model 1. Agents 1..runs on model 1, the next runs on model 2, the next
    on model 3, then the warm-up agents on model 1."""
    total = 3 * runs + WARM_UP_RUNS
    await conn.execute(
        f"""
        INSERT INTO users (id, email, timezone) VALUES (1, 'o@example.com', 'UTC');
        INSERT INTO agent_models (id, name, provider, model, base_url, api_key_env)
        VALUES (1, 'Fake', 'openai', 'fake-model', 'http://127.0.0.1:{fake_port}/v1',
                '{FAKE_KEY_ENV}');
        INSERT INTO agent_models (id, name, provider, model, base_url, api_key_env,
                                  fallback_model_id)
        VALUES (2, 'Primary', 'openai', 'primary-model', 'http://127.0.0.1:{down_port}/v1',
                '{FAKE_KEY_ENV}', 1),
               (3, 'Primary 503', 'openai', 'primary-model', 'http://127.0.0.1:{status_port}/v1',
                '{FAKE_KEY_ENV}', 1);
        INSERT INTO platform_settings (key, value) VALUES
            ('agent_weekly_token_cap', '1000000000000'::jsonb);
        INSERT INTO agents (id, user_id, name, prompt, model_id) OVERRIDING SYSTEM VALUE
        SELECT g, 1, 'agent ' || g, 'Summarise what changed.',
               CASE WHEN g > {runs} AND g <= {2 * runs} THEN 2
                    WHEN g > {2 * runs} AND g <= {3 * runs} THEN 3 ELSE 1 END
        FROM generate_series(1, {total}) g
        """
    )
    await conn.execute("VACUUM ANALYZE")


async def phase(
    engine: AsyncEngine, conn: asyncpg.Connection, worker: psutil.Process, agent_ids: list[int]
) -> dict[str, float]:
    """Request a run of each agent at once; wait until all finished. Worker CPU and seconds."""
    floor = int(await conn.fetchval("SELECT coalesce(max(id), 0) FROM agent_runs"))
    cpu_before = _cpu_seconds(worker)
    started = time.perf_counter()
    now = datetime.now(UTC)
    await asyncio.gather(
        *(
            request_run(engine, agent, trigger=RunTrigger.MANUAL, now=now, enqueue=enqueue_execute)
            for agent in agent_ids
        )
    )

    async def finished() -> bool:
        left = await conn.fetchval(
            "SELECT count(*) FROM agent_runs WHERE id > $1 AND finished_at IS NULL", floor
        )
        done = await conn.fetchval("SELECT count(*) FROM agent_runs WHERE id > $1", floor)
        return bool(left == 0 and done == len(agent_ids))

    await eventually(finished, within=600, what="the phase's runs", poll=0.05)
    seconds = time.perf_counter() - started
    cpu = _cpu_seconds(worker) - cpu_before
    stats = await conn.fetchrow(
        "SELECT count(*) FILTER (WHERE r.state = 'succeeded') AS ok, count(*) AS n"
        " FROM agent_runs r WHERE r.id > $1",
        floor,
    )
    steps = await conn.fetchrow(
        "SELECT count(*) FILTER (WHERE s.kind = 'model_call') AS model_calls,"
        " count(*) FILTER (WHERE s.kind = 'model_call' AND s.fallback) AS fallback_calls"
        " FROM agent_run_steps s WHERE s.run_id > $1",
        floor,
    )
    return {
        "runs": int(stats["n"]),
        "succeeded": int(stats["ok"]),
        "seconds": seconds,
        "worker_cpu_ms_per_run": cpu * 1000 / len(agent_ids),
        "model_calls": int(steps["model_calls"]),
        "fallback_calls": int(steps["fallback_calls"]),
    }


async def run(bench: Bench) -> ScenarioResult:
    from agent_engine.db.engine import create_engine

    result = ScenarioResult(NAME, TITLE)
    runs = runs_per_phase(bench.quick)
    fake_env = bench.env(bench.settings(bench.database_url("postgres"), bench.redis_base_url))
    fake = Process(
        python_module_command("bench._fake_model", "--tool", "no_such_tool"),
        env=fake_env,
        log_path=bench.work_dir / "fallback-fake.log",
    )
    unavailable = Process(
        python_module_command("bench._fake_model", "--status", "503"),
        env=fake_env,
        log_path=bench.work_dir / "fallback-503.log",
    )
    processes: list[Process] = [fake, unavailable]
    url = await bench.create_database("fallback")
    settings = bench.settings(url, bench.redis_url(), runs_in_flight=max(runs, 50))
    env = bench.env(settings)
    engine = create_engine(settings, pool_size=4)
    conn = await asyncpg.connect(url)
    configure_broker(settings)
    try:
        fake_port = await asyncio.to_thread(read_port_line, fake)
        status_port = await asyncio.to_thread(read_port_line, unavailable)
        await seed(
            conn,
            runs=runs,
            fake_port=fake_port,
            down_port=closed_port(),
            status_port=status_port,
        )
        worker = Process(
            agent_engine_command("worker", "--processes", "1", "--threads", str(WORKER_THREADS)),
            env=env,
            log_path=bench.work_dir / "fallback-worker.log",
        )
        processes.append(worker)
        proc = psutil.Process(worker.pid)
        warm = list(range(3 * runs + 1, 3 * runs + WARM_UP_RUNS + 1))
        await phase(engine, conn, proc, warm)
        with profiled(worker.pid, "fallback-normal"):
            normal = await phase(engine, conn, proc, list(range(1, runs + 1)))
        with profiled(worker.pid, "fallback-refused"):
            refused = await phase(engine, conn, proc, list(range(runs + 1, 2 * runs + 1)))
        with profiled(worker.pid, "fallback-503"):
            status = await phase(engine, conn, proc, list(range(2 * runs + 1, 3 * runs + 1)))
        counters = {
            row["name"]: int(row["count"])
            for row in await conn.fetch(
                "SELECT name, count FROM engine_activity WHERE name LIKE 'fallback.%'"
            )
        }
    finally:
        for process in processes:
            process.stop()
        await conn.close()
        await engine.dispose()
        close_broker()
    causes: dict[str, dict[str, int]] = {}
    for name, count in counters.items():
        labels = fallback_labels(name)
        if labels is not None:
            model, _, cause = labels
            causes.setdefault(model, {})[cause] = count
    for label, model, down in (
        ("refused connections", "Primary", refused),
        ("503 for every call", "Primary 503", status),
    ):
        by_cause = causes.get(model, {})
        tried = sum(count for cause, count in by_cause.items() if cause != "breaker_open")
        ratio = down["worker_cpu_ms_per_run"] / normal["worker_cpu_ms_per_run"]
        all_fell_back = down["fallback_calls"] == down["model_calls"] == 2 * runs
        result.add(
            Row(
                f"worker CPU per run, primary down ({label}) → fallback, {runs} runs",
                down["worker_cpu_ms_per_run"],
                "ms",
                baseline=normal["worker_cpu_ms_per_run"],
                baseline_label="normal run, same worker",
                target=f"ratio ≤ {TARGET_CPU_RATIO}",
                ok=ratio <= TARGET_CPU_RATIO and down["succeeded"] == runs,
                note=f"{down['succeeded']}/{runs} succeeded on the fallback in "
                f"{down['seconds']:.1f} s (normal: {normal['seconds']:.1f} s)",
            ),
            Row(
                f"model calls that tried the primary ({label}); the rest skipped it",
                float(tried),
                "calls",
                baseline=float(down["model_calls"]),
                baseline_label="model calls of the fallback runs",
                target="< all (breaker: not tried on every step)",
                ok=tried < down["model_calls"] and all_fell_back,
                note=f"by cause: {by_cause}; every model call answered by the fallback: "
                f"{all_fell_back}",
            ),
        )
    result.details = {
        "normal": normal,
        "primary_refused": refused,
        "primary_503": status,
        "fallbacks": causes,
    }
    await bench.drop_database(url)
    return result
