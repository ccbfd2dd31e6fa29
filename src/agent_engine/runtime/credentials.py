"""The last check before a credential leaves the worker: `CredentialGuard.check`.

It lives in `agents/credential_guard.py`, below both `runtime/` and `tool_sources/` (a tool
source's sync asks it too); the names stay importable from here.
"""

from __future__ import annotations

from agent_engine.agents.credential_guard import (
    SIGNING_ENVS_REFRESH_SECONDS as SIGNING_ENVS_REFRESH_SECONDS,
)
from agent_engine.agents.credential_guard import CredentialGuard as CredentialGuard
from agent_engine.agents.credential_guard import CredentialRefused as CredentialRefused

__all__ = ["SIGNING_ENVS_REFRESH_SECONDS", "CredentialGuard", "CredentialRefused"]
