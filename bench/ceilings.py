"""The machine's ceilings, measured at the start of the run: what no engine code can beat.

- PostgreSQL simple write transactions/s: a pgbench `-N`-like transaction (UPDATE an account,
  SELECT its balance, INSERT a history row) from 8 asyncpg connections in one Python process.
  The Python client itself costs CPU on a 2-core machine, so this is a floor of pgbench's figure.
- Dramatiq enqueue/s from one thread: `actor.send()` on a RedisBroker, one message at a time.
"""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any

import asyncpg
import dramatiq
from dramatiq.brokers.redis import RedisBroker

from bench.common import Bench, Row

PG_CLIENTS = 8
ACCOUNTS = 100_000


async def pg_write_tps(url: str, *, seconds: float) -> float:
    setup = await asyncpg.connect(url)
    try:
        await setup.execute(
            "CREATE TABLE bench_accounts (aid int PRIMARY KEY, abalance int NOT NULL DEFAULT 0,"
            " filler char(84));"
            "CREATE TABLE bench_history (aid int, delta int, mtime timestamptz);"
            f"INSERT INTO bench_accounts (aid) SELECT generate_series(1, {ACCOUNTS})"
        )
        await setup.execute("VACUUM ANALYZE bench_accounts")
    finally:
        await setup.close()
    conns = [await asyncpg.connect(url) for _ in range(PG_CLIENTS)]
    count = 0
    deadline = time.monotonic() + seconds

    async def client(conn: asyncpg.Connection) -> None:
        nonlocal count
        rng = random.Random(id(conn))
        while time.monotonic() < deadline:
            aid = rng.randint(1, ACCOUNTS)
            delta = rng.randint(-5000, 5000)
            async with conn.transaction():
                await conn.execute(
                    "UPDATE bench_accounts SET abalance = abalance + $1 WHERE aid = $2", delta, aid
                )
                await conn.fetchval("SELECT abalance FROM bench_accounts WHERE aid = $1", aid)
                await conn.execute(
                    "INSERT INTO bench_history (aid, delta, mtime) VALUES ($1, $2, now())",
                    aid,
                    delta,
                )
            count += 1

    started = time.monotonic()
    try:
        await asyncio.gather(*(client(c) for c in conns))
    finally:
        elapsed = time.monotonic() - started
        for conn in conns:
            await conn.close()
    return count / elapsed


def dramatiq_enqueue_rate(redis_url: str, *, messages: int) -> float:
    broker = RedisBroker(url=redis_url)  # type: ignore[no-untyped-call]
    try:

        def noop(run_id: int) -> None:
            return None

        actor: Any = dramatiq.actor(broker=broker, actor_name="noop", queue_name="ceiling")(noop)
        for i in range(50):  # connection and script loading
            actor.send(i)
        started = time.perf_counter()
        for i in range(messages):
            actor.send(i)
        return messages / (time.perf_counter() - started)
    finally:
        broker.close()


async def measure(bench: Bench) -> tuple[list[Row], dict[str, float]]:
    url = await bench.create_database("ceiling")
    try:
        tps = await pg_write_tps(url, seconds=1.5 if bench.quick else 4.0)
    finally:
        await bench.drop_database(url)
    redis_url = bench.redis_url()
    enqueue = await asyncio.to_thread(
        dramatiq_enqueue_rate, redis_url, messages=2_000 if bench.quick else 10_000
    )
    rows = [
        Row(
            "PostgreSQL simple write tx/s (pgbench -N-like, 8 asyncpg clients)",
            tps,
            "tx/s",
            note="issue: ~7,000 with pgbench -N",
        ),
        Row("Dramatiq enqueue/s from one thread (Redis)", enqueue, "msg/s", note="issue: ~7,000"),
    ]
    return rows, {"pg_write_tps": tps, "dramatiq_enqueue_per_s": enqueue}
