"""A real MCP server (the official `mcp` SDK, Streamable HTTP) with a tiny ticket system.

Two tools: `search_tickets` (READ: `readOnlyHint: true`) and `create_ticket` (WRITE). Every call
is recorded with its arguments, its `_meta` and the `Authorization` header it came with, so tests
can assert who the engine said was acting and that a write happened exactly once::

    with TicketServer() as server:                  # a thread, a free port on 127.0.0.1
        url = server.url                            # http://127.0.0.1:PORT/mcp
        ...
        assert [c.name for c in server.calls] == ["create_ticket"]
        assert server.calls[0].meta["agentEngine/userId"] == "1"

Knobs for failure tests: `extra_tools` (more tools, listed `page_size` a page), `extra_specs`
(raw tool definitions: collisions, long names, malformed schemas), `hold()` / `release()` (calls
wait until released: a server that hangs), `result_chars` (a huge result).

Run it alone: `python -m agent_engine.testing.mcp_tickets --port 8765` (what `make run` uses).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, cast

import mcp.types as types
import uvicorn
from mcp.server.lowlevel import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from starlette.applications import Starlette
from starlette.routing import Mount
from starlette.types import Receive, Scope, Send

from agent_engine.server_thread import ServerThread

# The SDK logs a closed stream at ERROR each time a client ends its session: noise here.
logging.getLogger("mcp.server.streamable_http").setLevel(logging.CRITICAL)

SEARCH_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"query": {"type": "string", "description": "words to look for"}},
    "required": ["query"],
    "additionalProperties": False,
}
CREATE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "title": {"type": "string", "minLength": 1, "maxLength": 200},
        "priority": {"type": "string", "enum": ["low", "normal", "high"]},
    },
    "required": ["title"],
    "additionalProperties": False,
}


@dataclass(frozen=True)
class RecordedCall:
    name: str
    arguments: dict[str, Any]
    meta: dict[str, Any]
    authorization: str | None
    # The token's subject when the server is an OAuth resource server (oauth_servers.py).
    subject: str | None = None


@dataclass
class TicketState:
    tickets: list[dict[str, Any]] = field(
        default_factory=lambda: [
            {"id": "T-1", "title": "VPN drops every hour", "priority": "high"},
            {"id": "T-2", "title": "Printer on floor 3 jams", "priority": "low"},
        ]
    )
    calls: list[RecordedCall] = field(default_factory=list)
    lists: int = 0
    # MCP sessions opened (an initialize without a session id): the pooling tests count them.
    sessions: int = 0
    list_authorizations: list[str | None] = field(default_factory=list)
    extra_tools: int = 0
    extra_specs: list[dict[str, Any]] = field(default_factory=list)
    page_size: int = 50
    result_chars: int | None = None
    hide_write_tool: bool = False
    # The subject of the request's bearer token (set by an OAuth resource server wrapping this one).
    subject_of: Callable[[], str | None] | None = None


def base_tools(state: TicketState) -> list[types.Tool]:
    tools = [
        types.Tool(
            name="search_tickets",
            description="Search the ticket system by words in the title.",
            inputSchema=SEARCH_SCHEMA,
            annotations=types.ToolAnnotations(readOnlyHint=True),
        )
    ]
    if not state.hide_write_tool:
        tools.append(
            types.Tool(
                name="create_ticket",
                description="Open a new ticket.",
                inputSchema=CREATE_SCHEMA,
                annotations=types.ToolAnnotations(readOnlyHint=False, destructiveHint=False),
            )
        )
    tools.extend(
        types.Tool(
            name=f"extra_{n:05d}",
            description="filler",
            inputSchema={"type": "object", "properties": {}},
            annotations=types.ToolAnnotations(readOnlyHint=True),
        )
        for n in range(state.extra_tools)
    )
    tools.extend(types.Tool.model_validate(spec) for spec in state.extra_specs)
    return tools


def build_server(state: TicketState, gate: Callable[[], Awaitable[None]]) -> Server[Any, Any]:
    server: Server[Any, Any] = Server("tickets")

    @server.list_tools()  # type: ignore[no-untyped-call, untyped-decorator]
    async def list_tools(request: types.ListToolsRequest) -> types.ListToolsResult:
        # The SDK passes None when it refreshes its own tool cache before a call (the type is
        # what it inspects to decide to pass the request at all).
        request = cast(types.ListToolsRequest | None, request)  # type: ignore[assignment]
        if request is not None:
            state.lists += 1
            http = server.request_context.request
            state.list_authorizations.append(
                http.headers.get("authorization") if http is not None else None
            )
        tools = base_tools(state)
        params = request.params if request is not None else None
        cursor = params.cursor if params is not None else None
        start = int(cursor) if cursor else 0
        page = tools[start : start + state.page_size]
        following = start + state.page_size
        return types.ListToolsResult(
            tools=page, nextCursor=str(following) if following < len(tools) else None
        )

    @server.call_tool(validate_input=False)  # type: ignore[untyped-decorator]
    async def call_tool(name: str, arguments: dict[str, Any]) -> types.CallToolResult:
        ctx = server.request_context
        meta = ctx.meta.model_dump(exclude_none=True) if ctx.meta is not None else {}
        meta.pop("progressToken", None)
        request = ctx.request
        authorization = request.headers.get("authorization") if request is not None else None
        subject = state.subject_of() if state.subject_of is not None else None
        state.calls.append(RecordedCall(name, dict(arguments), meta, authorization, subject))
        await gate()
        if name == "search_tickets":
            words = str(arguments.get("query", "")).lower().split()
            found = [t for t in state.tickets if any(w in t["title"].lower() for w in words)]
            text = "\n".join(f"{t['id']} [{t['priority']}] {t['title']}" for t in found)
            if state.result_chars is not None:
                text = "x" * state.result_chars
            return _text(text or "no tickets found")
        if name == "create_ticket":
            title = arguments.get("title")
            if not isinstance(title, str) or not title.strip():
                return _text("title must not be empty", error=True)
            ticket = {
                "id": f"T-{len(state.tickets) + 1}",
                "title": title,
                "priority": arguments.get("priority", "normal"),
            }
            if subject is not None:
                ticket["createdBy"] = subject
            state.tickets.append(ticket)
            return _text(f"created {ticket['id']}: {title}")
        return _text(f"unknown tool {name}", error=True)

    return server


def _text(text: str, *, error: bool = False) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)], isError=error)


class _Gate:
    """Calls wait here while held (a server that hangs until the test says so). Held and
    released from the test's thread; waited on in the server's."""

    def __init__(self) -> None:
        self._open = threading.Event()
        self._open.set()

    def hold(self) -> None:
        self._open.clear()

    def release(self) -> None:
        self._open.set()

    async def wait(self) -> None:
        if not self._open.is_set():
            await asyncio.to_thread(self._open.wait)


def build_app(state: TicketState, gate: Callable[[], Awaitable[None]]) -> Starlette:
    """The ASGI app: the MCP endpoint at /mcp, sessions kept by the SDK's session manager."""
    manager = StreamableHTTPSessionManager(app=build_server(state, gate), json_response=True)

    async def endpoint(scope: Scope, receive: Receive, send: Send) -> None:
        headers = dict(scope.get("headers") or [])
        if scope.get("method") == "POST" and b"mcp-session-id" not in headers:
            state.sessions += 1
        await manager.handle_request(scope, receive, send)

    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        async with manager.run():
            yield

    app = Starlette(routes=[Mount("/mcp", app=endpoint)], lifespan=lifespan)
    app.state.manager = manager
    return app


class TicketServer(ServerThread):
    thread_name = "mcp-tickets"
    description = "the MCP ticket server"
    graceful_shutdown_seconds = 1

    def __init__(self, *, host: str = "127.0.0.1", port: int = 0) -> None:
        super().__init__(host=host, port=port)
        self.state = TicketState()
        self._gate = _Gate()
        self._app: Starlette | None = None
        self._manager_stop: asyncio.Event | None = None
        self._manager_done: threading.Event = threading.Event()

    def app(self) -> Starlette:
        self._app = build_app(self.state, self._gate.wait)
        return self._app

    def start(self) -> TicketServer:
        super().start()
        # The thread serves with lifespan off: the session manager's task group runs beside it.
        loop = self.loop
        assert loop is not None and self._app is not None
        manager: StreamableHTTPSessionManager = self._app.state.manager
        started = threading.Event()

        async def run_manager() -> None:
            self._manager_stop = asyncio.Event()
            async with manager.run():
                started.set()
                await self._manager_stop.wait()
            self._manager_done.set()

        asyncio.run_coroutine_threadsafe(run_manager(), loop)
        if not started.wait(10):
            raise RuntimeError("the MCP session manager did not start")
        return self

    def stop(self) -> None:
        self._gate.release()
        loop, stop = self.loop, self._manager_stop
        if loop is not None and stop is not None:
            loop.call_soon_threadsafe(stop.set)
            self._manager_done.wait(5)
            # sse-starlette polls for a uvicorn shutdown it cannot see in a thread; end its
            # watcher, or the closing loop reports it as destroyed while pending.
            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(_end_sse_watchers(), loop).result(5)
        super().stop()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    @property
    def calls(self) -> list[RecordedCall]:
        return list(self.state.calls)

    def calls_of(self, name: str) -> list[RecordedCall]:
        return [call for call in self.state.calls if call.name == name]

    def hold(self) -> None:
        self._gate.hold()

    def release(self) -> None:
        self._gate.release()


async def _end_sse_watchers() -> None:
    for task in asyncio.all_tasks():
        if getattr(task.get_coro(), "__name__", "") == "_shutdown_watcher":
            task.cancel()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="The MCP ticket server of the demo and tests.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8765)
    args = parser.parse_args(argv)
    gate = _Gate()
    uvicorn.run(build_app(TicketState(), gate.wait), host=args.host, port=args.port)


if __name__ == "__main__":
    main()
