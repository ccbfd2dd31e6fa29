"""MCP tool calls of one runtime: the authority each call carries (`runtime/authority.py`) and
the sessions it goes on (`tool_sources.client.SessionPool`, one per server and credential, one per
owner and server for OWNER_OAUTH: no handshake per call).

A call carries exactly one credential. A server refusing it (401) fails the call naming the
source -- and for the owner's own token, their connection becomes EXPIRED. An unreachable server
fails it naming the tool (its URL stays in the worker log); a tool error the server reports goes
back to the model.
"""

from __future__ import annotations

import logging
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from agent_engine.runtime.authority import (
    Authority,
    AuthorityUnavailable,
    authority,
    expire,
    not_connected_message,
)
from agent_engine.runtime.credentials import CredentialGuard, CredentialRefused
from agent_engine.runtime.tools.mcp import call_meta
from agent_engine.runtime.tools.spec import (
    McpTool,
    ToolCallContext,
    ToolError,
    ToolFailed,
    ToolHandler,
)
from agent_engine.tool_sources.client import McpError, SessionPool, TooLarge, Unauthorized

log = logging.getLogger(__name__)


class McpCalls:
    def __init__(
        self, engine: AsyncEngine, credentials: CredentialGuard, *, timeout_seconds: float
    ) -> None:
        self._engine = engine
        self._credentials = credentials
        self._timeout_seconds = timeout_seconds
        self.sessions = SessionPool(timeout=timeout_seconds)

    async def aclose(self) -> None:
        await self.sessions.aclose()

    def handler(self, tool: McpTool) -> ToolHandler:
        """The tool's handler when called on its own (the loop resolves the authority first, to
        park a run whose owner has not connected)."""

        async def call(ctx: ToolCallContext, arguments: dict[str, Any]) -> str:
            held = await self.authority(tool, ctx)
            if held is None:
                raise ToolError(not_connected_message(tool.source))
            return await self.call(tool, held, ctx, arguments)

        return call

    async def authority(self, tool: McpTool, ctx: ToolCallContext) -> Authority | None:
        """The credential the call carries; None: the owner has no CONNECTED account at the
        tool's OWNER_OAUTH source."""
        try:
            return await authority(self._engine, tool, owner_id=ctx.owner_id)
        except AuthorityUnavailable as exc:
            raise ToolFailed(tool.name, str(exc)) from exc

    async def call(
        self, tool: McpTool, held: Authority, ctx: ToolCallContext, arguments: dict[str, Any]
    ) -> str:
        """One `tools/call` carrying `held` and nothing else: the owner's token for an
        OWNER_OAUTH source (on a session of that owner's), the source's credential for SHARED."""
        if tool.auth_env:
            try:
                # Checked again before each send, as for models: a row written before the rule
                # or straight in SQL sends nothing.
                await self._credentials.check(tool.auth_env, what=f"the source of tool {tool.name}")
            except CredentialRefused as exc:
                raise ToolFailed(
                    tool.name, "its source's credential variable is not allowed"
                ) from exc
        try:
            result = await self.sessions.call(
                tool.url,
                held.token,
                tool.remote_name,
                arguments,
                meta=call_meta(owner_id=ctx.owner_id, agent_id=ctx.agent_id, run_id=ctx.run_id),
                seconds=self._timeout_seconds,
                idempotent=tool.access == "read",
                owner_id=held.owner_id,
            )
        except Unauthorized as exc:
            log.warning("MCP tool %s in run %s: %s", tool.name, ctx.run_id, exc)
            if held.owner_id is not None:
                await expire(self._engine, tool, owner_id=held.owner_id)
                raise ToolFailed(
                    tool.name,
                    f"the server of tool source {tool.source} refused the owner's account"
                    " (HTTP 401); the connection is now expired: connect it again",
                ) from exc
            raise ToolFailed(
                tool.name, f"the server of tool source {tool.source} refused its credential"
            ) from exc
        except TooLarge as exc:
            raise ToolFailed(tool.name, str(exc)) from exc
        except McpError as exc:
            # The URL stays in the worker log; the run names the tool.
            log.warning("MCP tool %s in run %s: %s", tool.name, ctx.run_id, exc)
            raise ToolFailed(tool.name, "its server could not be reached") from exc
        if result.is_error:
            raise ToolError(result.text or "the tool reported an error")
        return result.text
