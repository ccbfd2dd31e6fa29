"""WebSocket sessions held to the rules of a request for their whole life.

graphql-transport-ws authenticates once, at `connection_init`; a socket may then live for hours.
So that a socket is no stronger than an HTTP request with the same token:

- every operation (`subscribe` message: subscription, query or mutation) authenticates the token
  again, exactly as a request would -- signature and `exp`, the user provisioned and active --
  before it runs; a failure closes the socket (4401 for the token, 4403 for the account);
- a socket closes when its token expires (4401, "the token has expired");
- a deactivated user's sockets close within `session_check_seconds` in every api process: each
  process's `SessionRegistry` looks up its connected users' `is_active` in PostgreSQL, where
  `deactivateOwner` writes it, in one statement per sweep (4403, "this account is deactivated").

Every operation also runs with a context of its own (`Context.for_operation`): its clock read
when it starts, its own DataLoaders (nothing cached for the socket's life, no deleted agent served
from a stale cache), and the viewer just re-checked.

Limits: a user holds at most `max_sockets_per_user` sockets on one api process -- one more is
closed with `4429` ("too many sockets for this user …"; graphql-transport-ws uses 4429 for "too
many", and the reference client does not retry it), before its `connection_ack` (or just after,
when two arrive at once); a socket has at most `max_subscriptions_per_connection` operations in
flight -- one more is refused with an `error` message for that operation (the socket and its
other operations go on).

Roles come from the token alone (the `agent_admin` claim), so a role removed in the identity
provider takes effect for a socket, as for HTTP, when its token expires.

The handler is Strawberry's graphql-transport-ws handler, extended through the view's
`graphql_transport_ws_handler_class` seam.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from datetime import UTC, datetime
from typing import Protocol, cast

from graphql import GraphQLError
from sqlalchemy.ext.asyncio import AsyncEngine
from starlette.requests import HTTPConnection
from strawberry.subscriptions.protocols.graphql_transport_ws.types import (
    ConnectionInitMessage,
    SubscribeMessage,
)

from agent_engine.api.auth import Caller
from agent_engine.api.context import Context
from agent_engine.api.errors import ApiError, Forbidden, Unauthenticated
from agent_engine.api.live.socket import OPERATION_CONTEXT, GroupedTransportWSHandler
from agent_engine.db.users import UserRow, inactive_users, users_by_id

log = logging.getLogger(__name__)

# graphql-transport-ws close codes: the credentials are no longer valid / the account is refused.
CLOSE_UNAUTHORIZED = 4401
CLOSE_FORBIDDEN = 4403
# As graphql-ws uses it: the server failed; the client may reconnect.
CLOSE_INTERNAL_ERROR = 4500
# graphql-transport-ws's "too many": the user holds the most sockets allowed (not retried by the
# reference client; close another socket first).
CLOSE_TOO_MANY = 4429
TOO_MANY_SUBSCRIPTIONS = "TOO_MANY_SUBSCRIPTIONS"
TOKEN_EXPIRED = "the token has expired"
CHECK_FAILED = "the session could not be checked; reconnect"
ACCOUNT_DEACTIVATED = "this account is deactivated"
# A close reason must fit a control frame (123 bytes).
MAX_REASON_CHARS = 120


class SessionRegistry:
    """The authenticated sockets of this api process, by user, and the sweep that closes the
    sockets of users deactivated since (in this or any other process)."""

    def __init__(
        self, engine: AsyncEngine, *, interval_seconds: float, max_sockets_per_user: int = 20
    ) -> None:
        self._engine = engine
        self._interval_seconds = interval_seconds
        self.max_sockets_per_user = max_sockets_per_user
        self._sessions: dict[int, set[SessionHandler]] = {}
        self._task: asyncio.Task[None] | None = None
        # Users rows asked for by sockets and not read yet (see `read_user`).
        self._pending: dict[int, list[asyncio.Future[UserRow | None]]] = {}
        self._reading: asyncio.Task[None] | None = None

    async def read_user(self, user_id: int) -> UserRow | None:
        """The stored user (None on first sight), read after this call -- with the reads other
        sockets ask for meanwhile: a reconnect storm of N sockets costs a few statements, not N
        (one statement at a time; a read alone waits for no one)."""
        waiter: asyncio.Future[UserRow | None] = asyncio.get_running_loop().create_future()
        self._pending.setdefault(user_id, []).append(waiter)
        if self._reading is None or self._reading.done():
            self._reading = asyncio.create_task(self._read_pending(), name="session-user-reads")
        return await waiter

    async def _read_pending(self) -> None:
        while self._pending:
            await asyncio.sleep(0)  # the sockets handled in this pass of the loop join in
            batch, self._pending = self._pending, {}
            try:
                async with self._engine.connect() as conn:
                    await conn.execution_options(isolation_level="AUTOCOMMIT")
                    rows = {row.id: row for row in await users_by_id(conn, sorted(batch))}
            except Exception as exc:
                for waiters in batch.values():
                    for waiter in waiters:
                        if not waiter.done():
                            waiter.set_exception(exc)
                continue
            for user_id, waiters in batch.items():
                for waiter in waiters:
                    if not waiter.done():
                        waiter.set_result(rows.get(user_id))

    def has_room(self, user_id: int) -> bool:
        return len(self._sessions.get(user_id, ())) < self.max_sockets_per_user

    def add(self, user_id: int, session: SessionHandler) -> bool:
        """Register `session`; False (not registered) when the user holds the most allowed."""
        if not self.has_room(user_id):
            return False
        self._sessions.setdefault(user_id, set()).add(session)
        return True

    def too_many_reason(self) -> str:
        return (
            f"too many sockets for this user: at most {self.max_sockets_per_user} on one api "
            "process; close another first"
        )

    def discard(self, user_id: int, session: SessionHandler) -> None:
        sessions = self._sessions.get(user_id)
        if sessions is not None:
            sessions.discard(session)
            if not sessions:
                del self._sessions[user_id]

    @property
    def session_count(self) -> int:
        return sum(len(sessions) for sessions in self._sessions.values())

    async def start(self) -> None:
        self._task = asyncio.create_task(self._sweep_forever(), name="session-sweep")

    async def stop(self) -> None:
        if self._reading is not None:
            self._reading.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._reading
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def sweep(self) -> int:
        """Close the sockets of deactivated users; returns how many were closed."""
        if not self._sessions:
            return 0
        async with self._engine.connect() as conn:
            inactive = await inactive_users(conn, sorted(self._sessions))
        closed = 0
        for user_id in inactive:
            for session in list(self._sessions.get(user_id, ())):
                await session.end(CLOSE_FORBIDDEN, ACCOUNT_DEACTIVATED)
                closed += 1
        return closed

    async def _sweep_forever(self) -> None:
        while True:
            await asyncio.sleep(self._interval_seconds)
            try:
                await self.sweep()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                # The database is away: operations re-check on their own; try again next time.
                log.warning("session sweep failed: %s", exc)


class SessionHandler(GroupedTransportWSHandler):
    """graphql-transport-ws with the session rules above, its subscriptions delivered by groups
    (api/live/)."""

    _expiry: asyncio.Task[None] | None = None
    _registered: int | None = None
    _ended = False

    async def _init(self, message: ConnectionInitMessage) -> None:
        await super().handle_connection_init(message)
        viewer = self.context.viewer
        if not self.connection_acknowledged or viewer is None or self._registered is not None:
            return
        registry = _registry(self.context)
        if not registry.add(viewer.user_id, self):  # two sockets got past the check at once
            await self.end(CLOSE_TOO_MANY, registry.too_many_reason())
            return
        self._registered = viewer.user_id
        if viewer.expires_at is not None:
            self._expiry = asyncio.create_task(self._close_at(viewer.expires_at))

    async def handle_connection_init(self, message: ConnectionInitMessage) -> None:
        try:
            await self._init(message)
        except SocketLimitReached as exc:
            await self.end(CLOSE_TOO_MANY, str(exc))

    async def handle_subscribe(self, message: SubscribeMessage) -> None:
        if not self.connection_acknowledged or self._ended:
            await super().handle_subscribe(message)  # Strawberry closes it (4401)
            return
        limit = self.max_subscriptions_per_connection
        if limit is not None and len(self.operations) >= limit:
            error = GraphQLError(
                f"subscription limit reached: at most {limit} operations at once on one socket;"
                " complete one first",
                extensions={"code": TOO_MANY_SUBSCRIPTIONS, "limit": limit},
            )
            await self.send_message(
                {"id": message["id"], "type": "error", "payload": [error.formatted]}
            )
            return
        try:
            view = cast(_SessionView, self.view)
            viewer = await view.reauthenticate(self.context)
        except ApiError as exc:
            await self.end(*_close_for(exc))
            return
        except Exception:
            # The database is away: the viewer cannot be checked, so nothing runs.
            log.warning("could not re-check a WebSocket session's viewer", exc_info=True)
            await self.end(CLOSE_INTERNAL_ERROR, CHECK_FAILED)
            return
        self.context.viewer = viewer
        # The operation's task (created by Strawberry below) copies this: its own context.
        OPERATION_CONTEXT.set(self.context.for_operation(viewer))
        try:
            await super().handle_subscribe(message)
        finally:
            OPERATION_CONTEXT.set(None)

    async def shutdown(self) -> None:
        if self._expiry is not None:
            self._expiry.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._expiry
        if self._registered is not None:
            _registry(self.context).discard(self._registered, self)
            self._registered = None
        await super().shutdown()

    async def end(self, code: int, reason: str) -> None:
        """Stop every operation of the socket, then close it with `code` and `reason`."""
        if self._ended:
            return
        self._ended = True
        for operation_id in list(self.operations):
            await self.cleanup_operation(operation_id)
        with contextlib.suppress(Exception):  # the client may be gone already
            await self.websocket.close(code=code, reason=reason[:MAX_REASON_CHARS])

    async def _close_at(self, expires_at: datetime) -> None:
        # The token's `exp` is wall-clock time: compare with the real clock, not the app's.
        delay = (expires_at - datetime.now(UTC)).total_seconds()
        await asyncio.sleep(max(delay, 0.0))
        await self.end(CLOSE_UNAUTHORIZED, TOKEN_EXPIRED)


def _close_for(error: ApiError) -> tuple[int, str]:
    if isinstance(error, Forbidden):
        return CLOSE_FORBIDDEN, error.message
    if isinstance(error, Unauthenticated):
        return CLOSE_UNAUTHORIZED, error.message
    return CLOSE_FORBIDDEN, error.message


class SocketLimitReached(Exception):
    """The user holds the most sockets allowed (raised by the view's `on_ws_connect`)."""


def _registry(context: Context) -> SessionRegistry:
    """The process's registry, from the lifespan state (`api/state.py`)."""
    request = context.request
    if not isinstance(request, HTTPConnection):
        raise RuntimeError("WebSocket sessions need the api process's session registry")
    registry: SessionRegistry = request.scope["state"]["sessions"]
    return registry


def check_room(context: Context, user_id: int) -> None:
    """Refuse a socket of a user who holds the most allowed (`SocketLimitReached`)."""
    registry = _registry(context)
    if not registry.has_room(user_id):
        raise SocketLimitReached(registry.too_many_reason())


class _SessionView(Protocol):
    async def reauthenticate(self, context: Context) -> Caller: ...


__all__ = [
    "CLOSE_TOO_MANY",
    "SessionHandler",
    "SessionRegistry",
    "SocketLimitReached",
    "check_room",
]
