"""Statements behind the credential-variable rule (`domain/credentials.py`): which variables the
delivery targets sign with, which ones models send as their key, and the lock that serialises
writes of either.

Both checks are read-then-write: an admin saving a model whose `apiKeyEnv` is X while another
saves a target signing with X would each see the other's table without it. Every write of a
credential or signing variable first takes one transaction-scoped advisory lock, so the second
writer reads the first one's committed row.
"""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

# pg_advisory_xact_lock key ("AEcreden" as eight bytes), well clear of the other keys.
CREDENTIAL_NAMES_LOCK_KEY = int.from_bytes(b"AEcreden", "big") & 0x7FFF_FFFF_FFFF_FFFF

LOCK_CREDENTIAL_NAMES = text("SELECT pg_advisory_xact_lock(:key)")
SIGNING_ENVS = text("SELECT DISTINCT secret_env FROM delivery_targets")
# Every variable sent to a remote as a credential: models' keys and tool sources' bearers.
CREDENTIAL_ENVS = text(
    "SELECT api_key_env FROM agent_models WHERE api_key_env IS NOT NULL"
    " UNION SELECT auth_env FROM tool_sources WHERE auth_env IS NOT NULL"
)


async def lock_credential_names(conn: AsyncConnection) -> None:
    """Serialise credential/signing variable writes until this transaction ends."""
    await conn.execute(LOCK_CREDENTIAL_NAMES, {"key": CREDENTIAL_NAMES_LOCK_KEY})


async def signing_envs(conn: AsyncConnection) -> frozenset[str]:
    return frozenset((await conn.execute(SIGNING_ENVS)).scalars())


async def credential_envs(conn: AsyncConnection) -> frozenset[str]:
    return frozenset((await conn.execute(CREDENTIAL_ENVS)).scalars())
