"""The remotes of the hostile scenario in one process of their own: a fake model and three
hostile MCP servers (issue 38's cases).

`python -m bench._hostile_servers --role model|mcp --delay SECONDS` prints one line
`PORTS <json>` once ready (`model`; or `listing`, `big`, `endless`) and serves until SIGTERM. The
model and the MCP servers run as two processes: the bytes the hostile servers send must not
delay the model's answers (what the bench measures is the engine's delay). The model calls the
first tool it is offered whose name starts with `big__` or `endless__` (once per conversation),
and answers "ok" after `--delay` otherwise: a normal agent (no tools) makes one slow model call
per run.
"""

from __future__ import annotations

import argparse
import json
import signal
import threading
from typing import Any

from agent_engine.testing.fake_openai import FakeOpenAIServer, FakeReply, FakeToolCall
from agent_engine.testing.hostile_mcp import Delivery, HostileServer, write_tool

HOSTILE_PREFIXES = ("big__", "endless__")


def _endless_after_first_listing(server: HostileServer, stop: threading.Event) -> None:
    while not stop.wait(0.05):
        if server.state.lists:
            server.apply("endless_result")
            return


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--delay", type=float, default=0.1)
    parser.add_argument("--role", choices=("model", "mcp"), required=True)
    args = parser.parse_args()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())

    def script(request: dict[str, Any]) -> FakeReply:
        offered = [t["function"]["name"] for t in request.get("tools") or ()]
        hostile = [name for name in offered if name.startswith(HOSTILE_PREFIXES)]
        answered = any(m.get("role") == "tool" for m in request.get("messages", []))
        if hostile and not answered:
            return FakeReply(tool_calls=(FakeToolCall(hostile[0], {"title": "x"}),))
        return FakeReply(content="ok", delay_seconds=args.delay)

    if args.role == "model":
        with FakeOpenAIServer() as model:
            model.script(script)
            print(f"PORTS {json.dumps({'model': model.port})}", flush=True)
            stop.wait()
        return
    with HostileServer() as listing, HostileServer() as big, HostileServer() as endless:
        listing.apply("many_tools")
        for server in (big, endless):
            server.state.tools = [write_tool(read_only=True)]  # called without an approval
        big.apply("big_result")
        # `endless_result` makes the listing endless too: it is set once the source is registered
        # (from then on the clock's re-syncs meet an endless listing as well).
        endless.state.delivery = Delivery.SSE
        threading.Thread(target=_endless_after_first_listing, args=(endless, stop)).start()
        ports = {
            "listing": listing.port,
            "big": big.port,
            "endless": endless.port,
        }
        print(f"PORTS {json.dumps(ports)}", flush=True)
        stop.wait()


if __name__ == "__main__":
    main()
