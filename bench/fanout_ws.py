"""Scenario 5 over real WebSockets: `runEvents` dashboards on one and on two api processes.

`subscription { runEvents { previousState run { id state } } }` over graphql-transport-ws at
`/graphql` (token in the `connection_init` payload) against bench/_api_server.py (uvicorn, the
real `create_app`; uvloop like `agent-engine serve`, or the standard loop with
BENCH_API_LOOP=asyncio). Subscribers are spread over client processes (multiprocessing), each
holding many `websockets` connections on one event loop; RLIMIT_NOFILE is raised everywhere. A
thread of the runner commits state changes (queued -> running) with asyncpg at a steady rate and
records when each commit returned; latency = client receive time - commit time (same clock).
Every subscriber must receive every change, in commit order.

Rows: opening 5,000 subscriptions; 1,000 dashboards of the changing owner at 20
changes/s (latency) and at 100 changes/s (deliveries/s); 100 admin dashboards with the changes
spread over 1,000 owners (20/s); the 100/s run again with the same subscribers split over two
api processes; full mode adds 5,000 subscribers at 100/s. Issue 23 adds runSteps: 1,000
`subscription { runSteps(runId: …) { index finishedAt } }` of one running run while the runner
writes its transcript (a step inserted, then finished: 200 changes at 20/s), with the api's
database statements counted (`/_bench/statements`) per step change. Baseline, in the same run and
on the same NOTIFYs: a raw asyncpg LISTEN connection in the runner. Memory: the api process's RSS
before and after N connect/init/subscribe/complete/close cycles (after a warm-up). Client and
server CPU are reported: the machine has 2 cores shared by the servers, the clients and PostgreSQL.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import multiprocessing
import multiprocessing.connection
import os
import resource
import time
import urllib.request
from array import array
from dataclasses import dataclass
from typing import Any

import asyncpg
import psutil

from agent_engine.api.auth import mint_token
from bench.common import (
    JWT_SECRET,
    Bench,
    Process,
    Row,
    ScenarioResult,
    memory_growth_row,
    percentile,
    profiled,
    python_module_command,
    read_port_line,
)

# The same data and the same 100 changes/s as the in-process `fanout` scenario.
from bench.fanout import CHANGE_INTERVAL_SECONDS, OWNER_ID, commit_changes, seed, seed_owners

TITLE = "Run-event fan-out over WebSocket: runEvents dashboards on one and two api processes"
NAME = "fanout_ws"
CHANGES = 200
SUBSCRIBERS_PER_CLIENT = 1_000
MIN_CLIENTS = 2
OPEN_CONCURRENCY = 32  # connection handshakes in flight per client process
CYCLE_CONCURRENCY = 8  # connect/disconnect loops per client process
TARGET_P99_MS = 250.0
TARGET_DELIVERIES_PER_SECOND = 25_000
TARGET_OPEN_SECONDS = 5.0
SLOW_INTERVAL_SECONDS = 0.05  # 20 changes/s: the latency target's rate
OPEN_MANY = 5_000
ADMIN_ID = 999_999
ADMIN_OWNERS = 1_000
ADMIN_DASHBOARDS = 100
ADMIN_CHANGES_QUICK = 200  # full mode: one change per owner
QUICK_DEADLINE_SECONDS = 15.0  # keeps `make bench` near two minutes
FULL_DEADLINE_SECONDS = {1_000: 120.0, 5_000: 360.0}
LOOP_ENV = "BENCH_API_LOOP"
METRICS_POLL_SECONDS = 0.5
NOFILE_WANTED = 65_536
QUERY = "subscription { runEvents { previousState run { id state } } }"
STEPS_QUERY = 'subscription {{ runSteps(runId: "{run_id}") {{ index finishedAt }} }}'
TARGET_STATEMENTS_PER_STEP_CHANGE = 2.0
SUBPROTOCOL = "graphql-transport-ws"
METRIC = "agent_engine_active_subscriptions"


# --- client processes ---------------------------------------------------------------------


def raise_nofile() -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = NOFILE_WANTED if hard == resource.RLIM_INFINITY else min(NOFILE_WANTED, hard)
    if soft < wanted:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


class _Sink:
    """One subscriber's receive times, by the position of its run in commit order."""

    def __init__(self, positions: dict[int, int]) -> None:
        self.positions = positions
        self.times = array("d", [math.nan]) * len(positions)
        self.received = 0
        self.out_of_order = 0
        self.duplicates = 0
        self.errors: list[str] = []
        self.ended = False  # the stream ended (error, complete, dropped) before the collection
        self._next = 0

    def record(self, run_id: int, at: float) -> None:
        position = self.positions.get(run_id)
        if position is None:
            return
        if not math.isnan(self.times[position]):
            self.duplicates += 1
            return
        self.times[position] = at
        self.received += 1
        if position != self._next:
            self.out_of_order += 1
        self._next = position + 1


async def _open(url: str, token: str, query: str = QUERY) -> Any:
    from websockets.asyncio.client import connect
    from websockets.typing import Subprotocol

    ws = await connect(
        url,
        subprotocols=[Subprotocol(SUBPROTOCOL)],
        compression=None,  # keep the clients cheap; see bench/README.md
        proxy=None,
        open_timeout=60,
        max_queue=None,
        # No client keepalive pings: a saturated server answers them late and the client would
        # drop the connection (in the first full run at 5,000, after 20 s), turning late into lost.
        ping_interval=None,
    )
    await ws.send(
        json.dumps({"type": "connection_init", "payload": {"Authorization": f"Bearer {token}"}})
    )
    ack = json.loads(await ws.recv())
    if ack.get("type") != "connection_ack":
        await ws.close()
        raise RuntimeError(f"not acknowledged: {ack}")
    await ws.send(json.dumps({"id": "1", "type": "subscribe", "payload": {"query": query}}))
    return ws


async def _read(ws: Any, sink: _Sink, done: asyncio.Event, expected: int) -> None:
    loads, now = json.loads, time.time
    try:
        async for raw in ws:
            at = now()
            message = loads(raw)
            kind = message.get("type")
            if kind == "next":
                payload = message["payload"]
                if payload.get("errors"):
                    sink.errors.append(str(payload["errors"])[:200])
                    continue
                data = payload["data"]
                if "runEvents" in data:
                    sink.record(int(data["runEvents"]["run"]["id"]), at)
                else:  # runSteps: change 2 * index (started), 2 * index + 1 (finished)
                    step = data["runSteps"]
                    sink.record(2 * int(step["index"]) + (step["finishedAt"] is not None), at)
                if sink.received == expected:
                    done.set()
            elif kind == "ping":
                await ws.send('{"type":"pong"}')
            elif kind in ("error", "complete"):
                sink.errors.append(str(message)[:200])
                sink.ended = True
                return
        sink.ended = True
    except Exception as exc:  # the connection dropped: what was not received is lost
        sink.errors.append(f"{type(exc).__name__}: {exc}"[:200])
        sink.ended = True


async def _subscribe_many(
    url: str, token: str, count: int, run_ids: list[int], query: str
) -> tuple[list[Any], list[_Sink], list[asyncio.Task[None]], list[asyncio.Event], list[str]]:
    positions = {run_id: index for index, run_id in enumerate(run_ids)}
    gate = asyncio.Semaphore(OPEN_CONCURRENCY)
    sockets: list[Any] = []
    sinks: list[_Sink] = []
    tasks: list[asyncio.Task[None]] = []
    dones: list[asyncio.Event] = []
    errors: list[str] = []

    async def one() -> None:
        async with gate:
            try:
                ws = await _open(url, token, query)
            except Exception as exc:
                errors.append(f"{type(exc).__name__}: {exc}"[:200])
                return
        sink, done = _Sink(positions), asyncio.Event()
        sockets.append(ws)
        sinks.append(sink)
        dones.append(done)
        tasks.append(asyncio.create_task(_read(ws, sink, done, len(run_ids))))

    await asyncio.gather(*(one() for _ in range(count)))
    return sockets, sinks, tasks, dones, errors


async def _cycles(url: str, token: str, count: int) -> list[str]:
    errors: list[str] = []
    left = [count]

    async def loop() -> None:
        while left[0] > 0:
            left[0] -= 1
            try:
                ws = await _open(url, token)
                await ws.send('{"id":"1","type":"complete"}')
                await ws.close()
            except Exception as exc:
                errors.append(f"{type(exc).__name__}: {exc}"[:200])

    await asyncio.gather(*(loop() for _ in range(CYCLE_CONCURRENCY)))
    return errors


def client_main(pipe: multiprocessing.connection.Connection) -> None:
    """A client process: obeys commands from the runner over `pipe` until ("stop",)."""
    raise_nofile()

    async def serve() -> None:
        state: dict[str, Any] = {}
        while True:
            command = await asyncio.to_thread(pipe.recv)
            kind = command[0]
            if kind == "stop":
                return
            if kind == "cycles":
                url, token, count = command[1:]
                started = time.monotonic()
                errors = await _cycles(url, token, count)
                pipe.send(("cycled", time.monotonic() - started, errors[:5], len(errors)))
            elif kind == "subscribe":
                url, token, count, run_ids, query = command[1:]
                sockets, sinks, tasks, dones, errors = await _subscribe_many(
                    url, token, count, run_ids, query
                )
                state = {"sockets": sockets, "sinks": sinks, "tasks": tasks, "dones": dones}
                pipe.send(("subscribed", len(sockets), errors[:5], len(errors)))
            elif kind == "collect":
                within = command[1]
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(within):
                        await asyncio.gather(*(d.wait() for d in state["dones"]))
                stopped_at = time.time()
                sinks = state["sinks"]
                ended = bytes(1 if s.ended else 0 for s in sinks)
                errors = [e for s in sinks for e in s.errors][:5]  # before we close them
                for ws in state["sockets"]:
                    with contextlib.suppress(Exception):
                        await ws.send('{"id":"1","type":"complete"}')
                await asyncio.gather(
                    *(ws.close() for ws in state["sockets"]), return_exceptions=True
                )
                for task in state["tasks"]:
                    task.cancel()
                await asyncio.gather(*state["tasks"], return_exceptions=True)
                times = array("d")
                for sink in sinks:
                    times.extend(sink.times)
                pipe.send(
                    (
                        "collected",
                        times.tobytes(),
                        ended,
                        stopped_at,
                        sum(s.received for s in sinks),
                        sum(1 for s in sinks if s.out_of_order),
                        sum(s.duplicates for s in sinks),
                        errors,
                    )
                )
                state = {}

    asyncio.run(serve())


class Clients:
    """Client processes (spawned), driven over pipes."""

    def __init__(self, count: int) -> None:
        context = multiprocessing.get_context("spawn")
        self.pipes: list[multiprocessing.connection.Connection] = []
        self.processes: list[Any] = []
        for _ in range(count):
            parent, child = context.Pipe()
            process = context.Process(target=client_main, args=(child,), daemon=True)
            process.start()
            self.pipes.append(parent)
            self.processes.append(process)

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.processes]

    async def ask(self, commands: list[tuple[Any, ...]]) -> list[Any]:
        """One command per client process (the first `len(commands)` processes)."""
        pipes = self.pipes[: len(commands)]
        for pipe, command in zip(pipes, commands, strict=True):
            pipe.send(command)
        return list(await asyncio.gather(*(asyncio.to_thread(p.recv) for p in pipes)))

    def stop(self) -> None:
        for pipe, process in zip(self.pipes, self.processes, strict=True):
            with contextlib.suppress(OSError):
                pipe.send(("stop",))
            process.join(10)
            if process.is_alive():
                process.kill()
                process.join()


def commit_steps(url: str, run_id: int, changes: int, interval: float) -> list[float]:
    """The transcript of `run_id` written as a worker would: step i inserted (change 2i), then
    finished (change 2i + 1), one autocommit every `interval` seconds; returns the wall-clock
    time each commit returned."""

    async def go() -> list[float]:
        conn = await asyncpg.connect(url)
        stamps: list[float] = []
        try:
            next_at = time.monotonic()
            for change in range(changes):
                index = change // 2
                if change % 2 == 0:
                    await conn.execute(
                        "INSERT INTO agent_run_steps (run_id, index, kind, name, started_at)"
                        " VALUES ($1, $2, 'tool_call', 'search_knowledge', clock_timestamp())",
                        run_id,
                        index,
                    )
                else:
                    await conn.execute(
                        "UPDATE agent_run_steps SET finished_at = clock_timestamp(), output = 'ok'"
                        " WHERE run_id = $1 AND index = $2",
                        run_id,
                        index,
                    )
                stamps.append(time.time())
                next_at += interval
                await asyncio.sleep(max(0.0, next_at - time.monotonic()))
        finally:
            await conn.close()
        return stamps

    return asyncio.run(go())


def api_statements(port: int) -> tuple[int, float]:
    """SQL statements the api's engine executed, and its seconds in the garbage collector, since
    the last call (bench/_api_server.py)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/_bench/statements", timeout=30) as r:
        answer = json.loads(r.read())
    return int(answer["statements"]), float(answer["gc_seconds"])


def split(total: int, parts: int) -> list[int]:
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


def cpu_seconds(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            times = psutil.Process(pid).cpu_times()
            total += times.user + times.system
    return total


# --- the runner side ------------------------------------------------------------------------


def active_subscriptions(port: int) -> int:
    """The api's subscription gauge; -1 while it does not answer (busy with a backlog)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
            for line in response.read().decode().splitlines():
                if line.startswith(METRIC + " ") or line.startswith(METRIC + "{"):
                    return int(float(line.rsplit(" ", 1)[1]))
    except OSError:  # includes timeouts
        pass
    return -1


async def wait_active(ports: list[int], count: int, within: float) -> int:
    """Until the api processes' subscriptions add up to `count` (or `within` passed)."""
    deadline = time.monotonic() + within
    while True:
        values = await asyncio.gather(*(asyncio.to_thread(active_subscriptions, p) for p in ports))
        value = -1 if -1 in values else sum(values)
        if value == count or time.monotonic() > deadline:
            return value
        # Each /metrics answer also reads the journal families: poll gently, the api's CPU is
        # measured meanwhile.
        await asyncio.sleep(METRICS_POLL_SECONDS)


@dataclass(frozen=True)
class ApiServer:
    process: Process
    port: int

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/graphql"

    @property
    def pid(self) -> int:
        return self.process.pid


async def open_subscriptions(
    clients: Clients,
    servers: list[ApiServer],
    token: str,
    subscribers: int,
    run_ids: list[int],
    *,
    query: str = QUERY,
    processes: int | None = None,
) -> dict[str, Any]:
    """`subscribers` subscriptions over `processes` client processes, the clients split evenly
    between the api processes; returns when the api processes count them all."""
    used = processes or len(clients.pipes)
    parts = split(subscribers, used)
    opened_at = time.monotonic()
    replies = await clients.ask(
        [
            ("subscribe", servers[i % len(servers)].ws_url, token, n, run_ids, query)
            for i, n in enumerate(parts)
        ]
    )
    opened = sum(r[1] for r in replies)
    active = await wait_active([s.port for s in servers], opened, 120)
    return {
        "opened": opened,
        "active_on_server": active,
        "open_seconds": time.monotonic() - opened_at,
        "open_errors": [e for r in replies for e in r[2]],
        "client_processes": used,
    }


async def fanout(
    url: str,
    clients: Clients,
    servers: list[ApiServer],
    token: str,
    run_ids: list[int],
    subscribers: int,
    *,
    interval: float,
    within: float,
    query: str = QUERY,
    processes: int | None = None,
    steps_run: int | None = None,
) -> dict[str, Any]:
    """`run_ids` are the runs whose state changes (or, with `steps_run`, the change numbers of
    that run's transcript: 2 * index + finished)."""
    opening = await open_subscriptions(
        clients, servers, token, subscribers, run_ids, query=query, processes=processes
    )
    used = opening["client_processes"]
    client_pids = clients.pids[:used]
    server_pids = [s.pid for s in servers]

    # The baseline: a raw LISTEN on the same NOTIFYs, in this (otherwise idle) loop.
    listened: dict[int, float] = {}
    listener = await asyncpg.connect(url)

    def on_notify(_c: Any, _p: int, _ch: str, payload: str) -> None:
        at = time.time()
        listened.setdefault(int(json.loads(payload)["run_id"]), at)

    def on_step(_c: Any, _p: int, _ch: str, payload: str) -> None:
        at = time.time()
        note = json.loads(payload)
        listened.setdefault(2 * int(note["index"]), at)  # its first NOTIFY: the insert

    if steps_run is None:
        await listener.add_listener("agent_run_events", on_notify)
    else:
        await listener.add_listener("agent_run_steps", on_step)
    await asyncio.sleep(0.2)
    for server in servers:  # resets the counts
        await asyncio.to_thread(api_statements, server.port)
    client_cpu = cpu_seconds(client_pids)
    server_cpu = cpu_seconds(server_pids)
    started = time.monotonic()
    try:
        if steps_run is None:
            commits = await asyncio.to_thread(commit_changes, url, run_ids, interval)
        else:
            commits = await asyncio.to_thread(commit_steps, url, steps_run, len(run_ids), interval)
        commit_seconds = time.monotonic() - started
        replies = await clients.ask([("collect", within)] * used)
        wall = time.monotonic() - started
    finally:
        await listener.close()
    counted = [await asyncio.to_thread(api_statements, s.port) for s in servers]
    statements = sum(c[0] for c in counted)
    gc_seconds = sum(c[1] for c in counted)
    client_cpu = cpu_seconds(client_pids) - client_cpu
    server_cpu = cpu_seconds(server_pids) - server_cpu

    # Not received: lost if the subscriber's stream ended (or never opened); late if it was
    # still open at the deadline -- then its latency is at least deadline - commit (a bound).
    latencies: list[float] = []
    bounds: list[float] = []
    lost = late = 0
    changes = len(run_ids)
    last_received = 0.0
    for reply in replies:
        times = array("d")
        times.frombytes(reply[1])
        ended, stopped_at = reply[2], reply[3]
        for index, at in enumerate(times):
            if not math.isnan(at):
                latencies.append(at - commits[index % changes])
                last_received = max(last_received, at)
            elif ended[index // changes]:
                lost += 1
            else:
                late += 1
                bounds.append(stopped_at - commits[index % changes])
    opened = opening["opened"]
    lost += (subscribers - opened) * changes
    every = latencies + bounds
    if steps_run is None:
        base = [listened[r] - c for r, c in zip(run_ids, commits, strict=True) if r in listened]
    else:  # the raw LISTEN hears each step's insert (even changes) and finish under one index
        base = [
            listened[r] - c
            for r, c in zip(run_ids[::2], commits[::2], strict=True)
            if r in listened
        ]
    # Deliveries per second while delivering: from the first commit to the last receipt.
    delivering = (last_received - commits[0]) if latencies else math.nan
    return {
        **opening,
        "subscribers": subscribers,
        "api_processes": len(servers),
        "changes": len(run_ids),
        "changes_per_second": 1 / interval,
        "commit_seconds": commit_seconds,
        "wall_seconds": wall,
        "collect_deadline_seconds": within,
        "delivered": len(latencies),
        "lost": lost,
        "late_at_deadline": late,
        "lower_bound": bool(late),
        "out_of_order_subscribers": sum(r[5] for r in replies),
        "duplicates": sum(r[6] for r in replies),
        "errors": [e for r in replies for e in r[7]][:5],
        "p50_ms": percentile(every, 50) * 1000,
        "p90_ms": percentile(every, 90) * 1000,
        "p99_ms": percentile(every, 99) * 1000,
        "max_ms": max(every) * 1000 if every else math.nan,
        "delivered_p50_ms": percentile(latencies, 50) * 1000,
        "delivered_p99_ms": percentile(latencies, 99) * 1000,
        "deliveries_per_second": len(latencies) / delivering if delivering else math.nan,
        "client_cpu_percent": 100 * client_cpu / wall,
        "server_cpu_percent": 100 * server_cpu / wall,
        "server_cpu_seconds": server_cpu,
        # What the api costs per delivery, and what one core of it would deliver if it had the
        # core to itself (the machine is shared: wall-clock rates follow its load).
        "server_cpu_us_per_delivery": 1e6 * server_cpu / len(latencies) if latencies else math.nan,
        "deliveries_per_api_cpu_second": len(latencies) / server_cpu if server_cpu else math.nan,
        # The client processes' share: they parse every message on the same two cores.
        "client_cpu_us_per_delivery": 1e6 * client_cpu / len(latencies) if latencies else math.nan,
        # The api's own SQL statements (its engine; the session sweep's every 2 s included)
        # from the first commit until every subscriber had everything.
        "api_statements": statements,
        "api_statements_per_change": statements / len(run_ids),
        "api_gc_seconds": gc_seconds,
        "api_gc_share_of_cpu": gc_seconds / server_cpu if server_cpu else math.nan,
        "baseline_received": len(base),
        "baseline_p50_ms": percentile(base, 50) * 1000,
        "baseline_p99_ms": percentile(base, 99) * 1000,
    }


async def open_only(
    clients: Clients, server: ApiServer, token: str, subscribers: int
) -> dict[str, Any]:
    """Open `subscribers` subscriptions and close them again (no events): the opening rate."""
    await asyncio.to_thread(api_statements, server.port)  # resets the counts
    cpu = cpu_seconds([server.pid])
    opening = await open_subscriptions(clients, [server], token, subscribers, [1])
    cpu = cpu_seconds([server.pid]) - cpu
    statements, gc_seconds = await asyncio.to_thread(api_statements, server.port)
    opened = max(1, opening["opened"])
    opening["server_cpu_ms_per_subscription"] = 1000 * cpu / opened
    opening["api_statements_per_subscription"] = statements / opened
    opening["api_gc_ms_per_subscription"] = 1000 * gc_seconds / opened
    await clients.ask([("collect", 0)] * opening["client_processes"])
    opening["subscriptions_left"] = await wait_active([server.port], 0, 120)
    return opening


async def websocket_memory_cycles(
    clients: Clients, server: ApiServer, token: str, cycles: int, warm: int
) -> dict[str, Any]:
    process = psutil.Process(server.pid)
    parts = len(clients.pipes)
    await clients.ask([("cycles", server.ws_url, token, n) for n in split(warm, parts)])
    await wait_active([server.port], 0, 10)
    await asyncio.sleep(0.5)
    before = process.memory_info().rss
    started = time.monotonic()
    cpu = cpu_seconds([server.pid])
    replies = await clients.ask([("cycles", server.ws_url, token, n) for n in split(cycles, parts)])
    seconds = time.monotonic() - started
    cpu = cpu_seconds([server.pid]) - cpu
    left = await wait_active([server.port], 0, 10)
    await asyncio.sleep(0.5)
    after = process.memory_info().rss
    return {
        "cycles": cycles,
        "warm_up_cycles": warm,
        "seconds": seconds,
        "cycles_per_second": cycles / seconds if seconds else math.nan,
        "server_cpu_ms_per_cycle": 1000 * cpu / cycles if cycles else math.nan,
        "errors": sum(r[3] for r in replies),
        "error_examples": [e for r in replies for e in r[2]][:5],
        "rss_before": before,
        "rss_after": after,
        "subscriptions_left": left,
    }


def _note(m: dict[str, Any]) -> str:
    return (
        ("LOWER BOUND: " if m["lower_bound"] else "")
        + f"lost {m['lost']}, not yet delivered {m['late_at_deadline']} "
        f"{m['collect_deadline_seconds']:g} s after the last commit, of "
        f"{m['subscribers'] * m['changes']}; {m['out_of_order_subscribers']} subscribers out of "
        f"order; p50 {m['p50_ms']:.0f} ms; {m['deliveries_per_second']:,.0f} deliveries/s; "
        f"api CPU {m['server_cpu_us_per_delivery']:.0f} µs per delivery, clients "
        f"{m['client_cpu_us_per_delivery']:.0f} µs per message; "
        f"CPU: {m['api_processes']} api {m['server_cpu_percent']:.0f} %, "
        f"{m['client_processes']} clients {m['client_cpu_percent']:.0f} % (of one core); "
        f"api garbage collector {100 * m['api_gc_share_of_cpu']:.0f} % of its CPU; "
        f"opened in {m['open_seconds']:.1f} s"
    )


def _p99_row(label: str, m: dict[str, Any], target: float) -> Row:
    return Row(
        label,
        m["p99_ms"],
        "ms",
        baseline=m["baseline_p99_ms"],
        baseline_label="raw LISTEN p99, same NOTIFYs",
        target=f"≤ {target:g} ms, 0 lost",
        ok=m["p99_ms"] <= target
        and m["lost"] == 0
        and m["late_at_deadline"] == 0
        and m["out_of_order_subscribers"] == 0,
        note=_note(m),
    )


async def start_run(url: str, run_id: int) -> None:
    conn = await asyncpg.connect(url)
    try:
        await conn.execute(
            "UPDATE agent_runs SET state = 'running', started_at = now(), heartbeat_at = now()"
            " WHERE id = $1",
            run_id,
        )
    finally:
        await conn.close()


def _start_api(bench: Bench, settings: Any, name: str) -> ApiServer:
    process = Process(
        python_module_command("bench._api_server"),
        env=bench.env(settings),
        log_path=bench.work_dir / f"{name}.log",
    )
    return ApiServer(process, read_port_line(process))


async def run(bench: Bench) -> ScenarioResult:
    cycles = 500 if bench.quick else 10_000
    warm = 100 if bench.quick else 1_000
    # Seconds the clients wait for the last event after the last commit; what is still missing
    # then counts as late (latency >= the wait: p99 becomes a lower bound), not as lost.
    deadline = QUICK_DEADLINE_SECONDS if bench.quick else FULL_DEADLINE_SECONDS[1_000]
    admin_changes = ADMIN_CHANGES_QUICK if bench.quick else ADMIN_OWNERS
    result = ScenarioResult(NAME, TITLE)
    raise_nofile()  # the api subprocesses inherit it
    url = await bench.create_database("fanout_ws")
    rounds = 3 if bench.quick else 4  # blocks of CHANGES run ids, one per owner fan-out
    # One more run than the blocks: the running run whose transcript the runSteps row follows.
    steps_run = CHANGES * rounds + 1
    await seed(url, steps_run)
    await start_run(url, steps_run)
    admin_runs = await seed_owners(url, first_id=steps_run + 1, owners=ADMIN_OWNERS)
    # The dashboards all use one owner's token (the worst case for a group): lift the per-user
    # socket cap (default 20 per user and api process).
    settings = bench.settings(url, bench.redis_url(), max_sockets_per_user=100_000)
    owner_token = mint_token(JWT_SECRET, user_id=OWNER_ID)
    admin_token = mint_token(JWT_SECRET, user_id=ADMIN_ID, admin=True)
    servers: list[ApiServer] = []
    clients: Clients | None = None
    details: dict[str, Any] = {"api_loop": os.environ.get(LOOP_ENV, "auto")}
    block = iter(range(rounds))

    def next_ids() -> list[int]:
        index = next(block)
        return list(range(index * CHANGES + 1, (index + 1) * CHANGES + 1))

    async def measured(
        key: str,
        on: list[ApiServer],
        token: str,
        run_ids: list[int],
        subscribers: int,
        *,
        interval: float,
        within: float = deadline,
        processes: int | None = MIN_CLIENTS,
        query: str = QUERY,
        steps_of: int | None = None,
    ) -> dict[str, Any]:
        """One fan-out (py-spy on the first api when asked), kept in the details; the next one
        starts once the apis have no subscriber left."""
        assert clients is not None
        with profiled(on[0].pid, f"fanout_ws-{key}"):
            found = await fanout(
                url,
                clients,
                on,
                token,
                run_ids,
                subscribers,
                interval=interval,
                within=within,
                processes=processes,
                query=query,
                steps_run=steps_of,
            )
        details[key] = found
        await wait_active([s.port for s in on], 0, 120)
        return found

    try:
        servers.append(await asyncio.to_thread(_start_api, bench, settings, "fanout_ws-api"))
        api = servers[0]
        clients = Clients(max(MIN_CLIENTS, math.ceil(OPEN_MANY / SUBSCRIBERS_PER_CLIENT)))
        details["server_rss_start"] = psutil.Process(api.pid).memory_info().rss
        memory = await websocket_memory_cycles(clients, api, owner_token, cycles, warm)
        details["memory"] = memory

        with profiled(api.pid, "fanout_ws-open"):
            opening = await open_only(clients, api, owner_token, OPEN_MANY)
        details[f"open_{OPEN_MANY}"] = opening
        result.add(
            Row(
                f"open {OPEN_MANY:,} subscriptions (connect, init, subscribe), one api process",
                opening["open_seconds"],
                "s",
                target=f"≤ {TARGET_OPEN_SECONDS:g} s",
                ok=opening["open_seconds"] <= TARGET_OPEN_SECONDS
                and opening["active_on_server"] == OPEN_MANY,
                note=f"{opening['server_cpu_ms_per_subscription']:.2f} ms api CPU each "
                f"({opening['api_gc_ms_per_subscription']:.2f} ms of it in the garbage "
                f"collector; {opening['api_statements_per_subscription']:.2f} SQL statements "
                "each); "
                f"{opening['active_on_server']} counted by the api; "
                f"errors {opening['open_errors'][:2]}",
            )
        )

        # Owner audience: 1,000 dashboards of the changing owner.
        slow = SLOW_INTERVAL_SECONDS
        owner, fast_interval = [api], CHANGE_INTERVAL_SECONDS
        slow_run = await measured(
            "owner_1000_slow", owner, owner_token, next_ids(), 1_000, interval=slow
        )
        result.add(
            _p99_row(
                f"p99, 1,000 subscribers of one owner x {CHANGES} at {1 / slow:g} changes/s",
                slow_run,
                TARGET_P99_MS,
            )
        )
        fast = await measured(
            "owner_1000_fast", owner, owner_token, next_ids(), 1_000, interval=fast_interval
        )
        result.add(
            Row(
                "deliveries per second of api CPU (1,000 subscribers, "
                f"{1 / CHANGE_INTERVAL_SECONDS:g} changes/s): one core's capacity",
                fast["deliveries_per_api_cpu_second"],
                "/s",
                target=f"≥ {TARGET_DELIVERIES_PER_SECOND:,}",
                ok=fast["deliveries_per_api_cpu_second"] >= TARGET_DELIVERIES_PER_SECOND,
                note=f"{fast['server_cpu_us_per_delivery']:.1f} µs api CPU per delivery; "
                f"the api had {fast['server_cpu_percent']:.0f} % of a core on this shared machine",
            )
        )
        result.add(
            Row(
                f"deliveries/s, 1,000 subscribers x {CHANGES} at "
                f"{1 / CHANGE_INTERVAL_SECONDS:g} changes/s, one api process",
                fast["deliveries_per_second"],
                "/s",
                target=f"≥ {TARGET_DELIVERIES_PER_SECOND:,}",
                ok=fast["deliveries_per_second"] >= TARGET_DELIVERIES_PER_SECOND
                and fast["lost"] == 0
                and fast["out_of_order_subscribers"] == 0,
                note=f"p99 {fast['p99_ms']:,.0f} ms; " + _note(fast),
            )
        )

        # Admin audience: 100 admin dashboards, every owner's events.
        admin = await measured(
            "admin",
            [api],
            admin_token,
            admin_runs[:admin_changes],
            ADMIN_DASHBOARDS,
            interval=slow,
            processes=1,
        )
        result.add(
            _p99_row(
                f"p99, {ADMIN_DASHBOARDS} admin dashboards, {admin_changes:,} changes of as "
                f"many owners (of {ADMIN_OWNERS:,}) at {1 / slow:g}/s",
                admin,
                TARGET_P99_MS,
            )
        )

        # runSteps: 1,000 watchers of one running run while its transcript is written.
        steps = await measured(
            "run_steps",
            [api],
            owner_token,
            list(range(CHANGES)),
            1_000,
            interval=slow,
            query=STEPS_QUERY.format(run_id=steps_run),
            steps_of=steps_run,
        )
        result.add(
            Row(
                "runSteps: database statements per step change, 1,000 subscribers of one "
                f"running run x {CHANGES} step changes at {1 / slow:g}/s",
                steps["api_statements_per_change"],
                "statements",
                target=f"≤ {TARGET_STATEMENTS_PER_STEP_CHANGE:g} (not per subscriber)",
                ok=steps["api_statements_per_change"] <= TARGET_STATEMENTS_PER_STEP_CHANGE,
                note=f"{steps['api_statements']} statements of the api's engine from the first "
                "commit to the last delivery (the session sweep's included); " + _note(steps),
            )
        )
        result.add(
            _p99_row(
                f"runSteps p99, 1,000 subscribers of one running run x {CHANGES} step changes "
                f"at {1 / slow:g}/s",
                steps,
                TARGET_P99_MS,
            )
        )

        # Two api processes, the same subscribers split between them.
        servers.append(await asyncio.to_thread(_start_api, bench, settings, "fanout_ws-api-2"))
        both = await measured(
            "two_processes", servers, owner_token, next_ids(), 1_000, interval=fast_interval
        )
        result.add(
            Row(
                f"deliveries/s, 1,000 subscribers split over 2 api processes x {CHANGES} at "
                f"{1 / CHANGE_INTERVAL_SECONDS:g} changes/s",
                both["deliveries_per_second"],
                "/s",
                baseline=fast["deliveries_per_second"],
                baseline_label="one api process, same run",
                target="grows with processes",
                ok=both["deliveries_per_second"] > fast["deliveries_per_second"]
                and both["lost"] == 0,
                note=f"p99 {both['p99_ms']:,.0f} ms; " + _note(both),
            )
        )
        if not bench.quick:
            many = await measured(
                f"owner_{OPEN_MANY}_fast",
                [api],
                owner_token,
                next_ids(),
                OPEN_MANY,
                interval=CHANGE_INTERVAL_SECONDS,
                within=FULL_DEADLINE_SECONDS[OPEN_MANY],
                processes=None,
            )
            result.add(
                _p99_row(
                    f"p99, {OPEN_MANY:,} subscribers x {CHANGES} at "
                    f"{1 / CHANGE_INTERVAL_SECONDS:g} changes/s",
                    many,
                    1_000.0,
                )
            )
        result.add(
            memory_growth_row(
                f"api RSS after {cycles:,} WebSocket connect/subscribe/close cycles",
                memory,
                clean=memory["subscriptions_left"] == 0 and memory["errors"] == 0,
                note=f"{memory['cycles_per_second']:.0f} cycles/s, "
                f"{memory['server_cpu_ms_per_cycle']:.1f} ms server CPU each; "
                f"errors {memory['errors']}; "
                f"subscriptions left {memory['subscriptions_left']}",
            )
        )
    finally:
        if clients is not None:
            await asyncio.to_thread(clients.stop)
        for server in servers:
            server.process.stop()
            details[f"log_tail_{server.port}"] = server.process.log_tail(1000)
    result.details = details
    await bench.drop_database(url)
    return result


__all__ = ["run"]
