"""An owner's own account at an OWNER_OAUTH tool source, as the API shows it: never a token."""

from __future__ import annotations

from datetime import datetime
from enum import Enum

import strawberry

from agent_engine.db.connections import ViewerConnection


@strawberry.enum(description="How the engine authenticates to a tool source's server.")
class ToolSourceAuth(Enum):
    NONE = strawberry.enum_value("none", description="No credential.")
    SHARED = strawberry.enum_value(
        "shared",
        description=(
            "One bearer credential for every owner (the variable authEnv names): the server sees "
            "the engine, the owner only as a hint in _meta."
        ),
    )
    OWNER_OAUTH = strawberry.enum_value(
        "owner_oauth",
        description=(
            "Each owner connects their own account at the server's authorization server (OAuth "
            "2.1, as the MCP authorization specification says); a call carries that owner's "
            "token, never a shared one."
        ),
    )


@strawberry.enum(
    description=(
        "An owner's account at an OWNER_OAUTH source. EXPIRED: the server refused the tokens "
        "and a refresh failed: connect again."
    )
)
class ConnectionStatus(Enum):
    NOT_CONNECTED = "not_connected"
    CONNECTED = "connected"
    EXPIRED = "expired"


@strawberry.type(
    description=(
        "The viewer's own account at an OWNER_OAUTH tool source. Tokens never leave the engine: "
        "not through the API, not in logs, not in the database unencrypted."
    )
)
class ToolConnection:
    source_id: strawberry.ID
    source_name: str
    status: ConnectionStatus
    account: str | None = strawberry.field(
        description=(
            "The account at the server as its authorization server names it (the token's "
            "subject, or userinfo's), when known."
        )
    )
    scopes: list[str] = strawberry.field(description="The scopes granted.")
    connected_at: datetime | None
    last_used_at: datetime | None

    @classmethod
    def of(cls, view: ViewerConnection) -> ToolConnection:
        return cls(
            source_id=strawberry.ID(str(view.source_id)),
            source_name=view.source_name,
            status=ConnectionStatus[(view.status or "not_connected").upper()],
            account=view.account if view.status else None,
            scopes=list(view.scopes) if view.status else [],
            connected_at=view.connected_at,
            last_used_at=view.last_used_at,
        )

    @classmethod
    def not_connected(cls, source_id: int, source_name: str) -> ToolConnection:
        return cls(
            source_id=strawberry.ID(str(source_id)),
            source_name=source_name,
            status=ConnectionStatus.NOT_CONNECTED,
            account=None,
            scopes=[],
            connected_at=None,
            last_used_at=None,
        )


@strawberry.type(description="Where the owner goes to connect their account.")
class ConnectStart:
    authorization_url: str = strawberry.field(
        description=(
            "Open it in the owner's browser; the authorization server sends them back to the "
            "engine's /oauth/callback."
        )
    )
    expires_at: datetime = strawberry.field(description="Works once, until this time.")
