"""Scenario 8 — the Monday 09:00 stampede: N agents due in the same slot against a model with a
fixed latency, executed by 2 `agent-engine worker` processes (+ `agent-engine clock`).

Full: 10,000 agents, a 5-second model, 500 runs in flight per worker process. Quick: 1,000
agents, a 2-second model, 200 in flight. (Override with BENCH_STAMPEDE_AGENTS,
BENCH_STAMPEDE_LATENCY, BENCH_STAMPEDE_IN_FLIGHT.)

The model is `bench._fake_model --delay L` (a FakeOpenAIServer in its own process, uvloop). Every
agent has an interval schedule and the same `next_run_at` (the slot, a few seconds after the
workers are warm); the clock ticks every second. A sampler reads the journal and the workers'
RSS/CPU every 0.25 s.

Reported: time from the slot to the last run finished, peak runs in flight (journal `running`),
runs/s, worker CPU per run, and memory: one worker process filled to its in-flight limit with runs
of a model that does not answer in time (RSS warm and idle, then full; per 100 runs in flight).
Baselines from the same run: the physical limit N x latency ÷ in-flight capacity, and the same
fake model driven by a bare asyncio client (keep-alive HTTP/1.1 over asyncio streams, one
process) at the same concurrency. Targets: full mode within 180 s of the slot, ≥ 0.7 x
the bare client's throughput, ≤ 150 MiB per worker process at 500 in flight.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import httpx
import psutil

from agent_engine.workers.main import DEFAULT_THREADS
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

TITLE = "Stampede: N agents due in one slot, a slow model, 2 worker processes"
NAME = "stampede"
WORKER_PROCESSES = 2
WORKER_THREADS = int(os.environ.get("BENCH_STAMPEDE_THREADS", DEFAULT_THREADS))  # the CLI's
AGENTS_PER_OWNER = 50
WARM_UP_RUNS = 40
SLOT_AFTER_WARM_UP_SECONDS = 3.0
SAMPLE_SECONDS = 0.25
# Issue 25's thresholds (CPU per unit of work): full mode within 65 s of the slot, at least 0.85
# times the bare client's runs/s, at most 3 ms of worker CPU per run.
TARGET_SECONDS_FULL = 65.0
TARGET_RATIO = 0.85
TARGET_CPU_MS_PER_RUN = 3.0
TARGET_RSS_MIB = 150.0
TARGET_RSS_AT_IN_FLIGHT = 500
MIB = 1024 * 1024
REQUEST_BODY = {
    "model": "fake-model",
    "messages": [
        {"role": "system", "content": "Be brief.\n\nSummarise what changed."},
        {"role": "user", "content": "Run now."},
    ],
}


def sizes(quick: bool) -> tuple[int, float, int]:
    agents = int(os.environ.get("BENCH_STAMPEDE_AGENTS", 1_000 if quick else 10_000))
    latency = float(os.environ.get("BENCH_STAMPEDE_LATENCY", 2.0 if quick else 5.0))
    in_flight = int(os.environ.get("BENCH_STAMPEDE_IN_FLIGHT", 200 if quick else 500))
    return agents, latency, in_flight


async def seed(url: str, *, agents: int, base_url: str, warm_base_url: str | None = None) -> None:
    """`agents` agents on model 1 (`base_url`), then WARM_UP_RUNS more on model 2
    (`warm_base_url`, default the same server)."""
    owners = max(agents // AGENTS_PER_OWNER, 1)
    conn = await asyncpg.connect(url)
    try:
        await conn.execute(
            f"""
            INSERT INTO users (id, email, timezone)
            SELECT g, 'u' || g || '@example.com', 'UTC' FROM generate_series(1, {owners}) g;
            INSERT INTO agent_models (id, name, provider, model, base_url, api_key_env)
            VALUES (1, 'Fake', 'openai', 'fake-model', '{base_url}', '{FAKE_KEY_ENV}'),
                   (2, 'Warm-up', 'openai', 'fake-model', '{warm_base_url or base_url}',
                    '{FAKE_KEY_ENV}');
            INSERT INTO platform_settings (key, value) VALUES
                ('agent_weekly_token_cap', '1000000000000'::jsonb),
                ('agent_platform_prompt', '"Be brief."'::jsonb);
            INSERT INTO agents (id, user_id, name, prompt, model_id, schedule)
            OVERRIDING SYSTEM VALUE
            SELECT g, 1 + g % {owners}, 'agent ' || g, 'Summarise what changed.',
                   CASE WHEN g <= {agents} THEN 1 ELSE 2 END,
                   '{{"type": "interval", "every_hours": 24}}'::jsonb
            FROM generate_series(1, {agents + WARM_UP_RUNS}) g
            """
        )
        await conn.execute("VACUUM ANALYZE")
    finally:
        await conn.close()


class Sampler:
    """The journal's running/finished counts and the workers' RSS, every SAMPLE_SECONDS."""

    def __init__(self, conn: asyncpg.Connection, workers: list[psutil.Process]) -> None:
        self.conn = conn
        self.workers = workers
        self.peak_running = 0
        self.rss_at_peak: list[int] = [0] * len(workers)
        self.max_rss: list[int] = [0] * len(workers)
        self.samples: list[tuple[float, int, int]] = []

    async def run(self, agents: int, slot_id_floor: int) -> None:
        while True:
            row = await self.conn.fetchrow(
                "SELECT count(*) FILTER (WHERE state = 'running') AS running,"
                " count(*) FILTER (WHERE state IN ('succeeded', 'failed', 'skipped')) AS done"
                " FROM agent_runs WHERE id > $1",
                slot_id_floor,
            )
            rss = [w.memory_info().rss for w in self.workers]
            self.max_rss = [max(a, b) for a, b in zip(self.max_rss, rss, strict=True)]
            if row["running"] > self.peak_running:
                self.peak_running = int(row["running"])
                self.rss_at_peak = rss
            self.samples.append((time.time(), int(row["running"]), int(row["done"])))
            if row["done"] >= agents:
                return
            await asyncio.sleep(SAMPLE_SECONDS)


async def bare_client(base_url: str, *, requests: int, concurrency: int) -> dict[str, float]:
    """The same fake model driven by a bare asyncio client at the same concurrency, from one
    process: `concurrency` keep-alive HTTP/1.1 connections (asyncio streams, no HTTP library),
    each sending the next request as soon as its reply is read."""
    url = httpx.URL(base_url)
    body = json.dumps(REQUEST_BODY).encode()
    head = (
        f"POST {url.path.rstrip('/')}/chat/completions HTTP/1.1\r\n"
        f"Host: {url.host}:{url.port}\r\nAuthorization: Bearer bench-key\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    remaining = requests
    errors = 0
    cpu_before = psutil.Process().cpu_times()

    async def connection() -> None:
        nonlocal remaining, errors
        reader, writer = await asyncio.open_connection(url.host, url.port)
        try:
            while remaining > 0:
                remaining -= 1
                writer.write(head + body)
                status = await reader.readline()
                length = 0
                while (line := await reader.readline()) not in (b"\r\n", b""):
                    name, _, value = line.decode().partition(":")
                    if name.lower() == "content-length":
                        length = int(value)
                json.loads(await reader.readexactly(length))
                if b" 200 " not in status:
                    errors += 1
        finally:
            writer.close()

    started = time.perf_counter()
    await asyncio.gather(*(connection() for _ in range(min(concurrency, requests))))
    seconds = time.perf_counter() - started
    cpu_after = psutil.Process().cpu_times()
    cpu = (cpu_after.user - cpu_before.user) + (cpu_after.system - cpu_before.system)
    return {
        "requests": requests,
        "seconds": seconds,
        "per_s": requests / seconds,
        "errors": errors,
        "client_cpu_ms_per_request": cpu * 1000 / requests,
    }


async def warm_up(conn: asyncpg.Connection, *, agents: int, latency: float) -> None:
    """The warm-up agents (ids after the first `agents`) run once: the workers are up and their
    pools, clients and imports warm."""
    warm = list(range(agents + 1, agents + WARM_UP_RUNS + 1))
    await conn.execute("UPDATE agents SET next_run_at = now() WHERE id = ANY($1::bigint[])", warm)

    async def warmed() -> bool:
        done = await conn.fetchval(
            "SELECT count(*) FROM agent_runs WHERE agent_id = ANY($1::bigint[])"
            " AND state = 'succeeded'",
            warm,
        )
        return bool(done == len(warm))

    await eventually(warmed, within=120 + latency * 2, what="the warm-up runs", poll=0.1)


async def memory_phase(
    bench: Bench, *, in_flight: int, latency: float, warm_base_url: str
) -> dict[str, Any]:
    """One worker process filled to `in_flight` runs of a model that does not answer in time:
    its RSS warm and idle, then with the set full."""
    slow = Process(
        python_module_command("bench._fake_model", "--delay", "600"),
        env=bench.env(bench.settings(bench.database_url("postgres"), bench.redis_base_url)),
        log_path=bench.work_dir / "stampede-memory-fake.log",
    )
    processes = [slow]
    try:
        port = await asyncio.to_thread(read_port_line, slow)
        url = await bench.create_database("stampede_memory")
        await seed(
            url,
            agents=in_flight,
            base_url=f"http://127.0.0.1:{port}/v1",
            warm_base_url=warm_base_url,
        )
        settings = bench.settings(
            url, bench.redis_url(), runs_in_flight=in_flight, schedule_tick_seconds=1.0
        )
        env = bench.env(settings)
        worker = Process(
            agent_engine_command("worker", "--threads", str(WORKER_THREADS)),
            env=env,
            log_path=bench.work_dir / "stampede-memory-worker.log",
        )
        clock = Process(
            agent_engine_command("clock"),
            env=env,
            log_path=bench.work_dir / "stampede-memory-clock.log",
        )
        processes += [worker, clock]
        conn = await asyncpg.connect(url)
        try:
            await warm_up(conn, agents=in_flight, latency=latency)
            proc = psutil.Process(worker.pid)
            idle = proc.memory_info().rss
            await conn.execute("UPDATE agents SET next_run_at = now() WHERE id <= $1", in_flight)

            async def full() -> bool:
                running = await conn.fetchval(
                    "SELECT count(*) FROM agent_runs WHERE state = 'running'"
                )
                return bool(running >= in_flight)

            await eventually(full, within=300, what="a full in-flight set", poll=0.25)
            await asyncio.sleep(2.0)  # every model call is out and waiting
            full_rss = proc.memory_info().rss
        finally:
            await conn.close()
    finally:
        for process in processes:
            process.kill()
    return {
        "in_flight": in_flight,
        "idle_rss_mib": idle / MIB,
        "full_rss_mib": full_rss / MIB,
        "rss_mib_per_100_in_flight": (full_rss - idle) / MIB / (in_flight / 100),
    }


def _cpu_seconds(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system + times.children_user + times.children_system


async def engine_phase(
    bench: Bench, *, agents: int, latency: float, in_flight: int, base_url: str
) -> dict[str, Any]:
    url = await bench.create_database("stampede")
    await seed(url, agents=agents, base_url=base_url)
    settings = bench.settings(
        url, bench.redis_url(), runs_in_flight=in_flight, schedule_tick_seconds=1.0
    )
    env = bench.env(settings)
    worker_command = agent_engine_command(
        "worker", "--processes", "1", "--threads", str(WORKER_THREADS)
    )
    workers = [
        Process(worker_command, env=env, log_path=bench.work_dir / f"stampede-worker-{i}.log")
        for i in range(WORKER_PROCESSES)
    ]
    clock = Process(
        agent_engine_command("clock"), env=env, log_path=bench.work_dir / "stampede-clock.log"
    )
    conn = await asyncpg.connect(url)
    try:
        await warm_up(conn, agents=agents, latency=latency)
        floor = int(await conn.fetchval("SELECT coalesce(max(id), 0) FROM agent_runs"))
        procs = [psutil.Process(w.pid) for w in workers]
        idle_rss = [p.memory_info().rss for p in procs]
        cpu_before = [_cpu_seconds(p) for p in procs]

        # The slot: every agent due at the same instant.
        # On a whole second, as a real slot is on a whole minute (09:00:00).
        slot = (datetime.now(UTC) + timedelta(seconds=SLOT_AFTER_WARM_UP_SECONDS)).replace(
            microsecond=0
        ) + timedelta(seconds=1)
        await conn.execute("UPDATE agents SET next_run_at = $1 WHERE id <= $2", slot, agents)
        sampler = Sampler(await asyncpg.connect(url), procs)
        try:
            with profiled(workers[0].pid, "stampede-worker"):
                await asyncio.wait_for(
                    sampler.run(agents, floor), timeout=max(600.0, agents * latency / 20)
                )
        finally:
            await sampler.conn.close()
        cpu_after = [_cpu_seconds(p) for p in procs]
        stats = await conn.fetchrow(
            "SELECT count(*) AS n, count(*) FILTER (WHERE state = 'succeeded') AS ok,"
            " max(finished_at) AS last, min(created_at) AS first_journaled,"
            " max(created_at) AS last_journaled, max(started_at) AS last_started,"
            " percentile_cont(0.5) WITHIN GROUP"
            "   (ORDER BY extract(epoch FROM started_at - created_at)) AS wait_p50,"
            " percentile_cont(0.99) WITHIN GROUP"
            "   (ORDER BY extract(epoch FROM started_at - created_at)) AS wait_p99"
            " FROM agent_runs WHERE id > $1",
            floor,
        )
        duplicates = await conn.fetchval(
            "SELECT count(*) - count(DISTINCT agent_id) FROM agent_runs WHERE id > $1", floor
        )
    finally:
        for process in [*workers, clock]:
            process.stop()
        await conn.close()
    seconds = (stats["last"] - slot).total_seconds()
    cpu = sum(after - before for before, after in zip(cpu_before, cpu_after, strict=True))
    grown = sum(
        max(peak - idle, 0) for peak, idle in zip(sampler.rss_at_peak, idle_rss, strict=True)
    )
    return {
        "agents": agents,
        "runs": int(stats["n"]),
        "succeeded": int(stats["ok"]),
        "duplicate_runs": int(duplicates),
        "seconds_slot_to_last_finished": seconds,
        "journaled_within_s": (stats["last_journaled"] - slot).total_seconds(),
        "last_started_after_s": (stats["last_started"] - slot).total_seconds(),
        "queue_wait_p50_s": float(stats["wait_p50"]),
        "queue_wait_p99_s": float(stats["wait_p99"]),
        "per_s": agents / seconds,
        "peak_running": sampler.peak_running,
        "worker_cpu_ms_per_run": cpu * 1000 / agents,
        "idle_rss_mib": [r / MIB for r in idle_rss],
        "rss_at_peak_mib": [r / MIB for r in sampler.rss_at_peak],
        "max_rss_mib": [r / MIB for r in sampler.max_rss],
        "rss_mib_per_100_in_flight": (grown / MIB) / (sampler.peak_running / 100)
        if sampler.peak_running
        else None,
        "timeline": [
            (round(t - slot.timestamp(), 2), running, done)
            for t, running, done in sampler.samples[:: max(1, len(sampler.samples) // 200)]
        ],
    }


async def run(bench: Bench) -> ScenarioResult:
    agents, latency, in_flight = sizes(bench.quick)
    capacity = WORKER_PROCESSES * in_flight
    result = ScenarioResult(NAME, TITLE)
    fake = Process(
        python_module_command("bench._fake_model", "--delay", str(latency)),
        env=bench.env(bench.settings(bench.database_url("postgres"), bench.redis_base_url)),
        log_path=bench.work_dir / "stampede-fake.log",
    )
    try:
        port = await asyncio.to_thread(read_port_line, fake)
        base_url = f"http://127.0.0.1:{port}/v1"
        engine = await engine_phase(
            bench, agents=agents, latency=latency, in_flight=in_flight, base_url=base_url
        )
        bare = await bare_client(base_url, requests=agents, concurrency=capacity)
        memory = await memory_phase(
            bench, in_flight=in_flight, latency=latency, warm_base_url=base_url
        )
    finally:
        fake.stop()
    physical = agents * latency / capacity
    old_design = agents * latency / (WORKER_PROCESSES * WORKER_THREADS)
    complete = engine["succeeded"] == agents and engine["duplicate_runs"] == 0
    seconds = engine["seconds_slot_to_last_finished"]
    per_process_peak = engine["peak_running"] / WORKER_PROCESSES
    result.add(
        Row(
            f"slot → last run finished, {agents:,} runs x {latency:g} s model",
            seconds,
            "s",
            baseline=physical,
            baseline_label=f"Nxlatency÷{capacity} in flight",
            target=f"≤ {TARGET_SECONDS_FULL:g} s (full mode)" if not bench.quick else "",
            ok=(seconds <= TARGET_SECONDS_FULL and complete) if not bench.quick else None,
            note=f"{engine['succeeded']:,}/{agents:,} succeeded, {engine['duplicate_runs']}"
            f" doubled; all journaled {engine['journaled_within_s']:.1f} s after the slot;"
            f" queue wait p50 {engine['queue_wait_p50_s']:.1f} s, p99"
            f" {engine['queue_wait_p99_s']:.1f} s; one run per thread (8 x 2) would need"
            f" ≥ {old_design:,.0f} s",
        ),
        Row(
            "runs/s vs a bare asyncio client, same model and concurrency",
            engine["per_s"],
            "runs/s",
            baseline=bare["per_s"],
            baseline_label=f"bare client req/s at {capacity}",
            target=f"ratio ≥ {TARGET_RATIO}",
            ok=engine["per_s"] / bare["per_s"] >= TARGET_RATIO and complete,
            note=f"bare client: {bare['seconds']:.1f} s for {agents:,} requests,"
            f" {bare['errors']} errors, {bare['client_cpu_ms_per_request']:.2f} ms CPU each",
        ),
        Row(
            "peak runs in flight (journal `running`)",
            engine["peak_running"],
            "runs",
            baseline=capacity,
            baseline_label="capacity",
        ),
        Row(
            "worker CPU per run (both processes)",
            engine["worker_cpu_ms_per_run"],
            "ms CPU",
            target=f"≤ {TARGET_CPU_MS_PER_RUN:g} ms",
            ok=engine["worker_cpu_ms_per_run"] <= TARGET_CPU_MS_PER_RUN,
        ),
        Row(
            "worker RSS per 100 runs in flight",
            memory["rss_mib_per_100_in_flight"],
            "MiB",
            note=f"one worker filled to {memory['in_flight']} in flight (a model that does not"
            f" answer): {memory['idle_rss_mib']:.0f} MiB warm and idle →"
            f" {memory['full_rss_mib']:.0f} MiB; during the stampede"
            f" {', '.join(f'{r:.0f}' for r in engine['idle_rss_mib'])} →"
            f" {', '.join(f'{r:.0f}' for r in engine['rss_at_peak_mib'])} MiB at"
            f" ~{per_process_peak:.0f} in flight each",
        ),
        Row(
            f"worker RSS with {memory['in_flight']} runs in flight",
            memory["full_rss_mib"],
            "MiB",
            target=f"≤ {TARGET_RSS_MIB:g} MiB at {TARGET_RSS_AT_IN_FLIGHT}",
            ok=memory["full_rss_mib"] <= TARGET_RSS_MIB
            if memory["in_flight"] >= TARGET_RSS_AT_IN_FLIGHT
            else None,
        ),
    )
    result.details = {
        "agents": agents,
        "latency_s": latency,
        "in_flight_per_process": in_flight,
        "worker_processes": WORKER_PROCESSES,
        "physical_limit_s": physical,
        "one_run_per_thread_bound_s": old_design,
        "engine": engine,
        "bare_client": bare,
        "memory": memory,
    }
    return result
