"""Which environment variables an admin may name as a credential sent to a server they chose.

A model's `apiKeyEnv` (and an MCP tool source's `authEnv`) names a variable whose value the
workers send as a bearer token to a URL an admin set. It must never be one of the engine's own
settings, or the admin could read the JWT signing secret, the database password or a delivery
signing secret by pointing a model at a listener of their own. Pure rules, no environment reads:
callers pass what the process knows (the operator's allow-list, the delivery targets' variables).
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable

ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
# The engine's own configuration: never a credential for a third party.
ENGINE_ENV_PREFIXES = ("AGENT_ENGINE_",)
ENGINE_ENV_NAMES = frozenset({"DATABASE_URL", "REDIS_URL", "BROKER_URL", "PGPASSWORD"})


def is_engine_setting(name: str) -> bool:
    # Settings are read case-insensitively (pydantic-settings), so `agent_engine_jwt_secret` is
    # the JWT secret too.
    upper = name.upper()
    return upper in ENGINE_ENV_NAMES or upper.startswith(ENGINE_ENV_PREFIXES)


def credential_env_problem(
    name: str | None,
    *,
    signing_envs: Collection[str] = (),
    allowed_prefixes: Iterable[str] = (),
) -> str | None:
    """Why `name` may not hold a credential sent to an admin-chosen server, or None.

    `signing_envs` are the variables delivery targets sign with; `allowed_prefixes`, when not
    empty, is the operator's allow-list (AGENT_ENGINE_CREDENTIAL_ENV_PREFIXES).
    """
    if name is None:
        return None
    if not ENV_NAME.match(name):
        return "must be an environment variable name"
    if is_engine_setting(name):
        return (
            "must not name one of the engine's own settings "
            "(AGENT_ENGINE_*, DATABASE_URL, REDIS_URL, BROKER_URL, PGPASSWORD): its value would "
            "be sent to the model's server"
        )
    if name in signing_envs:
        return "must not name a variable a delivery target signs with"
    prefixes = tuple(p for p in allowed_prefixes if p)
    if prefixes and not name.startswith(prefixes):
        return f"must start with one of the allowed prefixes ({', '.join(prefixes)})"
    return None


def signing_env_problem(name: str, *, credential_envs: Collection[str] = ()) -> str | None:
    """Why a delivery target may not sign with the variable `name`, or None."""
    # An HMAC key never leaves the process (only signatures do), so an engine-named variable
    # such as AGENT_ENGINE_WEBHOOK_SECRET is fine here; a model's key is not: it is sent out.
    if not ENV_NAME.match(name):
        return "must be an environment variable name"
    if name in credential_envs:
        return "must not name a variable a model or tool source sends as its key"
    return None


def parse_prefixes(value: str) -> tuple[str, ...]:
    """`AGENT_ENGINE_CREDENTIAL_ENV_PREFIXES`: comma-separated, blanks ignored; () = no list."""
    return tuple(p.strip() for p in value.split(",") if p.strip())
