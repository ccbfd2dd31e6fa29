"""The model call's CPU by the way it is made: the SDK's generic request, the thin call over the
SDK's client, and the wire (the worker's default), against the same fake model in its own process.

    .venv/bin/python -m bench.model_call_ab [--calls 500] [--in-flight 200] [--rounds 3]

Each way makes `--calls` calls one at a time, then `--calls` calls with `--in-flight` at once (a
model that answers after 50 ms, so they overlap), in rounds that alternate the order. The
printout is this process's CPU per call (user + system, `time.process_time`), the median of the
rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path

from agent_engine.runtime.providers.base import ModelRequest
from agent_engine.runtime.providers.openai_provider import OpenAIProvider
from bench.common import FAKE_KEY_ENV, Process, python_module_command, read_port_line

# (thin, direct) as `OpenAIProvider` takes them.
WAYS = {"sdk": (False, True), "thin": (True, False), "wire": (True, True)}
SLOW_REPLY_SECONDS = 0.05


def _request() -> ModelRequest:
    return ModelRequest(
        model="fake-model",
        messages=[
            {"role": "system", "content": "Be brief.\n\nSummarise what changed."},
            {"role": "user", "content": "Run now."},
        ],
        tools=[],
    )


async def _cpu_per_call(base_url: str, way: str, *, calls: int, in_flight: int) -> float:
    provider = OpenAIProvider(
        base_url=base_url,
        api_key_env=FAKE_KEY_ENV,
        timeout_seconds=30,
        concurrency=in_flight,
        thin=WAYS[way][0],
        direct=WAYS[way][1],
    )
    request = _request()
    try:
        for _ in range(10):  # connections, TLS-free warm-up
            await provider.complete(request)
        started = time.process_time()
        if in_flight == 1:
            for _ in range(calls):
                await provider.complete(request)
        else:
            limit = asyncio.Semaphore(in_flight)

            async def one() -> None:
                async with limit:
                    await provider.complete(request)

            await asyncio.gather(*(one() for _ in range(calls)))
        return 1000 * (time.process_time() - started) / calls
    finally:
        await provider.aclose()


async def _main(args: argparse.Namespace) -> None:
    os.environ.setdefault(FAKE_KEY_ENV, "bench-key")
    results: dict[tuple[str, int], list[float]] = {}
    for delay, in_flight in ((0.0, 1), (SLOW_REPLY_SECONDS, args.in_flight)):
        server = Process(
            python_module_command("bench._fake_model", "--delay", str(delay)),
            env=dict(os.environ),
            log_path=Path(tempfile.gettempdir()) / f"model_call_ab-{os.getpid()}.log",
        )
        try:
            port = await asyncio.to_thread(read_port_line, server)
            base_url = f"http://127.0.0.1:{port}/v1"
            for round_number in range(args.rounds):
                ways = list(WAYS) if round_number % 2 == 0 else list(reversed(WAYS))
                for way in ways:
                    spent = await _cpu_per_call(
                        base_url, way, calls=args.calls, in_flight=in_flight
                    )
                    results.setdefault((way, in_flight), []).append(spent)
        finally:
            server.stop()
    for (way, in_flight), values in results.items():
        every = ", ".join(f"{v:.3f}" for v in values)
        print(
            f"{way:5s} {in_flight:4d} at once: {statistics.median(values):.3f} ms CPU per call"
            f"  ({every})"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--in-flight", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    asyncio.run(_main(parser.parse_args()))


if __name__ == "__main__":
    main()
