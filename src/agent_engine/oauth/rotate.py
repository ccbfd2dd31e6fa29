"""Re-encrypting every stored secret with the first key of AGENT_ENGINE_TOKEN_KEYS
(`agent-engine rotate-token-keys`): owners' access and refresh tokens, the engine's client
secrets and pending PKCE verifiers. One transaction, rows locked: a refresh running meanwhile
waits and then writes with the first key itself. Idempotent."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy.ext.asyncio import AsyncEngine

from agent_engine.db import connections as connections_db
from agent_engine.oauth.keys import TokenKeys
from agent_engine.oauth.store import (
    access_purpose,
    client_secret_purpose,
    refresh_purpose,
    verifier_purpose,
)


@dataclass(frozen=True)
class Rotated:
    connections: int
    clients: int
    states: int


async def rotate_token_keys(engine: AsyncEngine, keys: TokenKeys) -> Rotated:
    """Raises keys.Undecryptable (and changes nothing) when a value decrypts with no key."""
    connections = clients = states = 0
    async with engine.begin() as conn:
        for row in (await conn.execute(connections_db.ALL_CONNECTION_SECRETS)).mappings():
            owner, source = int(row["owner_id"]), int(row["source_id"])
            refresh = row["refresh_token_enc"]
            await conn.execute(
                connections_db.REWRITE_CONNECTION_SECRETS,
                {
                    "id": row["id"],
                    "access": keys.reencrypt(
                        bytes(row["access_token_enc"]), access_purpose(owner, source)
                    ),
                    "refresh": None
                    if refresh is None
                    else keys.reencrypt(bytes(refresh), refresh_purpose(owner, source)),
                },
            )
            connections += 1
        for row in (await conn.execute(connections_db.ALL_CLIENT_SECRETS)).mappings():
            source = int(row["source_id"])
            await conn.execute(
                connections_db.REWRITE_CLIENT_SECRET,
                {
                    "source_id": source,
                    "secret": keys.reencrypt(
                        bytes(row["client_secret_enc"]), client_secret_purpose(source)
                    ),
                },
            )
            clients += 1
        for row in (await conn.execute(connections_db.ALL_STATE_VERIFIERS)).mappings():
            hashed = bytes(row["state_hash"])
            await conn.execute(
                connections_db.REWRITE_STATE_VERIFIER,
                {
                    "state_hash": hashed,
                    "verifier": keys.reencrypt(
                        bytes(row["verifier_enc"]), verifier_purpose(hashed)
                    ),
                },
            )
            states += 1
    return Rotated(connections, clients, states)
