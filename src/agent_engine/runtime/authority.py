"""Whose authority an MCP tool call carries (DESIGN §12).

- `none`: no credential;
- `shared`: the source's one credential (the variable `authEnv` names), the owner only a hint in
  `_meta`;
- `owner_oauth`: the run owner's own access token at the server, and nothing else -- never the
  shared credential, never the engine's own sign-in token. No CONNECTED account: `authority`
  answers None, and the run waits for the owner (`runs/connection_waits.py`).

A server that answers 401 to the owner's token (`expire`) no longer honours it: the connection
becomes EXPIRED (audit `connection.expired`) and the owner must connect again.

The owner's token costs one read per call (`db/connection_use.py`; `last_used_at` written to the
minute); the parsed keys and the decryption of an unchanged ciphertext are kept in this process.
A token near its expiry, and every refusal, go through `oauth.access.owner_access_token` (the
refresh, once across workers).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy.ext.asyncio import AsyncEngine

from agent_engine.db import connections as connections_db
from agent_engine.db.connection_use import connected_for_call, mark_used
from agent_engine.oauth.access import (
    REFRESH_MARGIN,
    USED_PRECISION,
    NotConnected,
    TokenUnavailable,
    owner_access_token,
)
from agent_engine.oauth.keys import ENV as TOKEN_KEYS_ENV
from agent_engine.oauth.keys import NoTokenKeys, TokenKeys, Undecryptable
from agent_engine.oauth.store import access_purpose, record_expired
from agent_engine.runtime.tools.spec import OWNER_OAUTH, McpTool
from agent_engine.tool_sources.client import bearer

log = logging.getLogger(__name__)

SHARED = "shared"
NONE = "none"
# Decrypted tokens by their ciphertext (a refresh writes a new ciphertext): bounded.
PLAINTEXT_CACHE_MAX = 10_000

_keys: tuple[str, TokenKeys] | None = None
_plaintexts: dict[bytes, str] = {}


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
    fast = await _fresh_token(engine, owner_id=owner_id, source_id=tool.source_id)
    if fast is not None:
        return fast
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


async def _fresh_token(engine: AsyncEngine, *, owner_id: int, source_id: int) -> Authority | None:
    """The owner's token in one statement when it is CONNECTED and not near its expiry; None
    sends the caller the long way (no connection, a refresh due, no keys, undecryptable)."""
    used = await connected_for_call(engine, owner_id=owner_id, source_id=source_id)
    if used is None:
        return None
    now = datetime.now(UTC)
    if used.expires_at is not None and used.expires_at - REFRESH_MARGIN <= now:
        return None
    token = _plaintexts.get(used.access_token_enc)
    if token is None:
        keys = _token_keys()
        if keys is None:
            return None
        try:
            token = keys.decrypt(used.access_token_enc, access_purpose(owner_id, source_id))
        except Undecryptable:
            return None
        if len(_plaintexts) >= PLAINTEXT_CACHE_MAX:
            _plaintexts.clear()
        _plaintexts[used.access_token_enc] = token
    if used.last_used_at is None or now - used.last_used_at > USED_PRECISION:
        await mark_used(engine, used.id)
    return Authority(OWNER_OAUTH, token, used.account, owner_id)


def _token_keys() -> TokenKeys | None:
    """AGENT_ENGINE_TOKEN_KEYS parsed once per value (a rotation changes the value)."""
    global _keys
    value = os.environ.get(TOKEN_KEYS_ENV) or ""
    if _keys is None or _keys[0] != value:
        try:
            _keys = (value, TokenKeys.parse(value))
        except (NoTokenKeys, ValueError):
            return None
    return _keys[1]


async def expire(engine: AsyncEngine, tool: McpTool, *, owner_id: int) -> None:
    """The server refused the owner's token (401): their connection becomes EXPIRED."""
    if tool.source_id is None:
        return
    async with engine.begin() as conn:
        row = await connections_db.fetch_connection(conn, owner_id, tool.source_id, lock=True)
        if row is not None and row.status == connections_db.CONNECTED:
            await record_expired(conn, row, tool.source, "the server refused the token (HTTP 401)")
