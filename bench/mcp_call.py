"""MCP tool calls: what one costs the worker, beside a built-in tool.

The MCP ticket server (`agent_engine.testing.mcp_tickets`, the official `mcp` SDK over Streamable
HTTP) and the model (`bench._fake_model`, scripted to make one tool call, then answer) run in
processes of their own, so this process's CPU time is the engine's alone. Measured in this
process, sequentially, with the engine's `Runtime`:

- a run with one MCP READ call (`tickets__search_tickets`), end to end (model call, tool call,
  model call), beside the same run with the built-in `calculator` as its one tool;
- one tool call alone: MCP through the worker's pooled session, the built-in, and MCP with a new
  session per call (initialize + call + close: the handshake-per-call trap the pool avoids).

Latency p50 and CPU per item (time.process_time), interleaved in rounds.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

from agent_engine.db.engine import create_engine_for_url
from agent_engine.embedded import free_port
from agent_engine.runtime.context import ModelSpec, RunContext
from agent_engine.runtime.loop import Runtime
from agent_engine.runtime.providers.base import ToolCall
from agent_engine.runtime.tools.spec import McpTool, ToolCallContext
from agent_engine.testing.mcp_tickets import SEARCH_SCHEMA
from agent_engine.tool_sources.client import open_session
from bench.common import (
    FAKE_KEY_ENV,
    Bench,
    Process,
    Row,
    ScenarioResult,
    python_module_command,
    read_port_line,
    summary_ms,
)

TITLE = (
    "MCP tool calls: a run with one MCP READ call vs a built-in tool; pooled vs per-call session"
)
NAME = "mcp_call"
SEARCH = "tickets__search_tickets"
SEARCH_ARGUMENTS = '{"query": "vpn"}'
CALC_ARGUMENTS = '{"expression": "6 * 7"}'


async def _wait_listening(port: int, process: Process, within: float = 30.0) -> None:
    deadline = time.monotonic() + within
    while True:
        if not process.alive():
            raise RuntimeError(f"the MCP server exited:\n{process.log_tail()}")
        with contextlib.suppress(OSError):
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.close()
            return
        if time.monotonic() > deadline:
            raise TimeoutError("the MCP server did not listen")
        await asyncio.sleep(0.05)


def _context(run_id: int, model_port: int, *, mcp: McpTool | None) -> RunContext:
    return RunContext(
        run_id=run_id,
        agent_id=1,
        owner_id=1,
        owner_timezone="UTC",
        prompt="bench",
        model=ModelSpec(
            provider="openai",
            model="fake-model",
            base_url=f"http://127.0.0.1:{model_port}/v1",
            api_key_env=FAKE_KEY_ENV,
        ),
        optional_tools=() if mcp else ("calculator",),
        platform_prompt="",
        iteration_cap=4,
        mcp_tools=(mcp,) if mcp else (),
    )


async def _measure(
    fn: Callable[[], Awaitable[Any]], n: int, times: list[float], cpu: list[float]
) -> None:
    for _ in range(n):
        wall, used = time.perf_counter(), time.process_time()
        await fn()
        times.append(time.perf_counter() - wall)
        cpu.append(time.process_time() - used)


async def run(bench: Bench) -> ScenarioResult:
    import os

    os.environ.setdefault(FAKE_KEY_ENV, "bench-key")
    result = ScenarioResult(NAME, TITLE)
    rounds, per_round = (5, 40) if bench.quick else (10, 100)
    env = bench.env(bench.settings(bench.database_url("postgres"), bench.redis_base_url))
    mcp_port = free_port()
    processes = [
        Process(
            python_module_command("agent_engine.testing.mcp_tickets", "--port", str(mcp_port)),
            env=env,
            log_path=bench.work_dir / "mcp-server.log",
        ),
        Process(
            python_module_command(
                "bench._fake_model", "--tool", SEARCH, "--arguments", SEARCH_ARGUMENTS
            ),
            env=env,
            log_path=bench.work_dir / "mcp-model.log",
        ),
        Process(
            python_module_command(
                "bench._fake_model", "--tool", "calculator", "--arguments", CALC_ARGUMENTS
            ),
            env=env,
            log_path=bench.work_dir / "mcp-model-builtin.log",
        ),
    ]
    url = await bench.create_database("mcp_call")
    engine = create_engine_for_url(url, pool_size=2)
    runtime = Runtime(engine, tool_timeout_seconds=10.0)
    try:
        await _wait_listening(mcp_port, processes[0])
        mcp_model = await asyncio.to_thread(read_port_line, processes[1])
        builtin_model = await asyncio.to_thread(read_port_line, processes[2])
        mcp_url = f"http://127.0.0.1:{mcp_port}/mcp"
        tool = McpTool(
            id=1,
            name=SEARCH,
            description="Search the ticket system.",
            input_schema=SEARCH_SCHEMA,
            access="read",
            remote_name="search_tickets",
            source="tickets",
            url=mcp_url,
            auth_env=None,
            auto_approved=False,
        )
        mcp_ctx = _context(1, mcp_model, mcp=tool)
        builtin_ctx = _context(2, builtin_model, mcp=None)
        now = datetime.now(UTC)
        tools_mcp = runtime.toolset(mcp_ctx)
        tools_builtin = runtime.toolset(builtin_ctx)
        tool_ctx = ToolCallContext(
            run_id=1,
            agent_id=1,
            owner_id=1,
            owner_timezone="UTC",
            now=now,
            knowledge=runtime._knowledge,
            engine=engine,
        )
        search_call = ToolCall("c1", SEARCH, SEARCH_ARGUMENTS)
        calc_call = ToolCall("c2", "calculator", CALC_ARGUMENTS)

        async def mcp_run() -> None:
            outcome = await runtime.execute(mcp_ctx, now=now)
            assert outcome.state == "succeeded", outcome

        async def builtin_run() -> None:
            outcome = await runtime.execute(builtin_ctx, now=now)
            assert outcome.state == "succeeded", outcome

        async def mcp_pooled() -> None:
            text, error = await runtime._call_tool(tools_mcp, search_call, tool_ctx)
            assert error is None, text

        async def builtin_call() -> None:
            _, error = await runtime._call_tool(tools_builtin, calc_call, tool_ctx)
            assert error is None

        async def mcp_fresh_session() -> None:
            async with open_session(mcp_url, None, 10.0) as session:
                await session.call_tool("search_tickets", {"query": "vpn"})

        cases = {
            "mcp_run": mcp_run,
            "builtin_run": builtin_run,
            "mcp_pooled": mcp_pooled,
            "builtin_call": builtin_call,
            "mcp_fresh_session": mcp_fresh_session,
        }
        times: dict[str, list[float]] = {name: [] for name in cases}
        cpu: dict[str, list[float]] = {name: [] for name in cases}
        for fn in cases.values():  # warm: connections, the pooled session, prepared paths
            for _ in range(5):
                await fn()
        for _ in range(rounds):
            for name, fn in cases.items():
                await _measure(
                    fn,
                    per_round // 4 if name == "mcp_fresh_session" else per_round,
                    times[name],
                    cpu[name],
                )
    finally:
        await runtime.aclose()
        await engine.dispose()
        for process in processes:
            process.stop()

    def p50(name: str) -> float:
        return summary_ms(times[name])["p50_ms"]

    def cpu_ms(name: str) -> float:
        return sum(cpu[name]) / len(cpu[name]) * 1000

    result.add(
        Row(
            "run with one MCP READ call: latency p50",
            p50("mcp_run"),
            "ms",
            baseline=p50("builtin_run"),
            baseline_label="same run, built-in calculator",
            note="two model calls + one tool call, sequential",
        ),
        Row(
            "run with one MCP READ call: engine CPU per run",
            cpu_ms("mcp_run"),
            "ms",
            baseline=cpu_ms("builtin_run"),
            baseline_label="same run, built-in calculator",
        ),
        Row(
            "added per MCP call over a built-in: latency",
            p50("mcp_pooled") - p50("builtin_call"),
            "ms",
            note=f"MCP p50 {p50('mcp_pooled'):.2f} ms, built-in {p50('builtin_call'):.3f} ms",
        ),
        Row(
            "added per MCP call over a built-in: engine CPU",
            cpu_ms("mcp_pooled") - cpu_ms("builtin_call"),
            "ms",
            note=f"MCP {cpu_ms('mcp_pooled'):.2f} ms, built-in {cpu_ms('builtin_call'):.3f} ms",
        ),
        Row(
            "MCP call, pooled session: latency p50",
            p50("mcp_pooled"),
            "ms",
            baseline=p50("mcp_fresh_session"),
            baseline_label="new session per call (handshake)",
            target="pooled < per-call session",
            ok=p50("mcp_pooled") < p50("mcp_fresh_session"),
        ),
        Row(
            "MCP call, pooled session: engine CPU",
            cpu_ms("mcp_pooled"),
            "ms",
            baseline=cpu_ms("mcp_fresh_session"),
            baseline_label="new session per call (handshake)",
        ),
    )
    result.details = {name: summary_ms(values) for name, values in times.items()}
    result.details["cpu_ms"] = {name: cpu_ms(name) for name in cases}
    return result
