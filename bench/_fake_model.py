"""A FakeOpenAIServer in its own process (so it does not share a GIL with the measuring process).

`python -m bench._fake_model [--delay SECONDS]` prints `PORT <n>` once ready and serves until
SIGTERM. The default reply is the instant "ok" with usage; `--delay` makes every reply slow.
"""

from __future__ import annotations

import argparse
import signal
import threading

from agent_engine.testing.fake_openai import FakeOpenAIServer, FakeReply


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--delay", type=float, default=0.0)
    args = parser.parse_args()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    with FakeOpenAIServer(default=FakeReply(content="ok", delay_seconds=args.delay)) as server:
        print(f"PORT {server.port}", flush=True)
        stop.wait()


if __name__ == "__main__":
    main()
