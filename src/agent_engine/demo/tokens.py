"""The lifetime of the demo tokens `agent-engine run` prints, and what its api accepts.

Kept apart from `allinone` (which imports the embedded servers, the migrations and the demo MCP
server) so that `agent-engine token` can warn about a lifetime without loading them.
"""

from __future__ import annotations

import os
from datetime import timedelta

from agent_engine.settings import Settings

DEV_TOKEN_TTL = timedelta(days=7)
# With its own generated secret, the all-in-one's api accepts the week-long demo tokens it prints
# (a deployment's default is 24 h: AGENT_ENGINE_JWT_MAX_LIFETIME_SECONDS).
DEMO_MAX_LIFETIME = DEV_TOKEN_TTL + timedelta(hours=1)
MAX_LIFETIME_ENV = "AGENT_ENGINE_JWT_MAX_LIFETIME_SECONDS"


def demo_max_lifetime(settings: Settings) -> timedelta | None:
    """The token lifetime `agent-engine run` gives its api in place of the setting: the demo's,
    when it signs with the secret it generated and the operator set no limit; None otherwise
    (`settings` as read from the environment, before a generated secret is filled in)."""
    if settings.jwt_secret is None and MAX_LIFETIME_ENV not in os.environ:
        return DEMO_MAX_LIFETIME
    return None
