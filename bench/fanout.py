"""Scenario 5 - run-event fan-out, measured on the live bus in process (`api.live.LiveUpdates`).

The bus alone, without the WebSocket layer (`fanout_ws` measures that): the LISTEN connection, the
per-event row load and the in-process fan-out to S subscribers' bounded queues, each drained by
its own task (as a subscription would).

S subscribers (1,000; full mode also 5,000) all see the changing owner's runs (the worst case:
every event goes to every subscriber). A separate thread commits 200 state changes
(queued -> running, 100/s), each stamping `heartbeat_at = clock_timestamp()`; latency =
receive time - that stamp. Baseline, just before: a raw asyncpg LISTEN connection receiving the
same kind of NOTIFY. Memory: process RSS before and after N subscribe/close cycles.
"""

from __future__ import annotations

import asyncio
import gc
import time
from typing import Any

import asyncpg
import psutil

from agent_engine.api.live import BusListener, LiveUpdates, RunChange, Topic
from agent_engine.db.engine import create_engine
from agent_engine.settings import Settings, to_asyncpg_url
from bench.common import Bench, Row, ScenarioResult, memory_growth_row, percentile

TITLE = "Run-event fan-out: hub in process"
NAME = "fanout"
OWNER_ID = 1
CHANGES = 200
CHANGE_INTERVAL_SECONDS = 0.01
TARGET_P99_MS = {1_000: 250.0, 5_000: 1_000.0}


async def seed(url: str, runs: int) -> None:
    conn = await asyncpg.connect(url)
    try:
        await conn.execute(
            f"""
            INSERT INTO users (id, email) VALUES ({OWNER_ID}, 'o@example.com');
            INSERT INTO agent_models (id, name, provider, model) VALUES (1, 'b', 'builtin', 'b');
            INSERT INTO agents (id, user_id, name, prompt, model_id) OVERRIDING SYSTEM VALUE
            SELECT g, {OWNER_ID}, 'agent ' || g, 'p', 1 FROM generate_series(1, {runs}) g;
            INSERT INTO agent_runs (id, agent_id, trigger, state, created_at)
            OVERRIDING SYSTEM VALUE
            SELECT g, g, 'manual', 'queued', now() FROM generate_series(1, {runs}) g
            """
        )
    finally:
        await conn.close()


FIRST_OTHER_OWNER_ID = 10_001


async def seed_owners(url: str, *, first_id: int, owners: int) -> list[int]:
    """`owners` more owners with one agent and one queued run each (ids from `first_id`); returns
    the run ids, one per owner."""
    conn = await asyncpg.connect(url)
    try:
        await conn.execute(
            f"""
            INSERT INTO users (id, email)
            SELECT {FIRST_OTHER_OWNER_ID} + g, 'owner' || g || '@example.com'
            FROM generate_series(0, {owners - 1}) g;
            INSERT INTO agents (id, user_id, name, prompt, model_id) OVERRIDING SYSTEM VALUE
            SELECT {first_id} + g, {FIRST_OTHER_OWNER_ID} + g, 'agent', 'p', 1
            FROM generate_series(0, {owners - 1}) g;
            INSERT INTO agent_runs (id, agent_id, trigger, state, created_at)
            OVERRIDING SYSTEM VALUE
            SELECT {first_id} + g, {first_id} + g, 'manual', 'queued', now()
            FROM generate_series(0, {owners - 1}) g
            """
        )
    finally:
        await conn.close()
    return list(range(first_id, first_id + owners))


def commit_changes(
    url: str, run_ids: list[int], interval: float = CHANGE_INTERVAL_SECONDS
) -> list[float]:
    """In its own thread and loop (the committer is not slowed by the fan-out it causes); returns
    the wall-clock time each commit returned (autocommit), one every `interval` seconds."""

    async def go() -> list[float]:
        conn = await asyncpg.connect(url)
        stamps: list[float] = []
        try:
            next_at = time.monotonic()
            for run_id in run_ids:
                await conn.execute(
                    "UPDATE agent_runs SET state = 'running', started_at = clock_timestamp(),"
                    " heartbeat_at = clock_timestamp() WHERE id = $1 AND state = 'queued'",
                    run_id,
                )
                stamps.append(time.time())
                next_at += interval
                await asyncio.sleep(max(0.0, next_at - time.monotonic()))
        finally:
            await conn.close()
        return stamps

    return asyncio.run(go())


async def _stamps(url: str, run_ids: list[int]) -> dict[int, float]:
    conn = await asyncpg.connect(url)
    try:
        rows = await conn.fetch(
            "SELECT id, extract(epoch FROM heartbeat_at) AS t FROM agent_runs"
            " WHERE id = ANY($1::bigint[])",
            run_ids,
        )
    finally:
        await conn.close()
    return {int(r["id"]): float(r["t"]) for r in rows}


async def raw_baseline(url: str, run_ids: list[int]) -> list[float]:
    received: dict[int, float] = {}
    conn = await asyncpg.connect(url)

    def on_notify(_c: Any, _p: int, _ch: str, payload: str) -> None:
        import json

        note = json.loads(payload)
        received[int(note["run_id"])] = time.time()

    await conn.add_listener("agent_run_events", on_notify)
    try:
        await asyncio.to_thread(commit_changes, url, run_ids)
        await asyncio.sleep(0.5)
    finally:
        await conn.close()
    stamps = await _stamps(url, run_ids)
    return [received[r] - stamps[r] for r in run_ids if r in received]


def _live(url: str, queue_size: int = 256) -> LiveUpdates:
    engine = create_engine(Settings(database_url=to_asyncpg_url(url)))
    return LiveUpdates(engine, queue_size=queue_size)


async def _events(sub: BusListener[RunChange]) -> Any:
    async for batch in sub.batches():
        for event in batch:
            yield event


async def hub_fanout(url: str, run_ids: list[int], subscribers: int) -> dict[str, Any]:
    hub = _live(url, queue_size=max(256, len(run_ids) * 2))
    await hub.start(listen_timeout=10)
    latencies: list[list[float]] = [[] for _ in range(subscribers)]
    wanted = set(run_ids)

    async def consume(index: int, sub: BusListener[RunChange]) -> None:
        sink = latencies[index]
        async for event in _events(sub):
            if event.run["id"] in wanted and event.state == "running":
                sink.append(time.time() - event.run["heartbeat_at"].timestamp())
                if len(sink) == len(run_ids):
                    return

    subs = [hub.bus.subscribe(Topic.RUNS, owner_id=OWNER_ID) for _ in range(subscribers)]
    tasks = [asyncio.create_task(consume(i, s)) for i, s in enumerate(subs)]
    try:
        await asyncio.sleep(0.1)
        started = time.perf_counter()
        await asyncio.to_thread(commit_changes, url, run_ids)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and not all(t.done() for t in tasks):
            await asyncio.sleep(0.05)
        seconds = time.perf_counter() - started
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for sub in subs:
            sub.close()
        await hub.stop()
        await hub.engine.dispose()
    flat = [x for sink in latencies for x in sink]
    expected = subscribers * len(run_ids)
    return {
        "subscribers": subscribers,
        "changes": len(run_ids),
        "delivered": len(flat),
        "lost": expected - len(flat),
        "seconds": seconds,
        "p50_ms": percentile(flat, 50) * 1000,
        "p99_ms": percentile(flat, 99) * 1000,
        "max_ms": max(flat) * 1000 if flat else float("nan"),
    }


async def hub_memory_cycles(url: str, cycles: int) -> dict[str, Any]:
    hub = _live(url)
    await hub.start(listen_timeout=10)
    process = psutil.Process()

    async def cycle() -> None:
        sub = hub.bus.subscribe(Topic.RUNS, owner_id=OWNER_ID)
        task = asyncio.create_task(_drain(sub))
        await asyncio.sleep(0)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        sub.close()

    try:
        for _ in range(min(cycles, 1_000)):  # warm: allocator pools, caches
            await cycle()
        gc.collect()
        before = process.memory_info().rss
        for _ in range(cycles):
            await cycle()
        gc.collect()
        after = process.memory_info().rss
        left = hub.subscriber_count
    finally:
        await hub.stop()
        await hub.engine.dispose()
    return {"cycles": cycles, "rss_before": before, "rss_after": after, "subscribers_left": left}


async def _drain(sub: BusListener[RunChange]) -> None:
    async for _ in sub.batches():
        pass


async def run(bench: Bench) -> ScenarioResult:
    sizes = [1_000] if bench.quick else [1_000, 5_000]
    cycles = 2_000 if bench.quick else 10_000
    result = ScenarioResult(NAME, TITLE)
    url = await bench.create_database("fanout")
    await seed(url, CHANGES * (len(sizes) + 1))
    baseline = await raw_baseline(url, list(range(1, CHANGES + 1)))
    base_p99 = percentile(baseline, 99) * 1000
    details: dict[str, Any] = {
        "baseline": {
            "received": len(baseline),
            "p50_ms": percentile(baseline, 50) * 1000,
            "p99_ms": base_p99,
        }
    }
    for index, subscribers in enumerate(sizes, start=1):
        ids = list(range(index * CHANGES + 1, (index + 1) * CHANGES + 1))
        measured = await hub_fanout(url, ids, subscribers)
        details[f"hub_{subscribers}"] = measured
        target = TARGET_P99_MS[subscribers]
        result.add(
            Row(
                f"p99 commit→subscriber, {subscribers:,} subscribers x {CHANGES} changes",
                measured["p99_ms"],
                "ms",
                baseline=base_p99,
                baseline_label="raw LISTEN p99",
                target=f"≤ {target:g} ms, 0 lost",
                ok=measured["p99_ms"] <= target and measured["lost"] == 0,
                note=f"lost {measured['lost']} of {subscribers * CHANGES}; "
                f"p50 {measured['p50_ms']:.1f} ms; in process, not over WebSocket",
            )
        )
    memory = await hub_memory_cycles(url, cycles)
    details["memory"] = memory
    result.add(
        memory_growth_row(
            f"RSS after {cycles:,} subscribe/close cycles",
            memory,
            clean=memory["subscribers_left"] == 0,
            note=f"subscribers left registered: {memory['subscribers_left']}",
        )
    )
    result.details = details
    await bench.drop_database(url)
    return result


__all__ = ["run"]
