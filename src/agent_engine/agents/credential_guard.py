"""The last check before a credential leaves the worker: `CredentialGuard.check`.

Below both `runtime/` (model and MCP tool calls) and `tool_sources/` (a source's sync), which
look down to it; `runtime/credentials.py` re-exports the names.

The API refuses a model whose `apiKeyEnv` names an engine setting or a delivery target's signing
variable (`agents/credentials.py`), but a row written before that rule, or straight in SQL, must
not leak either: every model call (and every MCP tool call and sync, for a tool source's
`authEnv`) asks the guard first. A refusal fails the call without sending anything; the owner
reads which model (or tool) could not be called, the worker log says why and which variable.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable

from sqlalchemy.ext.asyncio import AsyncEngine

from agent_engine.db import credentials as credentials_sql
from agent_engine.domain.credentials import credential_env_problem

# The logger keeps the name the guard had in `runtime/credentials.py`: log filters and alerts
# that watch refusals keep working.
log = logging.getLogger("agent_engine.runtime.credentials")

# The delivery targets' signing variables are read again at most this often (a target added
# meanwhile was itself checked against every model when it was saved).
SIGNING_ENVS_REFRESH_SECONDS = 5.0


class CredentialRefused(Exception):
    """A credential variable the engine will not send. The message is for the owner: it names
    what could not be called, not the variable (owners never see it)."""

    def __init__(self, what: str, reason: str) -> None:
        super().__init__(
            f"{what} was not called: the variable holding its credential is not allowed on this"
            " platform (an admin must change it; details in the worker log)"
        )
        self.what = what
        self.reason = reason


class CredentialGuard:
    """Checks a credential variable against the rule before each send (one per process)."""

    def __init__(
        self,
        engine: AsyncEngine | None,
        *,
        allowed_prefixes: Iterable[str] = (),
        refresh_seconds: float = SIGNING_ENVS_REFRESH_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`engine` reads the delivery targets' signing variables (None: only the static rule,
        for callers without a database)."""
        self._engine = engine
        self._prefixes = tuple(allowed_prefixes)
        self._refresh_seconds = refresh_seconds
        self._clock = clock
        self._signing: frozenset[str] | None = None
        self._read_at = 0.0
        self._lock = asyncio.Lock()

    async def check(self, env_name: str | None, *, what: str) -> None:
        """Raise `CredentialRefused` when the value of `env_name` may not be sent for `what`
        (e.g. "model 'GPT-4o mini'", "tool source 'crm'"); None: nothing to send."""
        if env_name is None:
            return
        reason = credential_env_problem(env_name, allowed_prefixes=self._prefixes)
        if reason is None:
            reason = credential_env_problem(
                env_name, signing_envs=await self._signing_envs(), allowed_prefixes=self._prefixes
            )
        if reason is not None:
            log.error(
                "refused to send the credential of %s: variable %s %s",
                what,
                env_name,
                reason,
                extra={"credential_env": env_name},
            )
            raise CredentialRefused(what, f"{env_name} {reason}")

    async def _signing_envs(self) -> frozenset[str]:
        if self._engine is None:
            return frozenset()
        if self._signing is not None and self._clock() - self._read_at < self._refresh_seconds:
            return self._signing
        async with self._lock:  # one read for all the calls that find the set stale
            if self._signing is None or self._clock() - self._read_at >= self._refresh_seconds:
                async with self._engine.connect() as conn:
                    self._signing = await credentials_sql.signing_envs(conn)
                self._read_at = self._clock()
            return self._signing
