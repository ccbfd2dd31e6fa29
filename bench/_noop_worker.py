"""The run pipeline's baseline: a no-op async Dramatiq actor on the same broker and settings.

`python -m bench._noop_worker --redis-url URL --threads 8` declares `execute_run` on queue `runs`
(an async no-op, through the same AsyncIO middleware as the engine's actor) on a RedisBroker and
runs `dramatiq.Worker` in this process, as `agent-engine worker --processes 1` does, until SIGTERM.
"""

from __future__ import annotations

import argparse
import signal
import threading

import dramatiq
from dramatiq.brokers.redis import RedisBroker
from dramatiq.middleware import AsyncIO


async def execute_run(run_id: int) -> None:
    return None


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--redis-url", required=True)
    parser.add_argument("--threads", type=int, default=8)
    args = parser.parse_args()
    broker = RedisBroker(url=args.redis_url)  # type: ignore[no-untyped-call]
    broker.add_middleware(AsyncIO())
    dramatiq.set_broker(broker)
    dramatiq.actor(broker=broker, actor_name="execute_run", queue_name="runs")(execute_run)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    worker = dramatiq.Worker(broker, worker_threads=args.threads)
    worker.start()
    print("PORT 0", flush=True)  # ready
    try:
        stop.wait()
    finally:
        worker.stop(timeout=5000)
        broker.close()


if __name__ == "__main__":
    main()
