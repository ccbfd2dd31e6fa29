"""A real local HTTP server speaking the OpenAI Chat Completions protocol, with scripted replies.

It runs uvicorn + Starlette on 127.0.0.1 (a free port) in a background thread with its own event
loop, so it works the same from plain sync code and from inside a running asyncio loop::

    with FakeOpenAIServer() as server:               # or: async with FakeOpenAIServer() as server
        server.enqueue(tool_reply(FakeToolCall("search_knowledge", {"query": "vpn"})),
                       text_reply("Done."))
        client = AsyncOpenAI(base_url=server.base_url, api_key="x")
        ...
        assert server.request_count == 2
        assert server.requests[1]["messages"][-1]["role"] == "tool"

Which reply a request gets: the next queued reply (`enqueue`, or `script([...])`), else the
script function's answer (`script(fn)`, fn(request_json) -> FakeReply | str | dict), else the
default: an instant "ok" with usage, which is what benchmarks want.

Per model (the request's `model`), a failure script comes before all of that: `fail_model(
"gpt-a", unavailable(times=3))` answers that model's next three requests with 503, then lets them
through; `times=None` fails forever. The scripts: `unavailable` (503), `rate_limited` (429),
`server_error` (500), `hang` (no answer until the server stops), `bad_request` (400) and
`context_too_long` (400, `context_length_exceeded`, as OpenAI says it). `requests_for(model)`
and `max_active_for(model)` tell what each model was asked.

For load: a reply may be slow (`delay_seconds`, or a slow default: `FakeOpenAIServer(default=
text_reply("ok", delay_seconds=5))`), the server counts the requests in progress
(`active_requests`, `max_active_requests`), and `hold()` keeps every reply waiting until
`release()` — a model that answers only when the test says so. Errors carry `Retry-After`
(`retry_after="1"`, seconds or an HTTP date) and/or `retry-after-ms`. Thousands of slow requests
at once are fine: a waiting request is one sleeping task on the server's own event loop (uvloop
when installed), in its own thread.

The replies and failure scripts live in `testing/fake_openai_replies.py` (re-exported here);
this module keeps the server.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import threading
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable
from types import TracebackType
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from agent_engine.server_thread import STARTUP_TIMEOUT_SECONDS, ServerThread
from agent_engine.testing.fake_openai_replies import FAKE_CREATED as FAKE_CREATED
from agent_engine.testing.fake_openai_replies import FAKE_MODEL_ID as FAKE_MODEL_ID
from agent_engine.testing.fake_openai_replies import FLOOD_CHUNK_BYTES as FLOOD_CHUNK_BYTES
from agent_engine.testing.fake_openai_replies import FLOOD_MARK as FLOOD_MARK
from agent_engine.testing.fake_openai_replies import INSTANT_REPLY as INSTANT_REPLY
from agent_engine.testing.fake_openai_replies import FakeReply as FakeReply
from agent_engine.testing.fake_openai_replies import FakeToolCall as FakeToolCall
from agent_engine.testing.fake_openai_replies import ModelFailure as ModelFailure
from agent_engine.testing.fake_openai_replies import Script as Script
from agent_engine.testing.fake_openai_replies import ScriptResult as ScriptResult
from agent_engine.testing.fake_openai_replies import TruncatedResponse, completion, error_response
from agent_engine.testing.fake_openai_replies import bad_request as bad_request
from agent_engine.testing.fake_openai_replies import context_too_long as context_too_long
from agent_engine.testing.fake_openai_replies import error_reply as error_reply
from agent_engine.testing.fake_openai_replies import flood_reply as flood_reply
from agent_engine.testing.fake_openai_replies import hang as hang
from agent_engine.testing.fake_openai_replies import rate_limited as rate_limited
from agent_engine.testing.fake_openai_replies import raw_reply as raw_reply
from agent_engine.testing.fake_openai_replies import server_error as server_error
from agent_engine.testing.fake_openai_replies import text_reply as text_reply
from agent_engine.testing.fake_openai_replies import tool_reply as tool_reply
from agent_engine.testing.fake_openai_replies import truncated_reply as truncated_reply
from agent_engine.testing.fake_openai_replies import unavailable as unavailable


class FakeOpenAIServer(ServerThread):
    thread_name = "fake-openai"
    description = "the fake OpenAI server"
    graceful_shutdown_seconds = 1

    def __init__(self, *, default: FakeReply = INSTANT_REPLY) -> None:
        super().__init__()
        self.default = default
        self._lock = threading.Lock()
        self._queue: deque[ScriptResult] = deque()
        self._script: Script | None = None
        self._requests: list[dict[str, Any]] = []
        self._headers: list[dict[str, str]] = []
        self._counter = itertools.count(1)
        self._active = 0
        self._max_active = 0
        # Per model: its failure script (with the failures still to give), requests in flight.
        self._failures: dict[str, list[Any]] = {}
        self._active_by_model: dict[str, int] = {}
        self._max_active_by_model: dict[str, int] = {}
        # Bytes of "x" sent by flood replies (a client that stopped reading stops it growing).
        self.flood_sent_bytes = 0
        # Set on the server's loop only (via call_soon_threadsafe); created per start.
        self._stopping = asyncio.Event()
        self._released = asyncio.Event()
        self._released.set()

    # --- scripting -----------------------------------------------------------------------------

    def script(self, fn_or_replies: Script | Iterable[ScriptResult]) -> FakeOpenAIServer:
        """A function deciding each reply from the request JSON, or a list of canned replies."""
        if callable(fn_or_replies):
            with self._lock:
                self._script = fn_or_replies
        else:
            self.enqueue(*fn_or_replies)
        return self

    def enqueue(self, *replies: ScriptResult) -> FakeOpenAIServer:
        with self._lock:
            self._queue.extend(replies)
        return self

    def fail_model(self, model: str, failure: ModelFailure | None) -> FakeOpenAIServer:
        """Answer `model`'s requests with `failure` (before any other script); None: stop."""
        with self._lock:
            if failure is None:
                self._failures.pop(model, None)
            else:
                self._failures[model] = [failure.reply, failure.times]
        return self

    def requests_for(self, model: str) -> list[dict[str, Any]]:
        """The requests received for `model`, in order."""
        with self._lock:
            return [body for body in self._requests if body.get("model") == model]

    def max_active_for(self, model: str) -> int:
        """The most requests for `model` in progress at once."""
        with self._lock:
            return self._max_active_by_model.get(model, 0)

    def reset(self) -> None:
        """Forget the script, the queue, the failure scripts and the recorded requests."""
        with self._lock:
            self._queue.clear()
            self._script = None
            self._failures.clear()
            self._max_active_by_model.clear()
            self._requests.clear()
            self._headers.clear()

    @property
    def requests(self) -> list[dict[str, Any]]:
        """The JSON bodies of the chat-completion requests received, in order (a copy)."""
        with self._lock:
            return list(self._requests)

    @property
    def request_headers(self) -> list[dict[str, str]]:
        with self._lock:
            return list(self._headers)

    @property
    def request_count(self) -> int:
        with self._lock:
            return len(self._requests)

    @property
    def pending_replies(self) -> int:
        with self._lock:
            return len(self._queue)

    @property
    def active_requests(self) -> int:
        """Chat-completion requests received and not yet answered (waiting or held)."""
        with self._lock:
            return self._active

    @property
    def max_active_requests(self) -> int:
        """The most requests in progress at once since the start (or `reset_peak`)."""
        with self._lock:
            return self._max_active

    def reset_peak(self) -> None:
        with self._lock:
            self._max_active = self._active

    def hold(self) -> FakeOpenAIServer:
        """Replies wait (after their own delay) until `release()`: requests pile up in flight."""
        self._on_loop(self._released.clear)
        return self

    def release(self) -> FakeOpenAIServer:
        self._on_loop(self._released.set)
        return self

    def _on_loop(self, callback: Callable[[], object]) -> None:
        loop = self.loop
        if loop is None:
            callback()  # not serving: nothing waits on the event
            return
        done = threading.Event()

        def run() -> None:
            callback()
            done.set()

        loop.call_soon_threadsafe(run)
        done.wait(STARTUP_TIMEOUT_SECONDS)

    @property
    def base_url(self) -> str:
        if self.port is None:
            raise RuntimeError("the fake server is not started")
        return f"http://127.0.0.1:{self.port}/v1"

    # --- lifecycle -----------------------------------------------------------------------------

    def start(self) -> FakeOpenAIServer:
        if self._thread is None:  # fresh events per start; a second start fails below
            self._stopping = asyncio.Event()
            released = asyncio.Event()
            if self._released.is_set():
                released.set()
            self._released = released
        return super().start()

    def stop(self) -> None:
        loop = self.loop
        if loop is not None:
            with contextlib.suppress(RuntimeError):  # closed meanwhile
                loop.call_soon_threadsafe(self._stopping.set)
        super().stop()
        self.port = None

    async def __aenter__(self) -> FakeOpenAIServer:
        return await asyncio.to_thread(self.start)

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await asyncio.to_thread(self.stop)

    # --- the HTTP side (runs in the server thread) ---------------------------------------------

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/v1/chat/completions", self._chat_completions, methods=["POST"]),
                Route("/v1/models", self._models, methods=["GET"]),
            ]
        )

    async def _models(self, request: Request) -> Response:
        return JSONResponse(
            {
                "object": "list",
                "data": [
                    {
                        "id": FAKE_MODEL_ID,
                        "object": "model",
                        "created": FAKE_CREATED,
                        "owned_by": "fake",
                    }
                ],
            }
        )

    async def _chat_completions(self, request: Request) -> Response:
        try:
            body = json.loads(await request.body())
        except ValueError:
            return error_response(400, "the request body is not JSON", "invalid_request_error")
        if not isinstance(body, dict):
            return error_response(
                400, "the request body must be a JSON object", "invalid_request_error"
            )
        with self._lock:
            self._requests.append(body)
            self._headers.append(dict(request.headers))
            number = next(self._counter)
            model = str(body.get("model"))
            failed = self._failure_for(model)
            queued = self._queue.popleft() if self._queue and failed is None else None
            script = self._script
            self._active += 1
            self._max_active = max(self._max_active, self._active)
            in_flight = self._active_by_model.get(model, 0) + 1
            self._active_by_model[model] = in_flight
            self._max_active_by_model[model] = max(
                self._max_active_by_model.get(model, 0), in_flight
            )
        try:
            if body.get("stream"):
                return error_response(
                    400, "FakeOpenAIServer does not stream", "invalid_request_error"
                )
            result: ScriptResult
            if failed is not None:
                result = failed
            elif queued is not None:
                result = queued
            else:
                result = script(body) if script else self.default
            if isinstance(result, dict):
                return JSONResponse(result)
            reply = FakeReply(content=result) if isinstance(result, str) else result
            await self._wait(reply.delay_seconds)
            if reply.status >= 400:
                headers = {}
                if reply.retry_after_ms is not None:
                    headers["retry-after-ms"] = str(reply.retry_after_ms)
                if reply.retry_after is not None:
                    headers["retry-after"] = reply.retry_after
                kind = "server_error" if reply.status >= 500 else "invalid_request_error"
                return error_response(
                    reply.status, reply.error_message, kind, headers, reply.error_code
                )
            if reply.raw_body is not None:
                return Response(
                    reply.raw_body, status_code=reply.status, media_type=reply.content_type
                )
            if reply.truncated:
                return TruncatedResponse(json.dumps(completion(body, reply, number)).encode())
            if reply.flood:
                return StreamingResponse(
                    self._flood(completion(body, reply, number), reply.flood_bytes),
                    media_type="application/json",
                )
            return JSONResponse(completion(body, reply, number), status_code=reply.status)
        finally:
            with self._lock:
                self._active -= 1
                self._active_by_model[model] -= 1

    def _failure_for(self, model: str) -> FakeReply | None:
        """The model's scripted failure for this request, if any (under the lock)."""
        script = self._failures.get(model)
        if script is None:
            return None
        reply, left = script
        if left is not None:
            if left <= 0:
                del self._failures[model]
                return None
            script[1] = left - 1
        return reply if isinstance(reply, FakeReply) else None

    async def _flood(self, completion: dict[str, Any], size: int | None) -> AsyncIterator[bytes]:
        completion["choices"][0]["message"]["content"] = FLOOD_MARK
        head, tail = json.dumps(completion).encode().split(json.dumps(FLOOD_MARK).encode())
        yield head + b'"'
        left = size
        while left is None or left > 0:
            chunk = FLOOD_CHUNK_BYTES if left is None else min(FLOOD_CHUNK_BYTES, left)
            self.flood_sent_bytes += chunk
            yield b"x" * chunk
            if left is not None:
                left -= chunk
            await asyncio.sleep(0)
        yield b'"' + tail

    async def _wait(self, seconds: float) -> None:
        """The reply's delay, then while held; both end early when the server stops."""
        stopping = asyncio.ensure_future(self._stopping.wait())
        try:
            if seconds > 0:
                await asyncio.wait({stopping}, timeout=seconds)
            if not self._released.is_set() and not stopping.done():
                released = asyncio.ensure_future(self._released.wait())
                await asyncio.wait({stopping, released}, return_when=asyncio.FIRST_COMPLETED)
                released.cancel()
        finally:
            stopping.cancel()
