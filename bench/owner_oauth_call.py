"""Calls that carry the owner's own account (issue 39): what an OWNER_OAUTH call costs the worker,
beside a SHARED call to the same server, in the same run of this benchmark.

The MCP ticket server (`agent_engine.testing.mcp_tickets`) and the model (`bench._fake_model`,
scripted to make one tool call, then answer) run in processes of their own, so this process's CPU
time is the engine's alone. Measured here, interleaved in rounds, with the engine's `Runtime`:

- one tool call as a run makes it (`Runtime._call_tool`, the handler resolving the authority):
  SHARED -- the source's credential from its variable; OWNER_OAUTH -- the owner's token, read
  from `tool_connections` and decrypted (AES-GCM) by `oauth.access.owner_access_token`, the call
  made on that owner's pooled session;
- a whole run with that one call (model call, tool call, model call), each way.

The pool must not cost a handshake per OWNER_OAUTH call: the sessions opened are counted.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import text

from agent_engine.db import connections as connections_db
from agent_engine.db.engine import create_engine_for_url
from agent_engine.embedded import free_port
from agent_engine.oauth.keys import ENV as TOKEN_KEYS_ENV
from agent_engine.oauth.keys import TokenKeys, new_key
from agent_engine.oauth.store import access_purpose
from agent_engine.runtime.context import ModelSpec, RunContext
from agent_engine.runtime.loop import Runtime
from agent_engine.runtime.providers.base import ToolCall
from agent_engine.runtime.tools.spec import McpTool, ToolCallContext
from agent_engine.testing.mcp_tickets import SEARCH_SCHEMA
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
from bench.mcp_call import _wait_listening

TITLE = "OWNER_OAUTH vs SHARED MCP calls: the owner's token per call, pooled per (owner, server)"
NAME = "owner_oauth_call"
SEARCH = "tickets__search_tickets"
SEARCH_ARGUMENTS = '{"query": "vpn"}'
SHARED_ENV = "BENCH_TICKETS_TOKEN"
# The target: CPU per OWNER_OAUTH call <= 1.2 x a SHARED call.
TARGET_RATIO = 1.2


def _tool(url: str, *, auth: str, source_id: int | None) -> McpTool:
    return McpTool(
        id=1,
        name=SEARCH,
        description="Search the ticket system.",
        input_schema=SEARCH_SCHEMA,
        access="read",
        remote_name="search_tickets",
        source="tickets",
        url=url,
        auth_env=SHARED_ENV if auth == "shared" else None,
        auto_approved=False,
        auth=auth,
        source_id=source_id,
    )


def _context(run_id: int, owner_id: int, model_port: int, tool: McpTool) -> RunContext:
    return RunContext(
        run_id=run_id,
        agent_id=1,
        owner_id=owner_id,
        owner_timezone="UTC",
        prompt="bench",
        model=ModelSpec(
            provider="openai",
            model="fake-model",
            base_url=f"http://127.0.0.1:{model_port}/v1",
            api_key_env=FAKE_KEY_ENV,
        ),
        optional_tools=(),
        platform_prompt="",
        iteration_cap=4,
        mcp_tools=(tool,),
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
    os.environ.setdefault(FAKE_KEY_ENV, "bench-key")
    os.environ[SHARED_ENV] = "bench-shared-credential"
    os.environ[TOKEN_KEYS_ENV] = os.environ.get(TOKEN_KEYS_ENV) or new_key()
    keys = TokenKeys.from_env()
    result = ScenarioResult(NAME, TITLE)
    rounds, per_round = (5, 40) if bench.quick else (10, 100)
    env = bench.env(bench.settings(bench.database_url("postgres"), bench.redis_base_url))
    mcp_port = free_port()
    processes = [
        Process(
            python_module_command("agent_engine.testing.mcp_tickets", "--port", str(mcp_port)),
            env=env,
            log_path=bench.work_dir / "oauth-mcp-server.log",
        ),
        Process(
            python_module_command(
                "bench._fake_model", "--tool", SEARCH, "--arguments", SEARCH_ARGUMENTS
            ),
            env=env,
            log_path=bench.work_dir / "oauth-model.log",
        ),
    ]
    url = await bench.create_database(NAME)
    engine = create_engine_for_url(url, pool_size=2)
    runtime = Runtime(engine, tool_timeout_seconds=10.0)
    try:
        await _wait_listening(mcp_port, processes[0])
        model_port = await asyncio.to_thread(read_port_line, processes[1])
        mcp_url = f"http://127.0.0.1:{mcp_port}/mcp"
        # The owner, the OWNER_OAUTH source and the owner's connection, as the callback leaves
        # them (the token encrypted under AGENT_ENGINE_TOKEN_KEYS).
        async with engine.begin() as conn:
            owner_id = (
                await conn.execute(
                    text("INSERT INTO users (email) VALUES ('bench@example.com') RETURNING id")
                )
            ).scalar_one()
            source_id = (
                await conn.execute(
                    text(
                        "INSERT INTO tool_sources (name, url, auth) VALUES"
                        " ('tickets', :url, 'owner_oauth') RETURNING id"
                    ),
                    {"url": mcp_url},
                )
            ).scalar_one()
            await connections_db.save_connected(
                conn,
                owner_id=owner_id,
                source_id=source_id,
                account="bench@tickets",
                scopes=[],
                access=keys.encrypt("bench-owner-token", access_purpose(owner_id, source_id)),
                refresh=None,
                expires_at=None,
            )
        shared = _tool(mcp_url, auth="shared", source_id=None)
        owned = _tool(mcp_url, auth="owner_oauth", source_id=source_id)
        shared_ctx = _context(1, owner_id, model_port, shared)
        owned_ctx = _context(2, owner_id, model_port, owned)
        now = datetime.now(UTC)
        shared_tools = runtime.toolset(shared_ctx)
        owned_tools = runtime.toolset(owned_ctx)
        tool_ctx = ToolCallContext(
            run_id=1,
            agent_id=1,
            owner_id=owner_id,
            owner_timezone="UTC",
            now=now,
            knowledge=runtime._knowledge,
            engine=engine,
        )
        call = ToolCall("c1", SEARCH, SEARCH_ARGUMENTS)

        async def shared_call() -> None:
            text_, error = await runtime._call_tool(shared_tools, call, tool_ctx)
            assert error is None, text_

        async def owned_call() -> None:
            text_, error = await runtime._call_tool(owned_tools, call, tool_ctx)
            assert error is None, text_

        async def shared_run() -> None:
            outcome = await runtime.execute(shared_ctx, now=now)
            assert outcome.state == "succeeded", outcome

        async def owned_run() -> None:
            outcome = await runtime.execute(owned_ctx, now=now)
            assert outcome.state == "succeeded", outcome

        cases = {
            "shared_call": shared_call,
            "owner_oauth_call": owned_call,
            "shared_run": shared_run,
            "owner_oauth_run": owned_run,
        }
        times: dict[str, list[float]] = {name: [] for name in cases}
        cpu: dict[str, list[float]] = {name: [] for name in cases}
        for fn in cases.values():  # warm: connections, the pooled sessions, prepared paths
            for _ in range(5):
                await fn()
        sessions_before = runtime.mcp_sessions.opened
        for _ in range(rounds):
            for name, fn in cases.items():
                await _measure(fn, per_round, times[name], cpu[name])
        sessions_after = runtime.mcp_sessions.opened
    finally:
        await runtime.aclose()
        await engine.dispose()
        for process in processes:
            process.stop()

    def p50(name: str) -> float:
        return summary_ms(times[name])["p50_ms"]

    def cpu_ms(name: str) -> float:
        return sum(cpu[name]) / len(cpu[name]) * 1000

    ratio = cpu_ms("owner_oauth_call") / cpu_ms("shared_call")
    result.add(
        Row(
            "OWNER_OAUTH call: engine CPU per call",
            cpu_ms("owner_oauth_call"),
            "ms",
            baseline=cpu_ms("shared_call"),
            baseline_label="SHARED call, same server, interleaved",
            target=f"<= {TARGET_RATIO} x SHARED",
            ok=ratio <= TARGET_RATIO,
            note="one read per call (last_used_at to the minute); pooled session per owner",
        ),
        Row(
            "OWNER_OAUTH call: latency p50",
            p50("owner_oauth_call"),
            "ms",
            baseline=p50("shared_call"),
            baseline_label="SHARED call",
        ),
        Row(
            "run with one OWNER_OAUTH call: engine CPU per run",
            cpu_ms("owner_oauth_run"),
            "ms",
            baseline=cpu_ms("shared_run"),
            baseline_label="same run, SHARED",
        ),
        Row(
            "sessions opened while measured",
            sessions_after - sessions_before,
            "sessions",
            target="0 (no handshake per call)",
            ok=sessions_after == sessions_before,
            note=f"{rounds * per_round * 2} OWNER_OAUTH calls and runs",
        ),
    )
    result.details = {name: summary_ms(values) for name, values in times.items()}
    result.details["cpu_ms"] = {name: cpu_ms(name) for name in cases}
    return result
