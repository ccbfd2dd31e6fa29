"""Connecting an owner's account: `start_connection` (the link `connectToolSource` returns) and
`complete_connection` (what `GET /oauth/callback` does with the authorization server's answer).

The `state` is 256 random bits, single use, bound to the owner and the source, and expires in
`STATE_LIFETIME`; only its SHA-256 is stored. The PKCE verifier is kept encrypted with it, so a
code is only ever exchanged with the verifier of the request that asked for it: a code obtained by
another person (another owner's sign-in pasted into someone else's callback) fails at the token
endpoint and connects nobody.
"""

from __future__ import annotations

import hashlib
import importlib
import logging
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from agent_engine.agents import audit
from agent_engine.db import connections as connections_db
from agent_engine.db import tool_sources as sources_db
from agent_engine.db import users as users_db
from agent_engine.oauth import protocol
from agent_engine.oauth.keys import TokenKeys, Undecryptable
from agent_engine.oauth.store import (
    access_purpose,
    client_for,
    client_secret_purpose,
    configured_client,
    connection_details,
    refresh_purpose,
    verifier_purpose,
)

log = logging.getLogger(__name__)

STATE_LIFETIME = timedelta(minutes=10)
CALLBACK_PATH = "/oauth/callback"


def redirect_uri_of(public_url: str) -> str:
    return public_url.rstrip("/") + CALLBACK_PATH


def state_hash(state: str) -> bytes:
    return hashlib.sha256(state.encode()).digest()


@dataclass(frozen=True)
class Started:
    authorization_url: str
    expires_at: datetime


def _scope(source: sources_db.ToolSourceRow, server: protocol.ServerMetadata) -> str | None:
    if source.oauth_scopes:
        return " ".join(source.oauth_scopes)
    if server.resource_scopes:
        return " ".join(server.resource_scopes)
    supported = server.metadata.get("scopes_supported")
    if isinstance(supported, list) and all(isinstance(s, str) for s in supported):
        return " ".join(supported) or None
    return None


async def start_connection(
    engine: AsyncEngine,
    *,
    owner_id: int,
    source: sources_db.ToolSourceRow,
    public_url: str,
    keys: TokenKeys,
    seconds: float = protocol.DEFAULT_SECONDS,
) -> Started:
    """Discovers the source's authorization server, registers the engine there when it has no
    client for this redirect URI yet (under the source's row lock: concurrent first connections
    register once), and records a pending request. Raises protocol.OAuthProblem."""
    redirect_uri = redirect_uri_of(public_url)
    server = await protocol.discover(source.url, seconds=seconds)
    scope = _scope(source, server)
    async with engine.begin() as conn:
        await sources_db.lock_source(conn, source.id)
        configured = configured_client(source)
        known = await connections_db.fetch_client(conn, source.id)
        if configured is not None:
            client = configured
            secret_enc = None
        elif (
            known is not None
            and known.redirect_uri == redirect_uri
            and known.issuer == server.issuer
        ):
            secret_enc = known.client_secret_enc
            secret = (
                None
                if secret_enc is None
                else keys.decrypt(secret_enc, client_secret_purpose(source.id))
            )
            client = protocol.Client(known.client_id, secret)
        else:
            client = await protocol.register(
                server, redirect_uri=redirect_uri, scope=scope, seconds=seconds
            )
            secret_enc = (
                None
                if client.client_secret is None
                else keys.encrypt(client.client_secret, client_secret_purpose(source.id))
            )
        await connections_db.save_client(
            conn,
            source_id=source.id,
            redirect_uri=redirect_uri,
            issuer=server.issuer,
            client_id=client.client_id,
            secret=secret_enc,
            metadata=server.to_json(),
        )
        state = secrets.token_urlsafe(32)
        hashed = state_hash(state)
        pkce = protocol.Pkce.new()
        expires_at = datetime.now(UTC) + STATE_LIFETIME
        await connections_db.insert_state(
            conn,
            state_hash=hashed,
            owner_id=owner_id,
            source_id=source.id,
            verifier_enc=keys.encrypt(pkce.verifier, verifier_purpose(hashed)),
            redirect_uri=redirect_uri,
            issuer=server.issuer,
            expires_at=expires_at,
        )
    url = protocol.authorization_url(
        server,
        client,
        redirect_uri=redirect_uri,
        state=state,
        challenge=pkce.challenge,
        scope=scope,
    )
    return Started(url, expires_at)


@dataclass(frozen=True)
class Outcome:
    ok: bool
    message: str
    source_name: str | None = None
    account: str | None = None
    # The short outcome for AGENT_ENGINE_CONNECT_RETURN_URL (connected, denied, expired, …).
    code: str = "error"


def _fail(code: str, message: str, source_name: str | None = None) -> Outcome:
    return Outcome(False, message, source_name, None, code)


async def complete_connection(
    engine: AsyncEngine,
    params: Mapping[str, str],
    *,
    keys: TokenKeys,
    seconds: float = protocol.DEFAULT_SECONDS,
) -> Outcome:
    """The callback's work. Never raises for what a browser or an authorization server sends:
    every refusal is an Outcome whose message names what went wrong (never a code or token)."""
    state = params.get("state")
    if not state:
        return _fail(
            "bad_state",
            "The answer has no state, so it cannot be matched to a connection you started."
            " Start again from the engine.",
        )
    hashed = state_hash(state)
    async with engine.begin() as conn:
        pending = await connections_db.take_state(conn, hashed)
        source = None if pending is None else await sources_db.fetch_source(conn, pending.source_id)
    if pending is None:
        return _fail(
            "bad_state",
            "This link does not belong to any connection the engine started (unknown state)."
            " Start again from the engine.",
        )
    name = source.name if source is not None else None
    if pending.used_at is not None:
        return _fail(
            "used_state",
            "This link was already used: each connection link works once. Start again.",
            name,
        )
    if pending.expired:
        return _fail(
            "expired_state", "This link expired (links work for 10 minutes). Start again.", name
        )
    if source is None or not source.owner_oauth or not source.enabled:
        return _fail("source_gone", "The tool source no longer takes owners' accounts.", name)
    if error := params.get("error"):
        code = error if error.replace("_", "").isalnum() and len(error) <= 40 else "error"
        if code == "access_denied":
            return _fail("denied", f"You declined the connection to {source.name}.", name)
        return _fail("error", f"The authorization server of {source.name} refused: {code}.", name)
    issuer = params.get("iss")
    if issuer is None:
        async with engine.connect() as conn:
            client_row = await connections_db.fetch_client(conn, source.id)
        advertised = client_row is not None and (
            client_row.server_metadata.get("metadata", {}).get(
                "authorization_response_iss_parameter_supported"
            )
            is True
        )
        if advertised:
            return _fail(
                "issuer_mismatch",
                "The answer does not name its authorization server (iss, RFC 9207), though that"
                " server says it always does; nothing was connected.",
                name,
            )
    elif issuer.rstrip("/") != pending.issuer.rstrip("/"):
        return _fail(
            "issuer_mismatch",
            "The answer names another authorization server than the one asked (iss, RFC 9207);"
            " nothing was connected.",
            name,
        )
    given_code = params.get("code")
    if not given_code:
        return _fail("error", "The authorization server's answer has no code.", name)
    try:
        verifier = keys.decrypt(pending.verifier_enc, verifier_purpose(hashed))
        async with engine.connect() as conn:
            server, client = await client_for(conn, source.id, keys)
            active = await users_db.is_active(conn, pending.owner_id)
        if not active:
            return _fail("error", "This account is deactivated.", name)
        tokens = await protocol.exchange_code(
            server,
            client,
            code=given_code,
            verifier=verifier,
            redirect_uri=pending.redirect_uri,
            seconds=seconds,
        )
    except protocol.Refused as exc:
        log.info("oauth callback for source %s: code refused: %s", source.name, exc)
        return _fail(
            "code_refused",
            f"The authorization server of {source.name} refused the code (it may have been used"
            " already, or it was issued for another sign-in). Nothing was connected; start"
            " again.",
            name,
        )
    except (protocol.OAuthProblem, Undecryptable) as exc:
        return _fail("error", f"Could not finish connecting {source.name}: {exc}", name)
    async with engine.begin() as conn:
        await connections_db.save_connected(
            conn,
            owner_id=pending.owner_id,
            source_id=source.id,
            account=tokens.account,
            scopes=tokens.scopes,
            access=keys.encrypt(tokens.access_token, access_purpose(pending.owner_id, source.id)),
            refresh=None
            if tokens.refresh_token is None
            else keys.encrypt(tokens.refresh_token, refresh_purpose(pending.owner_id, source.id)),
            expires_at=None
            if tokens.expires_at is None
            else datetime.fromtimestamp(tokens.expires_at, UTC),
        )
        await audit.record(
            conn,
            pending.owner_id,
            audit.AuditAction.CONNECTION_CREATED,
            user_id=pending.owner_id,
            details=connection_details(
                source.id, source.name, tokens.account, scopes=list(tokens.scopes)
            ),
        )
    await _tell_waiting_runs(engine, pending.owner_id, source.id)
    return Outcome(True, f"Connected to {source.name}", source.name, tokens.account, "connected")


async def _tell_waiting_runs(engine: AsyncEngine, owner_id: int, source_id: int) -> None:
    """Runs parked on this connection resume (runs.connection_waits.on_connected, part of the
    run side; absent in a build without it)."""
    try:
        module: Any = importlib.import_module("agent_engine.runs.connection_waits")
    except ModuleNotFoundError:
        return
    hook = getattr(module, "on_connected", None)
    if hook is None:
        return
    try:
        await hook(engine, owner_id, source_id)
    except Exception:  # the connection is made; a run the hook missed resumes at its timeout
        log.exception("resuming the runs waiting for a connection failed")


# --- disconnecting ------------------------------------------------------------------------------


async def forget_connection(
    engine: AsyncEngine,
    *,
    owner_id: int,
    source_id: int,
    actor_id: int | None,
    keys: TokenKeys | None,
    seconds: float = protocol.DEFAULT_SECONDS,
) -> tuple[connections_db.ConnectionRow | None, bool]:
    """Revokes the owner's tokens at the source's authorization server when it offers revocation
    (RFC 7009; best effort: a failure is logged and the tokens are forgotten anyway), deletes
    them and records `connection.revoked`. Returns the row forgotten (None: there was none) and
    whether the server confirmed a revocation."""
    async with engine.connect() as conn:
        row = await connections_db.fetch_connection(conn, owner_id, source_id)
        source = await sources_db.fetch_source(conn, source_id)
    revoked = False
    if row is not None and keys is not None:
        try:
            async with engine.connect() as conn:
                server, client = await client_for(conn, source_id, keys)
            if row.refresh_token_enc is not None:
                token = keys.decrypt(row.refresh_token_enc, refresh_purpose(owner_id, source_id))
                revoked = await protocol.revoke(
                    server, client, token=token, hint="refresh_token", seconds=seconds
                )
            token = keys.decrypt(row.access_token_enc, access_purpose(owner_id, source_id))
            revoked = (
                await protocol.revoke(
                    server, client, token=token, hint="access_token", seconds=seconds
                )
                or revoked
            )
        except (protocol.OAuthProblem, Undecryptable) as exc:
            log.warning("revoking the tokens of source %s failed: %s", source_id, exc)
    async with engine.begin() as conn:
        gone = await connections_db.delete_connection(conn, owner_id, source_id)
        if gone is not None:
            await audit.record(
                conn,
                actor_id,
                audit.AuditAction.CONNECTION_REVOKED,
                user_id=owner_id,
                details=connection_details(
                    source_id,
                    source.name if source is not None else str(source_id),
                    gone.account,
                    revokedAtServer=revoked,
                ),
            )
    return gone, revoked


async def forget_owner_connections(
    engine: AsyncEngine, *, owner_id: int, actor_id: int | None, keys: TokenKeys | None
) -> int:
    """Every connection of the owner, revoked and forgotten (deactivateOwner)."""
    async with engine.connect() as conn:
        rows = await connections_db.owner_connections(conn, owner_id)
    for row in rows:
        await forget_connection(
            engine, owner_id=owner_id, source_id=row.source_id, actor_id=actor_id, keys=keys
        )
    return len(rows)
