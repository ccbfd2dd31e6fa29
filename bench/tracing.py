"""Scenario — tracing's cost: worker CPU per run with tracing off, on (OTLP/HTTP to a local
receiver), and today's (the code before tracing was added), through one `agent-engine worker
--processes 1 --threads 8` against an instantly answering model server.

Each configuration is a fresh worker process given the same batch of manual runs (the agents are
reused: each run finishes before the next round); the worker's CPU time over the batch divided by
the runs is the measure. Rounds alternate the configurations (off, on, today, off, on, today …) and
each reports its median, because the machine is shared. "Today" runs the worker from the source
tree of the commit before tracing came (`git archive` of the parent of the commit that added
`observability/tracing.py`, or AGENT_ENGINE_BENCH_TRACING_BASE), on the same database.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import tarfile
import time
from datetime import UTC, datetime
from io import BytesIO
from pathlib import Path
from typing import Any

import asyncpg
import psutil

from agent_engine.db.engine import create_engine
from agent_engine.domain.runs import RunTrigger
from agent_engine.runs.request import request_run
from agent_engine.testing.otlp_receiver import OtlpReceiver
from agent_engine.workers.broker import close_broker, configure_broker, enqueue_execute
from bench.common import (
    Bench,
    Process,
    Row,
    ScenarioResult,
    agent_engine_command,
    eventually,
    median,
    python_module_command,
    read_port_line,
)
from bench.run_pipeline import THREADS, seed

TITLE = "Tracing: worker CPU per run off, on (OTLP/HTTP to a local receiver) and before tracing"
NAME = "tracing"
TARGET_ON_RATIO = 1.3
TARGET_OFF_RATIO = 1.02
REQUEST_CONCURRENCY = 16
TRACING_MODULE = "src/agent_engine/observability/tracing.py"
BASE_ENV = "AGENT_ENGINE_BENCH_TRACING_BASE"
OFF, ON, ON_NO_SQL, TODAY = "off", "on", "on_no_sql", "today"


def _git(*args: str) -> str:
    return subprocess.run(
        ["git", *args], check=True, capture_output=True, text=True, cwd=Path.cwd()
    ).stdout.strip()


def baseline_source(work_dir: Path) -> tuple[Path, str] | None:
    """The `src/` of the commit before tracing, unpacked under `work_dir`; None outside git."""
    import os

    try:
        ref = os.environ.get(BASE_ENV) or (
            _git("log", "--diff-filter=A", "--format=%H", "--", TRACING_MODULE).splitlines()[-1]
            + "^"
        )
        commit = _git("rev-parse", "--short", ref)
        archive = subprocess.run(
            ["git", "archive", "--format=tar", ref, "src"],
            check=True,
            capture_output=True,
            cwd=Path.cwd(),
        ).stdout
    except (subprocess.CalledProcessError, FileNotFoundError, IndexError):
        return None
    target = work_dir / f"tracing-base-{commit}"
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(target, filter="data")
    return target / "src", commit


async def _wait_finished(conn: asyncpg.Connection, run_ids: list[int], *, within: float) -> None:
    async def done() -> bool:
        count = await conn.fetchval(
            "SELECT count(*) FROM agent_runs WHERE id = ANY($1::bigint[])"
            " AND state NOT IN ('queued', 'running')",
            run_ids,
        )
        return int(count) == len(run_ids)

    await eventually(done, within=within, what="the runs to finish", poll=0.05)


async def one_round(
    bench: Bench,
    url: str,
    *,
    config: str,
    runs: int,
    receiver: OtlpReceiver,
    base_src: Path | None,
) -> dict[str, Any]:
    """A fresh worker in `config`; `runs` manual runs; its CPU ms per run."""
    redis_url = bench.redis_url()
    settings = bench.settings(url, redis_url)
    configure_broker(settings)
    engine = create_engine(settings, pool_size=REQUEST_CONCURRENCY)
    conn = await asyncpg.connect(url)
    extra: dict[str, str] = {"OTEL_SDK_DISABLED": "true"}
    if config in (ON, ON_NO_SQL):
        extra = {
            "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
            "OTEL_SERVICE_NAME": "agent-engine-bench",
        }
    if config == ON_NO_SQL:
        extra["OTEL_PYTHON_DISABLED_INSTRUMENTATIONS"] = "asyncpg"
    env = bench.env(settings, **extra)
    if config == TODAY and base_src is not None:
        env["PYTHONPATH"] = f"{base_src}:{env['PYTHONPATH']}"
    worker = Process(
        agent_engine_command("worker", "--processes", "1", "--threads", str(THREADS)),
        env=env,
        log_path=bench.work_dir / f"tracing-worker-{config}.log",
    )
    received_before = receiver.count

    async def request(agent_id: int, semaphore: asyncio.Semaphore) -> int:
        async with semaphore:
            row = await request_run(
                engine,
                agent_id,
                trigger=RunTrigger.MANUAL,
                now=datetime.now(UTC),
                enqueue=enqueue_execute,
            )
            return row.id

    try:
        semaphore = asyncio.Semaphore(REQUEST_CONCURRENCY)
        # Warm-up: the worker is ready once these went through (pool, client, imports).
        warm = await asyncio.gather(
            *(request(a, semaphore) for a in range(runs + 1, runs + 1 + 2 * THREADS))
        )
        await _wait_finished(conn, list(warm), within=90)
        proc = psutil.Process(worker.pid)
        before = proc.cpu_times()
        switches_before = _switches(proc)
        started = time.perf_counter()
        ids = await asyncio.gather(*(request(a, semaphore) for a in range(1, runs + 1)))
        await _wait_finished(conn, list(ids), within=max(90.0, runs / 10))
        after = proc.cpu_times()
        switches_after = _switches(proc)
        seconds = time.perf_counter() - started
        succeeded = await conn.fetchval(
            "SELECT count(*) FROM agent_runs WHERE id = ANY($1::bigint[]) AND state = 'succeeded'",
            list(ids),
        )
    finally:
        worker.stop()
        await conn.close()
        await engine.dispose()
        close_broker()
    cpu = (after.user - before.user) + (after.system - before.system)
    return {
        "config": config,
        "runs": runs,
        "succeeded": int(succeeded),
        "seconds": seconds,
        "worker_cpu_ms_per_run": cpu * 1000 / runs,
        "worker_user_ms_per_run": (after.user - before.user) * 1000 / runs,
        "worker_system_ms_per_run": (after.system - before.system) * 1000 / runs,
        "worker_context_switches_per_run": (switches_after - switches_before) / runs,
        "spans_received": receiver.count - received_before,
    }


def _switches(proc: psutil.Process) -> int:
    """The worker's context switches so far, voluntary and involuntary, over all its threads."""
    total = 0
    for status in Path(f"/proc/{proc.pid}/task").glob("*/status"):
        try:
            lines = status.read_text().splitlines()
        except OSError:
            continue  # a thread that ended meanwhile
        total += sum(int(line.split()[1]) for line in lines if "ctxt_switches" in line)
    return total


async def hooks_us_per_run(iterations: int, *, endpoint: str | None = None) -> float:
    """What tracing's hooks cost a run in this process: the queue middleware's three hooks, the
    run's span (started before the claim), two model calls and a tool call -- the code a worker
    runs, timed without the noise of a whole run around it. Tracing off unless `endpoint` is
    given; then the spans are exported over OTLP/HTTP there and the export (its thread's CPU
    included: `process_time` counts every thread) is inside the timing (keep `iterations` x 5
    spans under the SDK's queue of 2,048, or spans are dropped instead of exported)."""
    from contextvars import copy_context

    import dramatiq

    from agent_engine.domain.runs import RunState
    from agent_engine.observability import genai_spans as spans
    from agent_engine.observability import tracing
    from agent_engine.runs.claim import Claim
    from agent_engine.runs.run_trace import traced_run
    from agent_engine.runtime.context import ModelSpec, RunContext
    from agent_engine.runtime.providers.base import ModelReply, ModelRequest, ToolCall
    from agent_engine.runtime.tools.spec import ToolSpec
    from agent_engine.workers.tracing import TraceContextMiddleware

    if endpoint is not None:
        # The exporter reads its endpoint from the process's environment.
        os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = endpoint
        tracing.configure_tracing("bench", set_global=False)
    assert (endpoint is not None) == tracing.ENABLED
    middleware = TraceContextMiddleware()
    message: Any = dramatiq.Message(
        queue_name="runs", actor_name="execute_run", args=(1,), kwargs={}, options={}
    )
    context = RunContext(
        run_id=1,
        agent_id=1,
        owner_id=1,
        owner_timezone="UTC",
        prompt="p",
        model=ModelSpec(provider="openai", model="m", base_url=None, api_key_env=None),
        optional_tools=(),
        platform_prompt="",
        iteration_cap=10,
        agent_name="bench",
    )
    request = ModelRequest(model="m", messages=[], tools=[])
    reply = ModelReply(content="done", tokens_used=30, prompt_tokens=20)
    call = ToolCall(id="c", name="t", arguments="{}")
    spec: Any = ToolSpec(name="t", description="", parameters={}, handler=None)  # type: ignore[arg-type]
    broker: Any = None
    engine: Any = None

    def send() -> None:
        middleware.before_enqueue(broker, message, 0)

    started = time.process_time()
    try:
        for _ in range(iterations):
            copy_context().run(send)
            middleware.before_process_message(broker, message)
            claim = Claim(1, RunState.RUNNING, context=context, span=spans.start_agent_span(1))
            async with traced_run(engine, claim) as traced:
                for _ in range(2):
                    with spans.chat_span("openai", request) as span:
                        spans.model_reply(span, reply)
                with spans.tool_span(spec, call) as span:
                    span.result("r")
                traced.ended(RunState.SUCCEEDED)
            middleware.after_process_message(broker, message, result=None)
        tracing.force_flush()
    finally:
        if endpoint is not None:
            tracing.shutdown_tracing()
            del os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"]
    return (time.process_time() - started) / iterations * 1e6


async def run(bench: Bench) -> ScenarioResult:
    # Enough runs that the CPU clock's 10 ms ticks are ~1 % of a round's CPU.
    runs = 800 if bench.quick else 2_000
    rounds = 3 if bench.quick else 5
    result = ScenarioResult(NAME, TITLE)
    base = baseline_source(bench.work_dir)
    configs = [OFF, ON, ON_NO_SQL] + ([TODAY] if base is not None else [])
    fake = Process(
        python_module_command("bench._fake_model"),
        env=bench.env(bench.settings(bench.database_url("postgres"), bench.redis_base_url)),
        log_path=bench.work_dir / "tracing-fake.log",
    )
    measured: dict[str, list[dict[str, Any]]] = {c: [] for c in configs}
    try:
        port = await asyncio.to_thread(read_port_line, fake)
        url = await bench.create_database("tracing")
        await seed(url, agents=runs + 2 * THREADS + 1, base_url=f"http://127.0.0.1:{port}/v1")
        with OtlpReceiver(keep=False) as receiver:
            for _ in range(rounds):
                for config in configs:
                    measured[config].append(
                        await one_round(
                            bench,
                            url,
                            config=config,
                            runs=runs,
                            receiver=receiver,
                            base_src=base[0] if base else None,
                        )
                    )
    finally:
        fake.stop()
    cpu = {c: median([r["worker_cpu_ms_per_run"] for r in measured[c]]) for c in configs}
    hooks_us = median([await hooks_us_per_run(20_000) for _ in range(3)])
    with OtlpReceiver(keep=False) as receiver:
        on_hooks_us = median(
            [await hooks_us_per_run(300, endpoint=receiver.endpoint) for _ in range(5)]
        )
    complete = all(r["succeeded"] == runs for rs in measured.values() for r in rs)
    spans_per_run = median([r["spans_received"] / runs for r in measured[ON]])
    spans_no_sql = median([r["spans_received"] / runs for r in measured[ON_NO_SQL]])
    result.add(
        Row(
            f"worker CPU per run, tracing on ÷ off ({runs} runs x {rounds} rounds)",
            cpu[ON],
            "ms CPU",
            baseline=cpu[OFF],
            baseline_label="off",
            target=f"ratio ≤ {TARGET_ON_RATIO}",
            ok=cpu[ON] / cpu[OFF] <= TARGET_ON_RATIO and complete and spans_per_run > 0,
            note=f"exporting OTLP/HTTP to a local receiver: {spans_per_run:.1f} spans per run "
            "received (SQL, HTTP, queue and GenAI spans)",
        ),
        Row(
            "worker CPU per run, tracing on without SQL spans ÷ off",
            cpu[ON_NO_SQL],
            "ms CPU",
            baseline=cpu[OFF],
            baseline_label="off",
            target=f"ratio ≤ {TARGET_ON_RATIO}",
            ok=cpu[ON_NO_SQL] / cpu[OFF] <= TARGET_ON_RATIO and complete and spans_no_sql > 0,
            note=f"OTEL_PYTHON_DISABLED_INSTRUMENTATIONS=asyncpg: {spans_no_sql:.1f} spans per run",
        ),
    )
    reference_ms = cpu[TODAY] if base is not None else cpu[OFF]
    result.add(
        Row(
            "tracing off: its hooks' CPU per run (in process)",
            hooks_us / 1000,
            "ms CPU",
            baseline=reference_ms,
            baseline_label="a run, before" if base is not None else "a run, off",
            target=f"≤ {TARGET_OFF_RATIO - 1:.0%} of a run",
            ok=hooks_us / 1000 <= (TARGET_OFF_RATIO - 1) * reference_ms,
            note=f"{hooks_us:.1f} µs: the queue middleware's hooks, the run's span, two model "
            "calls and a tool call, with tracing off",
        ),
        Row(
            "tracing on: the same hooks' CPU per run, spans exported (in process, no SQL)",
            on_hooks_us / 1000,
            "ms CPU",
            baseline=cpu[OFF],
            baseline_label="a run, off",
            target="(informative)",
            ok=True,
            note=f"{on_hooks_us:.0f} µs for 5 spans, OTLP/HTTP export included: what the SDK "
            "costs per span single-threaded; the worker row above adds its SQL spans and the "
            "threaded worker's overhead (more CPU per run means more GIL hand-offs)",
        ),
    )
    if base is not None:
        result.add(
            Row(
                "worker CPU per run, tracing off ÷ before tracing",
                cpu[OFF],
                "ms CPU",
                baseline=cpu[TODAY],
                baseline_label=f"before ({base[1]})",
                target=f"ratio ≤ {TARGET_OFF_RATIO}",
                ok=cpu[OFF] / cpu[TODAY] <= TARGET_OFF_RATIO and complete,
                note="medians of alternating rounds; the machine is shared, so a ratio within "
                "a few % of 1 is noise",
            )
        )
    result.details = {
        "rounds": measured,
        "cpu_ms_per_run": cpu,
        "off_hooks_us_per_run": hooks_us,
        "on_hooks_us_per_run": on_hooks_us,
        "base": base[1] if base else None,
    }
    return result
