"""Talking to MCP servers: the official `mcp` SDK over the Streamable HTTP transport.

`list_tools` lists a server's tools (every page, bounded) for a sync. `SessionPool` keeps one
initialised session per (URL, credential) for the life of a worker process, so a run does not pay
an MCP handshake per call; a session that broke is replaced on the next call.

Errors are `McpError` with a message fit for an admin (the source's `lastError`) and never the
credential; what owners read (a run's error) names the tool only -- the caller decides.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx
import mcp.types as types
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from agent_engine.bounded_reads import BodyTooLarge, CountingTransport
from agent_engine.domain.mcp import ToolAccess, access_of, cleaned_text

log = logging.getLogger(__name__)
T = TypeVar("T")

# A server that lists more than this is refused at sync (the catalog stays as it was).
MAX_TOOLS = 500
MAX_PAGES = 50
MAX_DESCRIPTION_CHARS = 2_000
MAX_SCHEMA_BYTES = 64_000
# A response larger than this (a listing page or a call result, however sent: with a length,
# chunked or as SSE) fails once that many bytes were read: the worker's memory is bounded.
MAX_RESPONSE_BYTES = 4_000_000
# A listing's pages together (every response of the sync's session).
MAX_LISTING_BYTES = 4_000_000


class McpError(Exception):
    """A server could not be reached, or answered something unusable."""


class TooLarge(McpError):
    """The server's answer was over MAX_RESPONSE_BYTES (no more of it was read), or otherwise
    refused by the transport (compressed unasked)."""


class Unauthorized(McpError):
    """The server answered 401: it does not accept the credential the call carried (an owner's
    token it no longer honours, a shared credential it revoked)."""

    def __init__(self) -> None:
        super().__init__("the server refused the call's credential (HTTP 401)")


@dataclass(frozen=True)
class RemoteTool:
    name: str
    description: str
    input_schema: Any
    access: ToolAccess


@dataclass(frozen=True)
class CallResult:
    text: str
    is_error: bool


def bearer(auth_env: str | None) -> str | None:
    """The credential the variable holds (None when no variable is named or it is empty)."""
    if not auth_env:
        return None
    return os.environ.get(auth_env) or None


TOO_LARGE = f"the server's answer is larger than {MAX_RESPONSE_BYTES} bytes"


class Refusal:
    """Why a response of a session was refused, heard by the side waiting for an answer: the
    SDK's transport swallows what its reading task raises (the request would wait for its
    timeout), so the transport says it here too."""

    def __init__(self) -> None:
        self.event = asyncio.Event()
        self.reason = TOO_LARGE
        self.unauthorized = False

    def error(self) -> McpError:
        return Unauthorized() if self.unauthorized else TooLarge(self.reason)

    def refuse(self, request: httpx.Request, exc: Exception) -> None:
        if request.method == "GET":
            # The server's own stream (no request waits on it): it ends, the SDK re-opens it a
            # bounded number of times.
            return
        if not self.event.is_set():
            self.reason = _refusal_reason(exc)
            self.event.set()

    async def on_response(self, response: httpx.Response) -> None:
        """A 401 is heard at once (the SDK's transport would leave the request waiting for its
        timeout)."""
        unauthorized = response.status_code == 401 and response.request.method == "POST"
        if unauthorized and not self.event.is_set():
            self.unauthorized = True
            self.event.set()


def _refusal_reason(exc: Exception) -> str:
    if isinstance(exc, BodyTooLarge):
        return f"the server's answer is larger than {exc.limit_bytes} bytes"
    return f"the server's answer was refused: {exc}"


def _http_client(
    token: str | None, timeout: float, refusal: Refusal, *, total_limit_bytes: int | None = None
) -> httpx.AsyncClient:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.AsyncClient(
        headers=headers,
        timeout=httpx.Timeout(timeout),
        follow_redirects=False,
        event_hooks={"response": [refusal.on_response]},
        transport=CountingTransport(
            limit_bytes=MAX_RESPONSE_BYTES,
            total_limit_bytes=total_limit_bytes,
            refused=refusal.refuse,
        ),
    )


async def _unless_refused(work: Awaitable[T], refusal: Refusal) -> T:
    """`work`, or TooLarge as soon as a response was refused (over the limit, compressed)."""
    if refusal.event.is_set():
        raise refusal.error()
    task = asyncio.ensure_future(work)
    alarm = asyncio.ensure_future(refusal.event.wait())
    try:
        await asyncio.wait({task, alarm}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
        alarm.cancel()
    if task.cancelled():
        raise refusal.error()
    return task.result()


def _innermost(exc: BaseException) -> BaseException:
    inner = exc
    # anyio task groups wrap what the transport raised.
    while isinstance(inner, BaseExceptionGroup) and inner.exceptions:
        inner = inner.exceptions[0]
    return inner


def _mcp_error(exc: BaseException, refusal: Refusal) -> McpError:
    """What talking to the server raised, as McpError; `Unauthorized` for a 401 however it
    surfaced (the response hook's event, or the transport's HTTPStatusError)."""
    inner = _innermost(exc)
    if isinstance(inner, McpError):
        return inner
    unauthorized = isinstance(inner, httpx.HTTPStatusError) and inner.response.status_code == 401
    if unauthorized or refusal.unauthorized:
        return Unauthorized()
    return McpError(describe(exc))


def describe(exc: BaseException) -> str:
    """A short, credential-free account of why talking to a server failed."""
    inner = _innermost(exc)
    if isinstance(inner, McpError):
        return str(inner)
    if isinstance(inner, TimeoutError):
        return "no answer in time"
    if isinstance(inner, httpx.HTTPStatusError):
        return f"the server answered HTTP {inner.response.status_code}"
    if isinstance(inner, httpx.HTTPError):
        return f"could not reach the server ({type(inner).__name__})"
    return f"{type(inner).__name__}: {str(inner)[:200]}"


@contextlib.asynccontextmanager
async def open_session(
    url: str,
    token: str | None,
    seconds: float,
    refusal: Refusal | None = None,
    *,
    total_limit_bytes: int | None = None,
) -> Any:
    """An initialised session whose every response is capped (MAX_RESPONSE_BYTES each, and
    `total_limit_bytes` over the session when given)."""
    refusal = refusal or Refusal()
    async with (
        _http_client(token, seconds, refusal, total_limit_bytes=total_limit_bytes) as http,
        streamable_http_client(url, http_client=http) as (read, write, _),
        ClientSession(read, write) as session,
    ):
        await _unless_refused(session.initialize(), refusal)
        yield session


async def list_tools(url: str, token: str | None, *, seconds: float) -> list[RemoteTool]:
    """Every tool the server lists (all pages), within `seconds` and MAX_LISTING_BYTES in all."""
    refusal = Refusal()
    try:
        async with (
            asyncio.timeout(seconds),
            open_session(
                url, token, seconds, refusal, total_limit_bytes=MAX_LISTING_BYTES
            ) as session,
        ):
            return await _unless_refused(_all_pages(session), refusal)
    except McpError:
        raise
    except BaseException as exc:
        if not isinstance(exc, Exception | BaseExceptionGroup):
            raise
        raise McpError(describe(exc)) from exc


async def _all_pages(session: ClientSession) -> list[RemoteTool]:
    tools: list[RemoteTool] = []
    cursor: str | None = None
    for _ in range(MAX_PAGES):
        page = await session.list_tools(
            params=types.PaginatedRequestParams(cursor=cursor) if cursor else None
        )
        for tool in page.tools:
            annotations = (
                tool.annotations.model_dump(exclude_none=True) if tool.annotations else None
            )
            tools.append(
                RemoteTool(
                    name=tool.name,
                    description=(tool.description or "")[:MAX_DESCRIPTION_CHARS],
                    input_schema=tool.inputSchema,
                    access=access_of(annotations),
                )
            )
            if len(tools) > MAX_TOOLS:
                raise McpError(f"the server lists more than {MAX_TOOLS} tools")
        cursor = page.nextCursor
        if not cursor:
            return tools
    raise McpError(f"the server's tool list has more than {MAX_PAGES} pages")


def result_text(result: types.CallToolResult) -> str:
    """Text content, cleaned (`domain.mcp.cleaned_text`); other content summarised (the model
    sees words, not bytes)."""
    return cleaned_text(_raw_text(result))


def _raw_text(result: types.CallToolResult) -> str:
    parts: list[str] = []
    for block in result.content:
        if isinstance(block, types.TextContent):
            parts.append(block.text)
        elif isinstance(block, types.ImageContent | types.AudioContent):
            parts.append(f"[{block.type} content, {block.mimeType}, not shown]")
        elif isinstance(block, types.EmbeddedResource):
            resource = block.resource
            if isinstance(resource, types.TextResourceContents):
                parts.append(resource.text)
            else:
                parts.append(f"[resource {resource.uri}, {resource.mimeType or 'binary'}]")
        elif isinstance(block, types.ResourceLink):
            parts.append(f"[resource link {block.uri}]")
    if not parts and result.structuredContent is not None:
        parts.append(json.dumps(result.structuredContent)[:MAX_RESPONSE_BYTES])
    return "\n".join(parts)


class _PooledSession:
    """One initialised session, held open by a task of its own (anyio scopes must be left by the
    task that entered them); calls from any task of the loop go through it."""

    def __init__(self, url: str, token: str | None, timeout: float) -> None:
        self._url, self.token, self._timeout = url, token, timeout
        self._ready: asyncio.Future[ClientSession] = asyncio.get_running_loop().create_future()
        self._closing = asyncio.Event()
        # Set when a response was refused for its size (the session is then dropped).
        self.refusal = Refusal()
        self._task = asyncio.ensure_future(self._hold())
        self.broken = False
        # A call went through on it (a failure then may mean the server forgot the session).
        self.used = False

    async def _hold(self) -> None:
        try:
            async with open_session(self._url, self.token, self._timeout, self.refusal) as session:
                self._ready.set_result(session)
                await self._closing.wait()
        except BaseException as exc:
            self.broken = True
            if not self._ready.done():
                self._ready.set_exception(_mcp_error(exc, self.refusal))
            elif not isinstance(exc, asyncio.CancelledError):
                log.info("an MCP session ended: %s", describe(exc))
        finally:
            self.broken = True

    async def session(self) -> ClientSession:
        return await asyncio.shield(self._ready)

    async def aclose(self) -> None:
        self._closing.set()
        try:
            async with asyncio.timeout(5):
                await self._task
        except (Exception, asyncio.CancelledError):
            self._task.cancel()


class SessionPool:
    """Sessions to MCP servers, one per (URL, credential), for one event loop (a worker process).
    A session that broke (the server restarted, a call was cut) is replaced on the next call."""

    def __init__(self, *, timeout: float) -> None:
        self._timeout = timeout
        # (URL, holder): the holder is "owner:<id>" for an owner's own account (one session per
        # owner and server, replaced when their token is refreshed), else the credential itself.
        self._sessions: dict[tuple[str, str | None], _PooledSession] = {}
        self._lock = asyncio.Lock()
        self._retiring: dict[_PooledSession, asyncio.Task[None]] = {}
        # Sessions opened so far (each one an MCP handshake): what the pool saves shows here.
        self.opened = 0

    async def call(
        self,
        url: str,
        token: str | None,
        tool: str,
        arguments: dict[str, Any],
        *,
        meta: dict[str, Any],
        seconds: float,
        idempotent: bool = False,
        owner_id: int | None = None,
    ) -> CallResult:
        """`tools/call` within `seconds` (raises TimeoutError); McpError when the server cannot be
        reached or the session broke mid-call. `idempotent` (a READ tool): a call that failed on a
        session kept from earlier (the server restarted and forgot it) is tried once more on a
        new session; a WRITE call never is -- the server may have acted. `owner_id`: the token
        is that owner's own (OWNER_OAUTH): their session is kept per (owner, server)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        key = (url, token if owner_id is None else f"owner:{owner_id}")
        pooled, fresh = await self._pooled(key, token)
        try:
            return await self._call_on(pooled, tool, arguments, meta, deadline)
        except McpError as exc:
            await self._drop(key, pooled)
            if fresh or not idempotent or isinstance(exc, TooLarge | Unauthorized):
                raise
        retry, _ = await self._pooled(key, token)
        try:
            return await self._call_on(retry, tool, arguments, meta, deadline)
        except McpError:
            await self._drop(key, retry)
            raise

    async def _call_on(
        self,
        pooled: _PooledSession,
        tool: str,
        arguments: dict[str, Any],
        meta: dict[str, Any],
        deadline: float,
    ) -> CallResult:
        try:
            async with asyncio.timeout_at(deadline):
                session = await pooled.session()
                result = await _unless_refused(
                    session.call_tool(tool, arguments, meta=meta), pooled.refusal
                )
        except TimeoutError:
            await pooled.aclose()
            raise
        except McpError:
            raise
        except Exception as exc:
            raise _mcp_error(exc, pooled.refusal) from exc
        pooled.used = True
        return CallResult(result_text(result), bool(result.isError))

    async def _pooled(
        self, key: tuple[str, str | None], token: str | None
    ) -> tuple[_PooledSession, bool]:
        """The session for `key` and whether it is new (never used for a call)."""
        async with self._lock:
            pooled = self._sessions.get(key)
            if pooled is not None and not pooled.broken and pooled.token != token:
                # The owner's token was refreshed: calls in flight on the old session finish
                # (within the tool timeout) before it closes.
                self._retire(pooled)
                pooled = None
            if pooled is None or pooled.broken:
                if pooled is not None:
                    await pooled.aclose()
                pooled = self._sessions[key] = _PooledSession(key[0], token, self._timeout)
                self.opened += 1
            return pooled, not pooled.used

    def _retire(self, pooled: _PooledSession) -> None:
        async def close_later() -> None:
            await asyncio.sleep(self._timeout)
            self._retiring.pop(pooled, None)
            await pooled.aclose()

        self._retiring[pooled] = asyncio.ensure_future(close_later())

    async def _drop(self, key: tuple[str, str | None], pooled: _PooledSession) -> None:
        async with self._lock:
            if self._sessions.get(key) is pooled:
                del self._sessions[key]
        await pooled.aclose()

    async def aclose(self) -> None:
        sessions = list(self._sessions.values())
        self._sessions.clear()
        for retired, task in list(self._retiring.items()):
            task.cancel()
            sessions.append(retired)
        self._retiring.clear()
        for pooled in sessions:
            await pooled.aclose()
