"""The API under uvicorn for the GraphQL page scenario, plus two bench-only routes.

`python -m bench._api_server` loads Settings from the environment (like `agent-engine serve`),
builds `create_app(settings, engine=engine)` and prints `PORT <n>` once serving. Bench routes,
answered before the app sees the request:

- `GET /_bench/statements`: SQL statements the app's engine executed since the last call, and
  the seconds the process spent in Python's garbage collector meanwhile (`gc_seconds`).
- `GET /_bench/baseline?owner=<id>`: the same page's data fetched with raw asyncpg (one pooled
  connection, sequential statements) and serialised with json.dumps: the baseline.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import socket
import time
from datetime import UTC, datetime
from typing import Any

import asyncpg
import uvicorn
from sqlalchemy import event
from starlette.types import Receive, Scope, Send

from agent_engine.api.app import create_app
from agent_engine.collector import tune_gc
from agent_engine.db.engine import create_engine
from agent_engine.domain.budget import week_window
from agent_engine.settings import load_settings, to_libpq_url

_AGENTS = "SELECT id, model_id, next_run_at FROM agents WHERE user_id = $1 ORDER BY id"
_MODELS = "SELECT id FROM agent_models WHERE id = ANY($1::bigint[])"
_TOOLS = (
    "SELECT at.agent_id, t.id FROM agent_tools at JOIN tools t ON t.id = at.tool_id"
    " WHERE at.agent_id = ANY($1::bigint[]) ORDER BY t.name"
)
_LAST = (
    "SELECT r.agent_id, r.id FROM unnest($1::bigint[]) AS a(id)"
    " CROSS JOIN LATERAL (SELECT agent_id, id FROM agent_runs"
    "   WHERE agent_id = a.id AND state IN ('succeeded', 'failed', 'skipped')"
    "   ORDER BY id DESC LIMIT 1) AS r"
)
_ACTIVE = (
    "SELECT agent_id, id FROM agent_runs WHERE agent_id = ANY($1::bigint[])"
    " AND state IN ('queued', 'running')"
)
_SETTINGS = "SELECT key, value FROM platform_settings"
_SPENT = (
    "SELECT COALESCE(SUM(r.tokens_used), 0) FROM agents a JOIN agent_runs r ON r.agent_id = a.id"
    " WHERE a.user_id = $1 AND r.finished_at >= $2 AND r.finished_at < $3"
)


class BenchApp:
    def __init__(self, app: Any, dsn: str) -> None:
        self.app = app
        self.dsn = dsn
        self.statements = 0
        self.gc_seconds = 0.0
        self._gc_started = 0.0
        self.pool: asyncpg.Pool | None = None
        gc.callbacks.append(self._gc)

    def _gc(self, phase: str, _info: dict[str, Any]) -> None:
        if phase == "start":
            self._gc_started = time.perf_counter()
        else:
            self.gc_seconds += time.perf_counter() - self._gc_started

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "") if scope["type"] == "http" else ""
        if path == "/_bench/statements":
            count, self.statements = self.statements, 0
            spent, self.gc_seconds = self.gc_seconds, 0.0
            await _json(send, {"statements": count, "gc_seconds": spent})
            return
        if path == "/_bench/baseline":
            query = scope.get("query_string", b"").decode()
            owner = int(query.split("owner=", 1)[1].split("&", 1)[0])
            body = await self.baseline(owner)
            await _raw(send, body)
            return
        await self.app(scope, receive, send)

    async def baseline(self, owner: int) -> bytes:
        if self.pool is None:
            self.pool = await asyncpg.create_pool(self.dsn, min_size=10, max_size=20)
        async with self.pool.acquire() as conn:
            agents = await conn.fetch(_AGENTS, owner)
            ids = [a["id"] for a in agents]
            models = {r["id"] for r in await conn.fetch(_MODELS, [a["model_id"] for a in agents])}
            tools: dict[int, list[dict[str, str]]] = {i: [] for i in ids}
            for r in await conn.fetch(_TOOLS, ids):
                tools[r["agent_id"]].append({"id": str(r["id"])})
            last = {r["agent_id"]: r["id"] for r in await conn.fetch(_LAST, ids)}
            active = {r["agent_id"]: r["id"] for r in await conn.fetch(_ACTIVE, ids)}
            settings = {r["key"]: r["value"] for r in await conn.fetch(_SETTINGS)}
            zone = json.loads(settings["timezone"]) if "timezone" in settings else "UTC"
            window = week_window(datetime.now(UTC), __import__("zoneinfo").ZoneInfo(zone))
            used = await conn.fetchval(_SPENT, owner, window.start, window.end)
        page = {
            "data": {
                "viewer": {
                    "agents": [
                        {
                            "model": {"id": str(a["model_id"])}
                            if a["model_id"] in models
                            else None,
                            "tools": tools[a["id"]],
                            "lastRun": {"id": str(last[a["id"]])} if a["id"] in last else None,
                            "activeRun": {"id": str(active[a["id"]])}
                            if a["id"] in active
                            else None,
                            "nextRunAt": a["next_run_at"].isoformat() if a["next_run_at"] else None,
                        }
                        for a in agents
                    ],
                    "budget": {"usedTokens": int(used)},
                }
            }
        }
        return json.dumps(page).encode()


async def _json(send: Send, value: Any) -> None:
    await _raw(send, json.dumps(value).encode())


async def _raw(send: Send, body: bytes) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", b"application/json")],
        }
    )
    await send({"type": "http.response.body", "body": body})


def main() -> None:
    settings = load_settings()
    # As the api process (api/app.py).
    engine = create_engine(settings, pre_ping=True, keep_connections=True, lifo=True)

    def count(*_: Any) -> None:
        wrapped.statements += 1

    event.listen(engine.sync_engine, "before_cursor_execute", count)
    wrapped = BenchApp(
        create_app(settings, engine=engine), to_libpq_url(settings.require_database_url())
    )
    tune_gc()  # as `agent-engine serve`
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    # As `agent-engine serve` (uvicorn.run): uvloop when installed; BENCH_API_LOOP=asyncio for the
    # standard loop (the earlier fanout runs used it).
    loop = os.environ.get("BENCH_API_LOOP", "auto")
    config = uvicorn.Config(
        wrapped, log_level="warning", access_log=False, lifespan="on", loop=loop
    )
    server = uvicorn.Server(config)

    async def serve() -> None:
        task = asyncio.create_task(server.serve(sockets=[sock]))
        while not server.started:
            await asyncio.sleep(0.01)
        print(f"PORT {port}", flush=True)
        await task

    with asyncio.Runner(loop_factory=config.get_loop_factory()) as runner:
        runner.run(serve())


if __name__ == "__main__":
    main()
