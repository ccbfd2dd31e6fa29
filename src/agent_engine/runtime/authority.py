"""Whose authority an MCP tool call carries (DESIGN §12).

- `none`: no credential;
- `shared`: the source's one credential (the variable `authEnv` names), the owner only a hint in
  `_meta`;
- `owner_oauth`: the run owner's own access token at the server, and nothing else -- never the
  shared credential, never the engine's own sign-in token. No CONNECTED account: `authority`
  answers None, and the run waits for the owner (`runs/connection_waits.py`).

A server that answers 401 to the owner's token (`expire`) no longer honours it: the connection
becomes EXPIRED (audit `connection.expired`) and the owner must connect again.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from sqlalchemy.ext.asyncio import AsyncEngine

from agent_engine.db import connections as connections_db
from agent_engine.oauth.access import NotConnected, TokenUnavailable, owner_access_token
from agent_engine.oauth.store import record_expired
from agent_engine.runtime.tools.spec import OWNER_OAUTH, McpTool
from agent_engine.tool_sources.client import bearer

log = logging.getLogger(__name__)

SHARED = "shared"
NONE = "none"


class AuthorityUnavailable(Exception):
    """The owner's token could not be had now (its refresh found no answer): the call fails
    naming the source, the connection stays as it was."""


@dataclass(frozen=True, slots=True)
class Authority:
    kind: str  # "none" | "shared" | "owner_oauth"
    token: str | None
    # The owner's account at the server (owner_oauth), as its authorization server named it.
    account: str | None = None
    owner_id: int | None = None

    def __repr__(self) -> str:  # never a token in a log line or a traceback
        return f"Authority(kind={self.kind!r}, account={self.account!r})"


def not_connected_message(source: str) -> str:
    """What the model hears when the owner did not connect in time."""
    return (
        f"the account at {source} is not connected: the owner has not connected their account"
        " at this tool source, so the call was not made"
    )


async def authority(engine: AsyncEngine, tool: McpTool, *, owner_id: int) -> Authority | None:
    """The credential a call of `tool` by `owner_id`'s agent carries; None when the tool needs
    the owner's own account and they have no CONNECTED one."""
    if tool.auth != OWNER_OAUTH:
        return Authority(SHARED if tool.auth_env else NONE, bearer(tool.auth_env))
    if tool.source_id is None:
        return None
    try:
        owned = await owner_access_token(engine, owner_id=owner_id, source_id=tool.source_id)
    except NotConnected as exc:
        log.info("owner %s has no connected account at %s: %s", owner_id, tool.source, exc.reason)
        return None
    except TokenUnavailable as exc:
        raise AuthorityUnavailable(
            f"the account at {tool.source} could not be refreshed now; try again later"
        ) from exc
    return Authority(OWNER_OAUTH, owned.access_token, owned.account, owner_id)


async def expire(engine: AsyncEngine, tool: McpTool, *, owner_id: int) -> None:
    """The server refused the owner's token (401): their connection becomes EXPIRED."""
    if tool.source_id is None:
        return
    async with engine.begin() as conn:
        row = await connections_db.fetch_connection(conn, owner_id, tool.source_id, lock=True)
        if row is not None and row.status == connections_db.CONNECTED:
            await record_expired(conn, row, tool.source, "the server refused the token (HTTP 401)")
