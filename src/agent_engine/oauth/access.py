"""What a tool call asks for: the run owner's access token at an OWNER_OAUTH source.

`owner_access_token` reads the owner's connection and returns its access token, refreshing it
first when it expires within `REFRESH_MARGIN`. The refresh happens once across every worker: the
caller that needs it locks the connection row (`SELECT … FOR UPDATE`), reads it again and refreshes
only if nobody did meanwhile; the others wait on the lock and find the fresh token. A rotated
refresh token is therefore sent once. A refresh the authorization server refuses marks the
connection EXPIRED (audit `connection.expired`) and raises NotConnected: the run waits for the
owner to connect again. A refresh that fails for another reason (no answer, 5xx) raises
TokenUnavailable, and the connection stays as it was.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from agent_engine.db import connections as connections_db
from agent_engine.oauth import protocol
from agent_engine.oauth.keys import NoTokenKeys, TokenKeys, Undecryptable
from agent_engine.oauth.store import (
    access_purpose,
    client_for,
    record_expired,
    refresh_purpose,
)

log = logging.getLogger(__name__)

REFRESH_MARGIN = timedelta(seconds=60)
USED_PRECISION = timedelta(seconds=60)


class NotConnected(Exception):
    """The owner has no CONNECTED account at the source (none, EXPIRED, or no token keys)."""

    def __init__(self, source_name: str, reason: str = "the account is not connected") -> None:
        super().__init__(f"{reason} (tool source {source_name!r})")
        self.source_name = source_name
        self.reason = reason


class TokenUnavailable(Exception):
    """The token needed a refresh and the authorization server could not be asked (no answer,
    an error of its own): the connection is unchanged; try again later."""


@dataclass(frozen=True, slots=True)
class OwnerToken:
    access_token: str
    account: str | None

    def __repr__(self) -> str:  # never a token in a log line or a traceback
        return f"OwnerToken(account={self.account!r})"


def _engine_of(engine_or_session: AsyncEngine | AsyncConnection) -> AsyncEngine:
    return (
        engine_or_session
        if isinstance(engine_or_session, AsyncEngine)
        else (engine_or_session.engine)
    )


def _fresh(row: connections_db.ConnectionRow, now: datetime) -> bool:
    return row.expires_at is None or row.expires_at - REFRESH_MARGIN > now


async def owner_access_token(
    engine_or_session: AsyncEngine | AsyncConnection,
    *,
    owner_id: int,
    source_id: int,
    keys: TokenKeys | None = None,
    seconds: float = protocol.DEFAULT_SECONDS,
) -> OwnerToken:
    """The owner's access token at the source, fresh (see the module's docstring); marks the
    connection's `last_used_at` (to the minute). One statement when the token is fresh and was
    used within the minute. Its own transactions (never the caller's): a connection passed in
    only gives the engine."""
    engine = _engine_of(engine_or_session)
    async with engine.connect() as conn:
        name, row = await connections_db.connection_for_call(conn, owner_id, source_id)
    source_name = name or str(source_id)
    if row is None or row.status != connections_db.CONNECTED:
        raise NotConnected(source_name)
    try:
        keys = keys or TokenKeys.from_env()
    except NoTokenKeys as exc:
        raise NotConnected(source_name, "the engine has no token keys") from exc
    now = datetime.now(UTC)
    if _fresh(row, now):
        token = _decrypted(keys, row, source_name)
        # lastUsedAt to the minute: a busy owner's calls do not each write the row.
        if row.last_used_at is None or now - row.last_used_at > USED_PRECISION:
            async with engine.begin() as conn:
                await connections_db.mark_used(conn, row.id)
        return OwnerToken(token, row.account)
    return await _refreshed(engine, owner_id, source_id, source_name, keys, seconds)


def _decrypted(keys: TokenKeys, row: connections_db.ConnectionRow, source_name: str) -> str:
    try:
        return keys.decrypt(row.access_token_enc, access_purpose(row.owner_id, row.source_id))
    except Undecryptable as exc:
        raise NotConnected(
            source_name, "the stored tokens cannot be decrypted with AGENT_ENGINE_TOKEN_KEYS"
        ) from exc


async def _refreshed(
    engine: AsyncEngine,
    owner_id: int,
    source_id: int,
    source_name: str,
    keys: TokenKeys,
    seconds: float,
) -> OwnerToken:
    refused: str | None = None
    async with engine.begin() as conn:
        row = await connections_db.fetch_connection(conn, owner_id, source_id, lock=True)
        if row is None or row.status != connections_db.CONNECTED:
            raise NotConnected(source_name)
        now = datetime.now(UTC)
        if _fresh(row, now):  # another worker refreshed while this one waited for the lock
            await connections_db.mark_used(conn, row.id)
            return OwnerToken(_decrypted(keys, row, source_name), row.account)
        usable = row.expires_at is not None and row.expires_at > now
        if row.refresh_token_enc is None:
            if usable:
                await connections_db.mark_used(conn, row.id)
                return OwnerToken(_decrypted(keys, row, source_name), row.account)
            refused = "the token expired and the server gave no refresh token"
        else:
            try:
                refresh_token = keys.decrypt(
                    row.refresh_token_enc, refresh_purpose(owner_id, source_id)
                )
                server, client = await client_for(conn, source_id, keys)
                tokens = await protocol.refresh(
                    server, client, refresh_token=refresh_token, seconds=seconds
                )
            except Undecryptable as exc:
                raise NotConnected(
                    source_name,
                    "the stored tokens cannot be decrypted with AGENT_ENGINE_TOKEN_KEYS",
                ) from exc
            except protocol.Refused as exc:
                refused = str(exc)
            except protocol.OAuthProblem as exc:
                if usable:
                    log.warning("refresh failed, the current token is still valid: %s", exc)
                    await connections_db.mark_used(conn, row.id)
                    return OwnerToken(_decrypted(keys, row, source_name), row.account)
                raise TokenUnavailable(str(exc)) from exc
            else:
                new_refresh = tokens.refresh_token or refresh_token
                await connections_db.write_refreshed(
                    conn,
                    row.id,
                    access=keys.encrypt(tokens.access_token, access_purpose(owner_id, source_id)),
                    refresh=keys.encrypt(new_refresh, refresh_purpose(owner_id, source_id)),
                    expires_at=None
                    if tokens.expires_at is None
                    else datetime.fromtimestamp(tokens.expires_at, UTC),
                    scopes=tokens.scopes or row.scopes,
                )
                await connections_db.mark_used(conn, row.id)
                return OwnerToken(tokens.access_token, row.account)
        await record_expired(conn, row, source_name, refused)
    raise NotConnected(source_name, "the account's tokens expired: connect again")
