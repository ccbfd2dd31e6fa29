"""Statements on owners' accounts at OWNER_OAUTH sources (`tool_connections`), the pending
authorization requests (`oauth_states`) and the engine's client at a source's authorization
server (`tool_source_oauth_clients`). Tokens come and go only as ciphertext
(agent_engine.oauth.keys); these statements never see a plaintext token."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from agent_engine.db.rows import AnyRow, columns

CONNECTED = "connected"
EXPIRED = "expired"


@dataclass(frozen=True, slots=True)
class ConnectionRow:
    id: int
    owner_id: int
    source_id: int
    status: str
    account: str | None
    scopes: tuple[str, ...]
    access_token_enc: bytes
    refresh_token_enc: bytes | None
    expires_at: datetime | None
    connected_at: datetime
    last_used_at: datetime | None
    refreshed_at: datetime | None

    @classmethod
    def from_row(cls, row: AnyRow) -> ConnectionRow:
        values = columns(row)
        refresh = values["refresh_token_enc"]
        return cls(
            id=int(values["id"]),
            owner_id=int(values["owner_id"]),
            source_id=int(values["source_id"]),
            status=values["status"],
            account=values["account"],
            scopes=tuple(values["scopes"] or ()),
            access_token_enc=bytes(values["access_token_enc"]),
            refresh_token_enc=None if refresh is None else bytes(refresh),
            expires_at=values["expires_at"],
            connected_at=values["connected_at"],
            last_used_at=values["last_used_at"],
            refreshed_at=values["refreshed_at"],
        )


@dataclass(frozen=True, slots=True)
class ViewerConnection:
    """One enabled OWNER_OAUTH source and the viewer's account there (None: not connected)."""

    source_id: int
    source_name: str
    status: str | None
    account: str | None
    scopes: tuple[str, ...]
    connected_at: datetime | None
    last_used_at: datetime | None


@dataclass(frozen=True, slots=True)
class StateRow:
    owner_id: int
    source_id: int
    verifier_enc: bytes
    redirect_uri: str
    issuer: str
    expires_at: datetime
    used_at: datetime | None
    expired: bool


@dataclass(frozen=True, slots=True)
class ClientRow:
    source_id: int
    redirect_uri: str
    issuer: str
    client_id: str
    client_secret_enc: bytes | None
    server_metadata: dict[str, Any]


SELECT_CONNECTION = text(
    "SELECT * FROM tool_connections WHERE owner_id = :owner_id AND source_id = :source_id"
)
LOCK_CONNECTION = text(
    "SELECT * FROM tool_connections WHERE owner_id = :owner_id AND source_id = :source_id"
    " FOR UPDATE"
)
UPSERT_CONNECTED = text(
    """
    INSERT INTO tool_connections (owner_id, source_id, status, account, scopes,
                                  access_token_enc, refresh_token_enc, expires_at)
    VALUES (:owner_id, :source_id, 'connected', :account, CAST(:scopes AS text[]),
            :access, :refresh, :expires_at)
    ON CONFLICT (owner_id, source_id) DO UPDATE SET
        status = 'connected', account = EXCLUDED.account, scopes = EXCLUDED.scopes,
        access_token_enc = EXCLUDED.access_token_enc,
        refresh_token_enc = EXCLUDED.refresh_token_enc, expires_at = EXCLUDED.expires_at,
        connected_at = now(), refreshed_at = NULL, updated_at = now()
    RETURNING id
    """
)
WRITE_REFRESHED = text(
    """
    UPDATE tool_connections SET access_token_enc = :access, refresh_token_enc = :refresh,
           expires_at = :expires_at, scopes = CAST(:scopes AS text[]), refreshed_at = now(),
           updated_at = now()
     WHERE id = :id
    """
)
MARK_EXPIRED = text(
    "UPDATE tool_connections SET status = 'expired', updated_at = now()"
    " WHERE id = :id AND status = 'connected' RETURNING id"
)
MARK_USED = text("UPDATE tool_connections SET last_used_at = now() WHERE id = :id")
# A call's read: the source's name and the owner's connection there (if any), in one statement.
CONNECTION_FOR_CALL = text(
    """
    SELECT s.name AS source_name, c.*
      FROM tool_sources s
      LEFT JOIN tool_connections c ON c.source_id = s.id AND c.owner_id = :owner_id
     WHERE s.id = :source_id
    """
)
DELETE_CONNECTION = text(
    "DELETE FROM tool_connections WHERE owner_id = :owner_id AND source_id = :source_id RETURNING *"
)
OWNER_CONNECTIONS = text("SELECT * FROM tool_connections WHERE owner_id = :owner_id ORDER BY id")
VIEWER_CONNECTIONS = text(
    """
    SELECT s.id AS source_id, s.name AS source_name, c.status, c.account, c.scopes,
           c.connected_at, c.last_used_at
      FROM tool_sources s
      LEFT JOIN tool_connections c ON c.source_id = s.id AND c.owner_id = :owner_id
     WHERE s.enabled AND s.auth = 'owner_oauth'
     ORDER BY s.name
    """
)
CONNECTED_COUNTS = text(
    "SELECT source_id, count(*) AS n FROM tool_connections"
    " WHERE status = 'connected' AND source_id = ANY(CAST(:ids AS bigint[])) GROUP BY source_id"
)
ANY_OWNER_OAUTH_SOURCE = text(
    "SELECT EXISTS (SELECT 1 FROM tool_sources WHERE auth = 'owner_oauth')"
)

INSERT_STATE = text(
    "INSERT INTO oauth_states (state_hash, owner_id, source_id, verifier_enc, redirect_uri,"
    " issuer, expires_at) VALUES (:state_hash, :owner_id, :source_id, :verifier_enc,"
    " :redirect_uri, :issuer, :expires_at)"
)
# Single use: the first callback to take the row marks it; any later one finds used_at set.
TAKE_STATE = text(
    """
    WITH old AS (SELECT * FROM oauth_states WHERE state_hash = :state_hash FOR UPDATE),
    taken AS (
        UPDATE oauth_states s SET used_at = now()
          FROM old WHERE s.state_hash = old.state_hash AND old.used_at IS NULL
        RETURNING s.state_hash
    )
    SELECT old.*, old.expires_at <= now() AS expired, old.used_at AS was_used
      FROM old
    """
)
FORGET_OLD_STATES = text("DELETE FROM oauth_states WHERE expires_at < now() - interval '1 day'")

SELECT_CLIENT = text("SELECT * FROM tool_source_oauth_clients WHERE source_id = :source_id")
UPSERT_CLIENT = text(
    """
    INSERT INTO tool_source_oauth_clients (source_id, redirect_uri, issuer, client_id,
                                           client_secret_enc, server_metadata)
    VALUES (:source_id, :redirect_uri, :issuer, :client_id, :secret, CAST(:metadata AS jsonb))
    ON CONFLICT (source_id) DO UPDATE SET
        redirect_uri = EXCLUDED.redirect_uri, issuer = EXCLUDED.issuer,
        client_id = EXCLUDED.client_id, client_secret_enc = EXCLUDED.client_secret_enc,
        server_metadata = EXCLUDED.server_metadata, created_at = now()
    """
)
DELETE_CLIENT = text("DELETE FROM tool_source_oauth_clients WHERE source_id = :source_id")

# Rotation: every stored ciphertext, by table and key.
ALL_CONNECTION_SECRETS = text(
    "SELECT id, owner_id, source_id, access_token_enc, refresh_token_enc FROM tool_connections"
    " ORDER BY id FOR UPDATE"
)
REWRITE_CONNECTION_SECRETS = text(
    "UPDATE tool_connections SET access_token_enc = :access, refresh_token_enc = :refresh"
    " WHERE id = :id"
)
ALL_CLIENT_SECRETS = text(
    "SELECT source_id, client_secret_enc FROM tool_source_oauth_clients"
    " WHERE client_secret_enc IS NOT NULL ORDER BY source_id FOR UPDATE"
)
REWRITE_CLIENT_SECRET = text(
    "UPDATE tool_source_oauth_clients SET client_secret_enc = :secret WHERE source_id = :source_id"
)
ALL_STATE_VERIFIERS = text(
    "SELECT state_hash, verifier_enc FROM oauth_states WHERE used_at IS NULL FOR UPDATE"
)
REWRITE_STATE_VERIFIER = text(
    "UPDATE oauth_states SET verifier_enc = :verifier WHERE state_hash = :state_hash"
)


async def fetch_connection(
    conn: AsyncConnection, owner_id: int, source_id: int, *, lock: bool = False
) -> ConnectionRow | None:
    statement = LOCK_CONNECTION if lock else SELECT_CONNECTION
    params = {"owner_id": owner_id, "source_id": source_id}
    row = (await conn.execute(statement, params)).mappings().one_or_none()
    return None if row is None else ConnectionRow.from_row(row)


async def connection_for_call(
    conn: AsyncConnection, owner_id: int, source_id: int
) -> tuple[str | None, ConnectionRow | None]:
    """(the source's name, None when the source is gone; the owner's connection, if any)."""
    params = {"owner_id": owner_id, "source_id": source_id}
    row = (await conn.execute(CONNECTION_FOR_CALL, params)).mappings().one_or_none()
    if row is None:
        return None, None
    name = str(row["source_name"])
    return name, None if row["id"] is None else ConnectionRow.from_row(row)


async def save_connected(
    conn: AsyncConnection,
    *,
    owner_id: int,
    source_id: int,
    account: str | None,
    scopes: Sequence[str],
    access: bytes,
    refresh: bytes | None,
    expires_at: datetime | None,
) -> int:
    params = {
        "owner_id": owner_id,
        "source_id": source_id,
        "account": account,
        "scopes": list(scopes),
        "access": access,
        "refresh": refresh,
        "expires_at": expires_at,
    }
    return int((await conn.execute(UPSERT_CONNECTED, params)).scalar_one())


async def write_refreshed(
    conn: AsyncConnection,
    connection_id: int,
    *,
    access: bytes,
    refresh: bytes | None,
    expires_at: datetime | None,
    scopes: Sequence[str],
) -> None:
    await conn.execute(
        WRITE_REFRESHED,
        {
            "id": connection_id,
            "access": access,
            "refresh": refresh,
            "expires_at": expires_at,
            "scopes": list(scopes),
        },
    )


async def mark_expired(conn: AsyncConnection, connection_id: int) -> bool:
    return (await conn.execute(MARK_EXPIRED, {"id": connection_id})).first() is not None


async def mark_used(conn: AsyncConnection, connection_id: int) -> None:
    await conn.execute(MARK_USED, {"id": connection_id})


async def delete_connection(
    conn: AsyncConnection, owner_id: int, source_id: int
) -> ConnectionRow | None:
    params = {"owner_id": owner_id, "source_id": source_id}
    row = (await conn.execute(DELETE_CONNECTION, params)).mappings().one_or_none()
    return None if row is None else ConnectionRow.from_row(row)


async def owner_connections(conn: AsyncConnection, owner_id: int) -> list[ConnectionRow]:
    rows = await conn.execute(OWNER_CONNECTIONS, {"owner_id": owner_id})
    return [ConnectionRow.from_row(r) for r in rows.mappings()]


async def viewer_connections(conn: AsyncConnection, owner_id: int) -> list[ViewerConnection]:
    rows = await conn.execute(VIEWER_CONNECTIONS, {"owner_id": owner_id})
    return [
        ViewerConnection(
            source_id=int(r["source_id"]),
            source_name=r["source_name"],
            status=r["status"],
            account=r["account"],
            scopes=tuple(r["scopes"] or ()),
            connected_at=r["connected_at"],
            last_used_at=r["last_used_at"],
        )
        for r in rows.mappings()
    ]


async def connected_counts(conn: AsyncConnection, source_ids: Sequence[int]) -> dict[int, int]:
    rows = await conn.execute(CONNECTED_COUNTS, {"ids": list(source_ids)})
    return {int(r["source_id"]): int(r["n"]) for r in rows.mappings()}


async def any_owner_oauth_source(conn: AsyncConnection) -> bool:
    return bool((await conn.execute(ANY_OWNER_OAUTH_SOURCE)).scalar_one())


async def insert_state(
    conn: AsyncConnection,
    *,
    state_hash: bytes,
    owner_id: int,
    source_id: int,
    verifier_enc: bytes,
    redirect_uri: str,
    issuer: str,
    expires_at: datetime,
) -> None:
    await conn.execute(FORGET_OLD_STATES)
    await conn.execute(
        INSERT_STATE,
        {
            "state_hash": state_hash,
            "owner_id": owner_id,
            "source_id": source_id,
            "verifier_enc": verifier_enc,
            "redirect_uri": redirect_uri,
            "issuer": issuer,
            "expires_at": expires_at,
        },
    )


async def take_state(conn: AsyncConnection, state_hash: bytes) -> StateRow | None:
    """The request `state_hash` names, marked used (single use). `used_at` is set on the row
    returned when an earlier callback had taken it; None when no such request exists."""
    row = (await conn.execute(TAKE_STATE, {"state_hash": state_hash})).mappings().one_or_none()
    if row is None:
        return None
    return StateRow(
        owner_id=int(row["owner_id"]),
        source_id=int(row["source_id"]),
        verifier_enc=bytes(row["verifier_enc"]),
        redirect_uri=row["redirect_uri"],
        issuer=row["issuer"],
        expires_at=row["expires_at"],
        used_at=row["was_used"],
        expired=bool(row["expired"]),
    )


async def fetch_client(conn: AsyncConnection, source_id: int) -> ClientRow | None:
    row = (await conn.execute(SELECT_CLIENT, {"source_id": source_id})).mappings().one_or_none()
    if row is None:
        return None
    secret = row["client_secret_enc"]
    return ClientRow(
        source_id=int(row["source_id"]),
        redirect_uri=row["redirect_uri"],
        issuer=row["issuer"],
        client_id=row["client_id"],
        client_secret_enc=None if secret is None else bytes(secret),
        server_metadata=dict(row["server_metadata"]),
    )


async def save_client(
    conn: AsyncConnection,
    *,
    source_id: int,
    redirect_uri: str,
    issuer: str,
    client_id: str,
    secret: bytes | None,
    metadata: dict[str, Any],
) -> None:
    await conn.execute(
        UPSERT_CLIENT,
        {
            "source_id": source_id,
            "redirect_uri": redirect_uri,
            "issuer": issuer,
            "client_id": client_id,
            "secret": secret,
            "metadata": json.dumps(metadata),
        },
    )


async def forget_client(conn: AsyncConnection, source_id: int) -> None:
    await conn.execute(DELETE_CLIENT, {"source_id": source_id})
