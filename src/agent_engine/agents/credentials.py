"""Checking a credential or signing variable against what is stored, under one lock.

A model's key variable may not be one a delivery target signs with, and the reverse
(`domain/credentials.py`). Each check takes the credential-names lock first (`db/credentials.py`)
in the writing transaction, so two admins saving a model and a target naming the same variable
at the same moment are serialised: the second sees the first's row and is refused.
"""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy.ext.asyncio import AsyncConnection

from agent_engine.db import credentials as credentials_sql
from agent_engine.domain.credentials import credential_env_problem, signing_env_problem


async def credential_key_problem(
    conn: AsyncConnection, name: str | None, *, allowed_prefixes: Iterable[str] = ()
) -> str | None:
    """Why the variable `name` may not be sent as a credential -- a model's `apiKeyEnv`, a tool
    source's `authEnv` (None: it may). Call inside the transaction that writes the row."""
    prefixes = tuple(allowed_prefixes)
    if problem := credential_env_problem(name, allowed_prefixes=prefixes):
        return problem  # refused on its own: no need to read or lock anything
    if name is None:
        return None
    await credentials_sql.lock_credential_names(conn)
    return credential_env_problem(
        name,
        signing_envs=await credentials_sql.signing_envs(conn),
        allowed_prefixes=prefixes,
    )


async def target_secret_problem(conn: AsyncConnection, name: str) -> str | None:
    """Why a delivery target may not sign with the variable `name` (None: it may). Call inside
    the transaction that writes the target."""
    if problem := signing_env_problem(name):
        return problem
    await credentials_sql.lock_credential_names(conn)
    return signing_env_problem(name, credential_envs=await credentials_sql.credential_envs(conn))
