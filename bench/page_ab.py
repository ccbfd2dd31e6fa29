"""A/B of the GraphQL page between two source trees, at the same moment on the same machine.

    .venv/bin/python -m bench.page_ab /path/to/before /path/to/after \\
        --database-url postgresql://postgres@127.0.0.1:5432/page_ab [--requests 100] [--rounds 8]

The database must exist and be empty: it is migrated and seeded with `bench.graphql_page.seed`
(100 + 10 agents, 30 runs each). Each tree serves the page from its own `bench/_api_server.py`
process, both at once. Blocks of `--requests` sequential requests alternate between them
(GraphQL, then the raw asyncpg + json baseline of the same process), the order swapped each round.
The printout is each server's median CPU per request over the blocks, and the ratio to its
baseline. A shared machine drifts by more than the differences worth measuring. Comparing
same-moment blocks, rather than two runs minutes apart, is what makes a 10 % change visible.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
from pathlib import Path

import httpx
import psutil

from agent_engine.api.auth import mint_token
from bench.common import JWT_SECRET
from bench.graphql_page import BIG_OWNER, QUERY, seed


def _serve(tree: Path, database_url: str) -> tuple[subprocess.Popen[str], httpx.Client]:
    env = {
        **os.environ,
        "AGENT_ENGINE_DATABASE_URL": database_url,
        "AGENT_ENGINE_JWT_SECRET": JWT_SECRET,
        "PYTHONPATH": f"{tree / 'src'}{os.pathsep}{tree}",
    }
    process = subprocess.Popen(
        [sys.executable, str(tree / "bench" / "_api_server.py")],
        env=env,
        cwd=tree,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert process.stdout is not None
    for line in process.stdout:
        if line.startswith("PORT "):
            port = int(line.split()[1])
            return process, httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30)
    raise RuntimeError(f"{tree}: the api server did not start")


def _cpu(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return float(times.user + times.system)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    parser.add_argument("--database-url", required=True)
    parser.add_argument("--requests", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--query", default=QUERY)
    args = parser.parse_args()

    subprocess.run(
        [sys.executable, "-m", "agent_engine.cli", "migrate"],
        env={**os.environ, "AGENT_ENGINE_DATABASE_URL": args.database_url},
        check=True,
        stdout=subprocess.DEVNULL,
    )
    asyncio.run(seed(args.database_url))
    token = mint_token(JWT_SECRET, user_id=BIG_OWNER)
    servers = [_serve(tree.resolve(), args.database_url) for tree in (args.before, args.after)]

    def page(client: httpx.Client) -> None:
        body = client.post(
            "/graphql", json={"query": args.query}, headers={"authorization": f"Bearer {token}"}
        ).json()
        if "errors" in body:
            raise RuntimeError(body["errors"])

    def baseline(client: httpx.Client) -> None:
        client.get(f"/_bench/baseline?owner={BIG_OWNER}").raise_for_status()

    blocks: dict[tuple[int, str], list[float]] = {}
    try:
        for _, client in servers:  # warm: statement caches, the cached document
            for _ in range(30):
                page(client)
                baseline(client)
        for round_number in range(args.rounds):
            order = (0, 1) if round_number % 2 == 0 else (1, 0)
            for index in order:
                process, client = servers[index]
                for kind, request in (("page", page), ("baseline", baseline)):
                    started = _cpu(process.pid)
                    for _ in range(args.requests):
                        request(client)
                    spent = 1000 * (_cpu(process.pid) - started) / args.requests
                    blocks.setdefault((index, kind), []).append(spent)
    finally:
        for process, client in servers:
            client.close()
            process.terminate()
            process.wait(10)
    for index, tree in enumerate((args.before, args.after)):
        page_ms = statistics.median(blocks[(index, "page")])
        raw_ms = statistics.median(blocks[(index, "baseline")])
        every = ", ".join(f"{value:.1f}" for value in blocks[(index, "page")])
        print(
            f"{tree}: page {page_ms:.2f} ms CPU per request, raw {raw_ms:.2f} ms,"
            f" ratio {page_ms / raw_ms:.2f}  (blocks: {every})"
        )


if __name__ == "__main__":
    main()
