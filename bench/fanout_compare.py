"""The fan-out rows of bench/fanout_ws.py, smaller, for before/after comparisons on a busy machine.

One api process (bench/_api_server.py), 2 client processes: open 2,000 subscriptions (and close
them), then 1,000 dashboards of one owner x 200 changes at 100/s and at 20/s, and 100 admin
dashboards x 200 changes of as many owners at 20/s. Prints one line per row (api CPU per
opened subscription and per delivery, deliveries/s, p50/p99, lost, late) and writes
/tmp/cmp/<label>.json. Which code the api runs follows PYTHONPATH and the working directory:

    mkdir -p /tmp/cmp
    BENCH_API_LOOP=asyncio .venv/bin/python bench/fanout_compare.py new-1
    # the code before, from an exported tree with its own src/ and this bench/:
    cd /tmp/old && PYTHONPATH=/tmp/old/src:/tmp/old BENCH_API_LOOP=asyncio \
        /path/to/.venv/bin/python /path/to/bench/fanout_compare.py old-1
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

OUT_DIR = Path("/tmp/cmp")
ROWS = (  # name, admin?, first run id (None: the admin owners'), subscribers, interval, clients
    ("owner_100", False, 1, 1_000, 0.01, 2),
    ("owner_20", False, 201, 1_000, 0.05, 2),
    ("admin_20", True, None, 100, 0.05, 1),
)


def main(label: str) -> None:
    sys.path.insert(0, os.getcwd())  # the bench/ (and src/) of the code under test
    import asyncpg

    from agent_engine.db.migrate import upgrade
    from agent_engine.embedded import EmbeddedServers
    from agent_engine.settings import to_libpq_url
    from bench.common import Bench
    from bench.fanout_ws import raise_nofile

    raise_nofile()
    work = Path(tempfile.mkdtemp())
    with EmbeddedServers(work / "s", ephemeral=True) as servers:
        admin_url = to_libpq_url(servers.database_url)

        async def template() -> None:
            conn = await asyncpg.connect(admin_url)
            await conn.execute("CREATE DATABASE cmp_t")
            await conn.close()

        asyncio.run(template())
        upgrade(admin_url.rsplit("/", 1)[0] + "/cmp_t")
        bench = Bench(
            admin_url=admin_url,
            redis_base_url=servers.redis_url,
            template="cmp_t",
            work_dir=work,
            quick=True,
        )
        out = asyncio.run(measure(bench, label))
    OUT_DIR.mkdir(exist_ok=True)
    (OUT_DIR / f"{label}.json").write_text(json.dumps(out, default=str))


async def measure(bench: Any, label: str) -> dict[str, Any]:
    from agent_engine.api.auth import mint_token
    from bench.common import JWT_SECRET, profiled
    from bench.fanout import OWNER_ID, seed, seed_owners
    from bench.fanout_ws import (
        ADMIN_ID,
        ADMIN_OWNERS,
        Clients,
        _start_api,
        fanout,
        open_only,
        wait_active,
    )

    out: dict[str, Any] = {}
    url = await bench.create_database("cmp")
    await seed(url, 600)
    admin_runs = await seed_owners(url, first_id=601, owners=ADMIN_OWNERS)
    settings = bench.settings(url, bench.redis_url())
    api = await asyncio.to_thread(_start_api, bench, settings, "cmp-api")
    clients = Clients(2)
    owner = mint_token(JWT_SECRET, user_id=OWNER_ID)
    admin = mint_token(JWT_SECRET, user_id=ADMIN_ID, admin=True)
    try:
        opened = out["open_2000"] = await open_only(clients, api, owner, 2_000)
        print(
            label,
            f"open 2000 {opened['open_seconds']:.1f} s",
            f"{opened['server_cpu_ms_per_subscription']:.2f} ms/sub",
            flush=True,
        )
        for name, is_admin, first, subscribers, interval, processes in ROWS:
            ids = admin_runs[:200] if first is None else list(range(first, first + 200))
            with profiled(api.pid, f"cmp-{label}-{name}"):
                m = await fanout(
                    url,
                    clients,
                    [api],
                    admin if is_admin else owner,
                    ids,
                    subscribers,
                    interval=interval,
                    within=15.0,
                    processes=processes,
                )
            out[name] = m
            print(
                label,
                name,
                f"p99 {m['p99_ms']:.0f} ms p50 {m['p50_ms']:.0f} lost {m['lost']}",
                f"late {m['late_at_deadline']} ooo {m['out_of_order_subscribers']}",
                f"dps {m['deliveries_per_second']:.0f} api% {m['server_cpu_percent']:.0f}",
                f"us/delivery {m['server_cpu_us_per_delivery']:.1f}",
                f"open {m['open_seconds']:.1f}s",
                flush=True,
            )
            await wait_active([api.port], 0, 120)
    finally:
        await asyncio.to_thread(clients.stop)
        api.process.stop()
    return out


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "run")
