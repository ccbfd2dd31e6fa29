"""Scenario 6 - recovery: a worker SIGKILLed mid-run; time until the run is failed/stale and the
agent can start again.

Real `agent-engine worker` and `agent-engine clock` processes with short settings (heartbeat 1 s,
STALE_AFTER 3 s, reap tick 1 s, passed as AGENT_ENGINE_* variables) and a model server that never
answers in time. The killed worker is replaced at once (as a supervisor would). The issue's target
is STALE_AFTER + 30 s (30 s being the default reap tick); the baseline printed is the bound for
these settings: STALE_AFTER + the reap tick.
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime

import asyncpg

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
    python_module_command,
    read_port_line,
)

TITLE = "Recovery: worker SIGKILLed mid-run → failed/stale → agent starts again"
NAME = "recovery"
HEARTBEAT_SECONDS = 1.0
STALE_AFTER_SECONDS = 3.0
REAP_TICK_SECONDS = 1.0
ISSUE_MARGIN_SECONDS = 30.0


async def run(bench: Bench) -> ScenarioResult:
    from agent_engine.db.engine import create_engine

    result = ScenarioResult(NAME, TITLE)
    fake = Process(
        python_module_command("bench._fake_model", "--delay", "600"),
        env=bench.env(bench.settings(bench.database_url("postgres"), bench.redis_base_url)),
        log_path=bench.work_dir / "recovery-fake.log",
    )
    url = await bench.create_database("recovery")
    settings = bench.settings(
        url,
        bench.redis_url(),
        heartbeat_interval_seconds=HEARTBEAT_SECONDS,
        stale_after_seconds=STALE_AFTER_SECONDS,
        reap_tick_seconds=REAP_TICK_SECONDS,
        schedule_tick_seconds=1.0,
    )
    env = bench.env(settings)
    worker_command = agent_engine_command("worker", "--processes", "1", "--threads", "4")
    processes: list[Process] = [fake]
    engine = create_engine(settings, pool_size=2)
    conn = await asyncpg.connect(url)
    configure_broker(settings)
    try:
        port = await asyncio.to_thread(read_port_line, fake)
        await conn.execute(
            f"""
            INSERT INTO users (id, email) VALUES (1, 'o@example.com');
            INSERT INTO agent_models (id, name, provider, model, base_url, api_key_env)
            VALUES (1, 'Fake', 'openai', 'fake-model', 'http://127.0.0.1:{port}/v1',
                    '{FAKE_KEY_ENV}');
            INSERT INTO agents (id, user_id, name, prompt, model_id) OVERRIDING SYSTEM VALUE
            VALUES (1, 1, 'victim', 'p', 1)
            """
        )
        victim = Process(worker_command, env=env, log_path=bench.work_dir / "recovery-w1.log")
        clock = Process(
            agent_engine_command("clock"), env=env, log_path=bench.work_dir / "recovery-clock.log"
        )
        processes += [victim, clock]
        doomed = await request_run(
            engine, 1, trigger=RunTrigger.MANUAL, now=datetime.now(UTC), enqueue=enqueue_execute
        )

        async def beating() -> bool:
            row = await conn.fetchrow(
                "SELECT state, started_at, heartbeat_at FROM agent_runs WHERE id = $1",
                doomed.id,
            )
            return bool(row["state"] == "running" and row["heartbeat_at"] > row["started_at"])

        await eventually(beating, within=60, what="the run to be mid-flight", poll=0.05)
        last_beat = await conn.fetchval(
            "SELECT heartbeat_at FROM agent_runs WHERE id = $1", doomed.id
        )
        killed_at = time.time()
        victim.kill()
        processes.append(
            Process(worker_command, env=env, log_path=bench.work_dir / "recovery-w2.log")
        )

        async def failed() -> asyncpg.Record | None:
            row = await conn.fetchrow(
                "SELECT state, reason, finished_at, heartbeat_at FROM agent_runs WHERE id = $1",
                doomed.id,
            )
            return row if row["state"] != "running" else None

        row = await eventually(
            failed, within=STALE_AFTER_SECONDS + 60, what="the run to be reaped", poll=0.05
        )
        last_beat = row["heartbeat_at"] or last_beat
        again = await request_run(
            engine, 1, trigger=RunTrigger.MANUAL, now=datetime.now(UTC), enqueue=enqueue_execute
        )
        restarted_at = time.time()
    finally:
        for process in processes:
            process.kill()
        await conn.close()
        await engine.dispose()
        close_broker()
    to_failed = row["finished_at"].timestamp() - killed_at
    to_start = restarted_at - killed_at
    bound = STALE_AFTER_SECONDS + REAP_TICK_SECONDS
    issue_bound = STALE_AFTER_SECONDS + ISSUE_MARGIN_SECONDS
    ok_state = row["state"] == "failed" and row["reason"] == "stale"
    result.add(
        Row(
            f"kill → failed/stale (STALE_AFTER {STALE_AFTER_SECONDS:g} s)",
            to_failed,
            "s",
            baseline=bound,
            baseline_label="STALE_AFTER + reap tick",
            target=f"≤ STALE_AFTER + 30 s = {issue_bound:g} s",
            ok=ok_state and to_failed <= issue_bound,
            note=f"state {row['state']}/{row['reason']}; last heartbeat "
            f"{killed_at - last_beat.timestamp():.2f} s before the kill; "
            f"ratio to STALE_AFTER + 30 s = {to_failed / issue_bound:.2f}",
        ),
        Row(
            "kill → the agent starts again (new run queued)",
            to_start,
            "s",
            baseline=bound,
            baseline_label="STALE_AFTER + reap tick",
            target=f"≤ {issue_bound:g} s",
            ok=again.state == "queued" and to_start <= issue_bound,
            note=f"new run state: {again.state}; ratio to STALE_AFTER + 30 s = "
            f"{to_start / issue_bound:.2f}",
        ),
    )
    result.details = {
        "heartbeat_seconds": HEARTBEAT_SECONDS,
        "stale_after_seconds": STALE_AFTER_SECONDS,
        "reap_tick_seconds": REAP_TICK_SECONDS,
        "kill_to_failed_s": to_failed,
        "kill_to_restart_s": to_start,
        "seconds_since_heartbeat_at_kill": killed_at - last_beat.timestamp(),
        "new_run_state": again.state,
    }
    await bench.drop_database(url)
    return result
