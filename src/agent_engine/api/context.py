"""The per-request context: who is asking, the engine, the loaders and the request's `now`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy.ext.asyncio import AsyncEngine

from agent_engine.api.auth import Viewer
from agent_engine.api.errors import ApiError, Forbidden, Unauthenticated
from agent_engine.api.loaders import Loaders
from agent_engine.settings import Settings

if TYPE_CHECKING:
    from agent_engine.api.alert_events import BudgetAlertFeed
    from agent_engine.api.approval_events import ApprovalFeed
    from agent_engine.api.events import RunEventHub
    from agent_engine.api.fanout import Broadcaster
    from agent_engine.api.sessions import SessionRegistry

Enqueue = Callable[[int], None]


@dataclass
class Context:
    engine: AsyncEngine
    settings: Settings
    enqueue: Enqueue
    now: datetime
    viewer: Viewer | None = None
    # Why `viewer` is None although credentials were sent (bad token, deactivated user).
    auth_error: ApiError | None = None
    request: Any = None
    response: Any = None
    # Set by Strawberry from the graphql-transport-ws `connection_init` payload.
    connection_params: dict[str, Any] | None = None
    # The process's run-event hub (subscriptions) and the clock `now` was read from.
    hub: RunEventHub | None = None
    # The process's WebSocket sessions (closed on deactivation; see api/sessions.py).
    sessions: SessionRegistry | None = None
    # Budget alerts as they are recorded (the budgetAlerts subscription).
    alert_feed: BudgetAlertFeed | None = None
    # Write-tool approvals as they change (the toolApprovals subscription).
    approval_feed: ApprovalFeed | None = None
    # The process's subscription groups (api/fanout/): one execution per event and group.
    broadcaster: Broadcaster | None = None
    clock: Callable[[], datetime] = field(default=lambda: datetime.now(UTC), repr=False)
    _loaders: Loaders | None = field(default=None, init=False, repr=False)

    @property
    def loaders(self) -> Loaders:
        """Built on first use: most subscription events resolve without touching the database,
        and nine DataLoaders per event and subscriber would cost the fan-out CPU for nothing."""
        if self._loaders is None:
            self._loaders = Loaders(self.engine, now=self.now)
        return self._loaders

    async def release(self) -> None:
        """Give the loaders' shared connection back to the pool (if they were ever used)."""
        if self._loaders is not None:
            await self._loaders.release()

    def refresh(self) -> None:
        """A new `now` and empty loaders: a WebSocket context outlives many events, and each
        event is resolved as a request of its own (no stale cached rows, no unbounded cache)."""
        self.now = self.clock()
        self._loaders = None

    def require_viewer(self) -> Viewer:
        if self.viewer is None:
            raise self.auth_error or Unauthenticated()
        return self.viewer

    def require_admin(self) -> Viewer:
        viewer = self.require_viewer()
        if not viewer.is_admin:
            raise Forbidden("this field is for admins (role agent_admin) only")
        return viewer
