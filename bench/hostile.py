"""Scenario - hostile remotes (issue 38): what a tool server sending too much costs the api and a
worker, and the runs of everyone else.

Real processes: the api (bench/_api_server.py), one `agent-engine worker`, and (in the hostile
phase) `agent-engine clock` re-syncing every source every few seconds; the remotes in two
processes of their own (bench/_hostile_servers.py): a fake model answering normal runs after
MODEL_DELAY, and hostile MCP servers -- a listing of 100k tools sent chunked, a 50 MB result as
SSE, an SSE result that never ends.

Quiet phase: normal agents (no tools) run one after another; the model call steps' durations (from
the journal) are the baseline. Hostile phase: the same normal runs, while the admin syncs the 100k
listing through the API (several at once), runs call the 50 MB and the endless tools (several at
once), and the clock's periodic sync lists the hostile source on the worker. RSS of the api and of
the worker processes is sampled throughout (the listing children a sync starts are reported apart:
they are the isolation, and they end with the sync).

Targets (issue 38): the api's and the worker's RSS stay within 150 MiB of idle; p99 of the normal
runs' model steps stays within 2x its quiet value.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from typing import Any

import asyncpg
import httpx
import psutil

from agent_engine.api.auth import mint_token
from bench.common import (
    FAKE_KEY_ENV,
    JWT_SECRET,
    Bench,
    Process,
    Row,
    ScenarioResult,
    agent_engine_command,
    percentile,
    python_module_command,
    read_port_line,
)

TITLE = "Hostile remotes: 100k-tool listings, 50 MB and endless results vs api/worker RSS, p99"
NAME = "hostile"
MODEL_DELAY_SECONDS = 0.1
NORMAL_AGENTS = 4
HOSTILE_RUNS_EACH = 4  # runs calling the 50 MB tool, and as many the endless one, at once
SYNCS_AT_ONCE = 3
SAMPLE_SECONDS = 0.05
TARGET_RSS_GROWTH_MIB = 150.0
TARGET_P99_RATIO = 2.0
WORKER_THREADS = 8
ADMIN_ID = 1
OWNER_ID = 2
LISTING_CHILD = "agent_engine.tool_sources.listing"
# Which hostile cases run (a profile of one at a time): syncs through the API, runs calling the
# big and endless tools, the clock's periodic re-sync on the worker.
CASES = frozenset(os.environ.get("BENCH_HOSTILE_CASES", "syncs,runs,clock").split(","))

UPSERT = (
    "mutation($input: ToolSourceInput!)"
    " { upsertToolSource(input: $input) { id lastError tools { id name } } }"
)
SYNC = "mutation($id: ID!) { syncToolSource(id: $id) { id lastError } }"
ALLOW = "mutation($id: ID!) { setToolAllowed(toolId: $id, allowed: true) { id } }"
ATTACH = "mutation($agent: ID!, $tool: ID!) { attachTool(agentId: $agent, toolId: $tool) { id } }"
START = "mutation($id: ID!) { startRun(agentId: $id) { id } }"


def sizes(quick: bool) -> tuple[float, float]:
    """(seconds of the quiet phase, seconds of the hostile phase)."""
    return (12.0, 25.0) if quick else (30.0, 60.0)


class Sampler:
    """Peak RSS of the api process, of the worker's processes (together), and of any listing
    child, every SAMPLE_SECONDS."""

    def __init__(self, api: psutil.Process, worker: psutil.Process) -> None:
        self.api, self.worker = api, worker
        self.peak = {"api": 0, "worker": 0, "listing": 0}

    def sample(self) -> dict[str, int]:
        now = {"api": _rss(self.api), "worker": _rss(self.worker), "listing": 0}
        for root, key in ((self.api, "api"), (self.worker, "worker")):
            with contextlib.suppress(psutil.Error):
                for child in root.children(recursive=True):
                    with contextlib.suppress(psutil.Error):
                        rss = child.memory_info().rss
                        if LISTING_CHILD in " ".join(child.cmdline()):
                            now["listing"] = max(now["listing"], rss)
                        elif key == "worker":
                            now["worker"] += rss
        for key, value in now.items():
            self.peak[key] = max(self.peak[key], value)
        return now

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            self.sample()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), SAMPLE_SECONDS)


def _rss(process: psutil.Process) -> int:
    with contextlib.suppress(psutil.Error):
        return int(process.memory_info().rss)
    return 0


class Api:
    def __init__(self, client: httpx.AsyncClient) -> None:
        self.client = client

    async def data(
        self, query: str, variables: dict[str, Any], *, user: int, admin: bool = False
    ) -> Any:
        token = mint_token(JWT_SECRET, user_id=user, admin=admin)
        response = await self.client.post(
            "/graphql",
            json={"query": query, "variables": variables},
            headers={"Authorization": f"Bearer {token}"},
            timeout=120,
        )
        body = response.json()
        if body.get("errors"):
            raise RuntimeError(f"{query[:40]}: {body['errors']}")
        return body["data"]


async def seed(conn: asyncpg.Pool, model_port: int) -> None:
    await conn.execute(
        f"""
        INSERT INTO users (id, email) VALUES ({ADMIN_ID}, 'admin@example.com'),
                                             ({OWNER_ID}, 'o@example.com');
        INSERT INTO agent_models (id, name, provider, model, base_url, api_key_env)
        VALUES (1, 'Fake', 'openai', 'fake-model', 'http://127.0.0.1:{model_port}/v1',
                '{FAKE_KEY_ENV}');
        INSERT INTO agents (user_id, name, prompt, model_id)
        SELECT {OWNER_ID}, 'agent-' || n, 'p', 1 FROM generate_series(1, 64) AS n;
        """
    )


async def normal_runs(
    api: Api, conn: asyncpg.Pool, agent_id: int, stop: asyncio.Event, runs: list[int]
) -> None:
    """Runs of one normal agent, one after another, until `stop`."""
    while not stop.is_set():
        started = await api.data(START, {"id": str(agent_id)}, user=OWNER_ID)
        run_id = int(started["startRun"]["id"])
        while await conn.fetchval(
            "SELECT state IN ('queued', 'running') FROM agent_runs WHERE id = $1", run_id
        ):
            await asyncio.sleep(0.02)
        runs.append(run_id)


async def step_seconds(conn: asyncpg.Pool, runs: list[int]) -> list[float]:
    rows = await conn.fetch(
        "SELECT extract(epoch FROM finished_at - started_at) AS s FROM agent_run_steps"
        " WHERE run_id = ANY($1::bigint[]) AND kind = 'model_call' AND finished_at IS NOT NULL",
        runs,
    )
    return [float(r["s"]) for r in rows]


async def phase(
    api: Api, conn: asyncpg.Pool, seconds: float, hostile: Any = None
) -> tuple[list[float], dict[str, Any]]:
    stop = asyncio.Event()
    runs: list[int] = []
    loops = [
        asyncio.create_task(normal_runs(api, conn, agent_id, stop, runs))
        for agent_id in range(1, NORMAL_AGENTS + 1)
    ]
    outcome: dict[str, Any] = {}
    started = time.monotonic()
    if hostile is not None:
        outcome = await hostile()
    await asyncio.sleep(max(seconds - (time.monotonic() - started), 0))
    stop.set()
    await asyncio.gather(*loops)
    return await step_seconds(conn, runs), outcome


async def run(bench: Bench) -> ScenarioResult:
    result = ScenarioResult(NAME, TITLE)
    quiet_seconds, hostile_seconds = sizes(bench.quick)
    url = await bench.create_database("hostile")
    settings = bench.settings(url, bench.redis_url(), tool_source_sync_seconds=3.0)
    env = bench.env(settings)
    remotes = [
        Process(
            python_module_command(
                "bench._hostile_servers", "--role", role, "--delay", str(MODEL_DELAY_SECONDS)
            ),
            env=env,
            log_path=bench.work_dir / f"hostile-{role}.log",
        )
        for role in ("model", "mcp")
    ]
    processes: list[Process] = [*remotes]
    conn = await asyncpg.create_pool(url, min_size=2, max_size=16)
    try:
        ports: dict[str, int] = {}
        for process in remotes:
            ports.update(await asyncio.to_thread(_read_ports, process))
        await seed(conn, ports["model"])
        api_process = Process(
            python_module_command("bench._api_server"),
            env=env,
            log_path=bench.work_dir / "hostile-api.log",
        )
        worker_process = Process(
            agent_engine_command("worker", "--processes", "1", "--threads", str(WORKER_THREADS)),
            env=env,
            log_path=bench.work_dir / "hostile-worker.log",
        )
        processes += [api_process, worker_process]
        api_port = await asyncio.to_thread(read_port_line, api_process)
        sampler = Sampler(psutil.Process(api_process.pid), psutil.Process(worker_process.pid))
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{api_port}") as client:
            api = Api(client)
            # Warm: every normal agent ran once (the worker's imports, pools, the model client).
            await phase(api, conn, 0.0)
            tools = await register(api, ports)
            idle = sampler.sample()
            stop_sampling = asyncio.Event()
            sampling = asyncio.create_task(sampler.run(stop_sampling))
            quiet, _ = await phase(api, conn, quiet_seconds)
            quiet_peak = dict(sampler.peak)
            sampler.peak = {"api": 0, "worker": 0, "listing": 0}
            clock = Process(
                agent_engine_command("clock"),
                env=env,
                log_path=bench.work_dir / "hostile-clock.log",
            )
            if "clock" in CASES:
                processes.append(clock)
            else:
                clock.stop()

            async def hostile() -> dict[str, Any]:
                return await hostile_cases(api, conn, tools)

            loud, outcome = await phase(api, conn, hostile_seconds, hostile)
            stop_sampling.set()
            await sampling
    finally:
        await conn.close()
        for process in reversed(processes):
            process.stop()
    report(result, idle, quiet_peak, sampler.peak, quiet, loud, outcome)
    return result


def _read_ports(process: Process) -> dict[str, int]:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if not process.alive():
            raise RuntimeError(f"the remotes exited:\n{process.log_tail()}")
        for line in process.log_path.read_text(errors="replace").splitlines():
            if line.startswith("PORTS "):
                ports: dict[str, int] = json.loads(line[len("PORTS ") :])
                return ports
        time.sleep(0.05)
    raise TimeoutError("the remotes did not report their ports")


async def register(api: Api, ports: dict[str, int]) -> dict[str, str]:
    """The three sources (the listing one fails its first sync: that is the case); the tools of
    `big` and `endless` allowed and attached to the hostile agents. Returns the source ids."""
    ids: dict[str, str] = {}
    hostile_agents = iter(range(NORMAL_AGENTS + 1, NORMAL_AGENTS + 1 + 2 * HOSTILE_RUNS_EACH))
    for name in ("big", "endless", "listing"):
        data = await api.data(
            UPSERT,
            {"input": {"name": name, "url": f"http://127.0.0.1:{ports[name]}/mcp"}},
            user=ADMIN_ID,
            admin=True,
        )
        source = data["upsertToolSource"]
        ids[name] = source["id"]
        if name == "listing":
            continue
        tool_id = source["tools"][0]["id"]
        await api.data(ALLOW, {"id": tool_id}, user=ADMIN_ID, admin=True)
        for _ in range(HOSTILE_RUNS_EACH):
            agent = next(hostile_agents)
            await api.data(ATTACH, {"agent": str(agent), "tool": tool_id}, user=OWNER_ID)
    return ids


async def hostile_cases(api: Api, conn: asyncpg.Pool, sources: dict[str, str]) -> dict[str, Any]:
    """Syncs of the 100k listing through the API and runs calling the 50 MB and endless tools,
    all at once; what each ended with."""
    started = time.monotonic()

    async def sync() -> str:
        data = await api.data(SYNC, {"id": sources["listing"]}, user=ADMIN_ID, admin=True)
        return str(data["syncToolSource"]["lastError"])

    async def hostile_run(agent_id: int) -> tuple[str, str]:
        data = await api.data(START, {"id": str(agent_id)}, user=OWNER_ID)
        run_id = int(data["startRun"]["id"])
        while True:
            row = await conn.fetchrow("SELECT state, error FROM agent_runs WHERE id = $1", run_id)
            if row is not None and row["state"] not in ("queued", "running"):
                return str(row["state"]), str(row["error"])
            await asyncio.sleep(0.05)

    first = NORMAL_AGENTS + 1
    syncs = SYNCS_AT_ONCE if "syncs" in CASES else 0
    runs = 2 * HOSTILE_RUNS_EACH if "runs" in CASES else 0
    outcomes = await asyncio.gather(
        *(sync() for _ in range(syncs)),
        *(hostile_run(a) for a in range(first, first + runs)),
    )
    return {"seconds": time.monotonic() - started, "outcomes": sorted({str(o) for o in outcomes})}


def report(
    result: ScenarioResult,
    idle: dict[str, int],
    quiet_peak: dict[str, int],
    peak: dict[str, int],
    quiet: list[float],
    loud: list[float],
    outcome: dict[str, Any],
) -> None:
    mib = 2**20
    for key, what in (("api", "api RSS"), ("worker", "worker RSS (its processes)")):
        growth = (peak[key] - idle[key]) / mib
        result.add(
            Row(
                f"{what}: peak - idle, hostile cases",
                growth,
                "MiB",
                baseline=idle[key] / mib,
                baseline_label="idle MiB",
                target=f"≤ {TARGET_RSS_GROWTH_MIB:.0f} MiB",
                ok=growth <= TARGET_RSS_GROWTH_MIB,
                note=f"quiet peak {quiet_peak[key] / mib:.0f} MiB",
            )
        )
    result.add(
        Row(
            "listing child RSS (peak)",
            peak["listing"] / mib,
            "MiB",
            note="the sync's own process, ended with the sync (not in the rows above)",
        )
    )
    quiet_p99 = percentile(quiet, 99) * 1000
    loud_p99 = percentile(loud, 99) * 1000
    ratio = loud_p99 / quiet_p99 if quiet_p99 else None
    result.add(
        Row(
            "normal runs' model step p99, hostile cases",
            loud_p99,
            "ms",
            baseline=quiet_p99,
            baseline_label="quiet",
            target=f"ratio ≤ {TARGET_P99_RATIO:g}",
            ok=ratio is not None and ratio <= TARGET_P99_RATIO,
            note=f"{len(loud)} steps (quiet {len(quiet)}); model delay {MODEL_DELAY_SECONDS} s;"
            f" hostile cases ended in {outcome.get('seconds', 0):.1f} s",
        )
    )
    result.details.update(
        {
            "idle_rss": idle,
            "quiet_peak_rss": quiet_peak,
            "hostile_peak_rss": peak,
            "quiet_p50_ms": percentile(quiet, 50) * 1000,
            "hostile_p50_ms": percentile(loud, 50) * 1000,
            "outcomes": outcome.get("outcomes"),
            "cases": sorted(CASES),
            "slowest_hostile_ms": sorted(round(s * 1000) for s in loud)[-10:],
        }
    )
