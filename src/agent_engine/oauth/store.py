"""The stored side of connections: the associated data each ciphertext is bound to, the engine's
client at a source's authorization server (found, registered or configured), and the audit
entries of a connection's life."""

from __future__ import annotations

import os
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection

from agent_engine.agents import audit
from agent_engine.db import connections as connections_db
from agent_engine.db import tool_sources as sources_db
from agent_engine.oauth import protocol
from agent_engine.oauth.keys import TokenKeys


def access_purpose(owner_id: int, source_id: int) -> str:
    return f"tool_connections.access:{owner_id}:{source_id}"


def refresh_purpose(owner_id: int, source_id: int) -> str:
    return f"tool_connections.refresh:{owner_id}:{source_id}"


def client_secret_purpose(source_id: int) -> str:
    return f"tool_source_oauth_clients.secret:{source_id}"


def verifier_purpose(state_hash: bytes) -> str:
    return f"oauth_states.verifier:{state_hash.hex()}"


class NotConfigured(protocol.OAuthProblem):
    """The source's configured client variables are not set on this process."""


def configured_client(source: sources_db.ToolSourceRow) -> protocol.Client | None:
    """The client an admin configured (oauthClientIdEnv/oauthClientSecretEnv), or None."""
    if not source.oauth_client_id_env:
        return None
    client_id = os.environ.get(source.oauth_client_id_env)
    if not client_id:
        raise NotConfigured(
            f"the variable {source.oauth_client_id_env} (oauthClientIdEnv) is not set on the engine"
        )
    secret = None
    if source.oauth_client_secret_env:
        secret = os.environ.get(source.oauth_client_secret_env) or None
        if secret is None:
            raise NotConfigured(
                f"the variable {source.oauth_client_secret_env} (oauthClientSecretEnv) is not set"
                " on the engine"
            )
    return protocol.Client(client_id, secret)


async def client_for(
    conn: AsyncConnection, source_id: int, keys: TokenKeys
) -> tuple[protocol.ServerMetadata, protocol.Client]:
    """The authorization server and client a connection of the source was made with."""
    row = await connections_db.fetch_client(conn, source_id)
    source = await sources_db.fetch_source(conn, source_id)
    if row is None or source is None:
        raise protocol.Refused("the engine's registration at the authorization server is gone")
    server = protocol.ServerMetadata.from_json(row.server_metadata)
    configured = configured_client(source)
    if configured is not None:
        return server, configured
    secret = (
        None
        if row.client_secret_enc is None
        else keys.decrypt(row.client_secret_enc, client_secret_purpose(source_id))
    )
    return server, protocol.Client(row.client_id, secret)


def connection_details(
    source_id: int, source_name: str, account: str | None, **more: Any
) -> dict[str, Any]:
    return {"sourceId": str(source_id), "source": source_name, "account": account, **more}


async def record_expired(
    conn: AsyncConnection,
    row: connections_db.ConnectionRow,
    source_name: str,
    why: str | None,
) -> None:
    """The connection becomes EXPIRED (once: a second caller finds it so) and the audit says so."""
    if await connections_db.mark_expired(conn, row.id):
        await audit.record(
            conn,
            None,
            audit.AuditAction.CONNECTION_EXPIRED,
            user_id=row.owner_id,
            details=connection_details(row.source_id, source_name, row.account, reason=why),
        )
