"""The viewer's own accounts at OWNER_OAUTH sources: connect (a link to the authorization server)
and disconnect (revoke and forget). Any signed-in user, for their own account only."""

from __future__ import annotations

import strawberry

from agent_engine.api.errors import BadUserInput, Conflict, NotFound
from agent_engine.api.ids import parse_id
from agent_engine.api.resolvers import Info, described_mutation
from agent_engine.api.state import services
from agent_engine.api.types.connections import ConnectStart, ToolConnection
from agent_engine.db import connections as connections_db
from agent_engine.db import tool_sources as sources_db
from agent_engine.oauth import flow, protocol


async def _owner_oauth_source(info: Info, source_id: int) -> sources_db.ToolSourceRow:
    async with services(info)["engine"].connect() as conn:
        source = await sources_db.fetch_source(conn, source_id)
    if source is None:
        raise NotFound("tool source", source_id)
    if not source.owner_oauth:
        raise BadUserInput(
            "sourceId",
            f"the tool source {source.name!r} uses {source.auth.upper()} authentication, not"
            " OWNER_OAUTH: there is no account of yours to connect",
        )
    if not source.enabled:
        raise BadUserInput("sourceId", f"the tool source {source.name!r} is disabled")
    return source


@strawberry.type
class ConnectionMutation:
    @described_mutation(
        description=(
            "A link to connect (or reconnect) the viewer's own account at an OWNER_OAUTH source "
            "— any signed-in user, admins included (an admin's own connection also lists the "
            "source's tools at sync when the server allows no anonymous listing)."
        )
    )
    async def connect_tool_source(self, info: Info, source_id: strawberry.ID) -> ConnectStart:
        viewer = info.context.require_viewer()
        source = await _owner_oauth_source(info, parse_id(source_id, "sourceId"))
        settings = services(info)["settings"]
        keys = settings.token_keyring()
        if keys is None:
            raise Conflict(
                "the engine has no token keys (AGENT_ENGINE_TOKEN_KEYS is not set): an"
                " administrator must set them before accounts can be connected"
            )
        if not settings.public_url:
            raise Conflict(
                "the engine does not know its own address (AGENT_ENGINE_PUBLIC_URL is not set):"
                " an administrator must set it before accounts can be connected"
            )
        try:
            started = await flow.start_connection(
                services(info)["engine"],
                owner_id=viewer.user_id,
                source=source,
                public_url=settings.public_url,
                keys=keys,
                seconds=settings.oauth_timeout_seconds,
            )
        except protocol.OAuthProblem as exc:
            raise Conflict(f"cannot connect to the tool source {source.name!r}: {exc}") from exc
        return ConnectStart(
            authorization_url=started.authorization_url, expires_at=started.expires_at
        )

    @described_mutation(
        description=(
            "The viewer's own account. Revokes the tokens at the authorization server when it "
            "offers revocation and forgets them; runs that need the account wait for it again."
        )
    )
    async def disconnect_tool_source(self, info: Info, source_id: strawberry.ID) -> ToolConnection:
        viewer = info.context.require_viewer()
        ident = parse_id(source_id, "sourceId")
        async with services(info)["engine"].connect() as conn:
            source = await sources_db.fetch_source(conn, ident)
        if source is None:
            raise NotFound("tool source", ident)
        settings = services(info)["settings"]
        await flow.forget_connection(
            services(info)["engine"],
            owner_id=viewer.user_id,
            source_id=ident,
            actor_id=viewer.user_id,
            keys=settings.token_keyring(),
            seconds=settings.oauth_timeout_seconds,
        )
        return ToolConnection.not_connected(ident, source.name)


async def viewer_connections(info: Info) -> list[ToolConnection]:
    viewer = info.context.require_viewer()
    async with services(info)["engine"].connect() as conn:
        rows = await connections_db.viewer_connections(conn, viewer.user_id)
    return [ToolConnection.of(row) for row in rows]
