"""A FakeOpenAIServer in its own process (so it does not share a GIL with the measuring process).

`python -m bench._fake_model [--delay SECONDS]` prints `PORT <n>` once ready and serves until
SIGTERM. The default reply is the instant "ok" with usage; `--delay` makes every reply slow.
With `--tool NAME --arguments JSON` a conversation without a tool result yet gets that one tool
call, and one with it gets "ok" (a run with one tool call). `--status 503` answers every request
with that HTTP error instead (a model that is down).
"""

from __future__ import annotations

import argparse
import json
import signal
import threading
from typing import Any

from agent_engine.testing.fake_openai import FakeOpenAIServer, FakeReply, FakeToolCall


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--delay", type=float, default=0.0)
    parser.add_argument("--tool", default=None)
    parser.add_argument("--arguments", default="{}")
    parser.add_argument("--status", type=int, default=200)
    args = parser.parse_args()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    default = FakeReply(content="ok", delay_seconds=args.delay)
    if args.status != 200:
        default = FakeReply(status=args.status, error_message="down", delay_seconds=args.delay)
    with FakeOpenAIServer(default=default) as server:
        if args.tool:
            call = FakeToolCall(args.tool, json.loads(args.arguments))

            def one_tool_call(request: dict[str, Any]) -> FakeReply:
                if any(m.get("role") == "tool" for m in request.get("messages", [])):
                    return FakeReply(content="ok", delay_seconds=args.delay)
                return FakeReply(tool_calls=(call,), delay_seconds=args.delay)

            server.script(one_tool_call)
        print(f"PORT {server.port}", flush=True)
        stop.wait()


if __name__ == "__main__":
    main()
