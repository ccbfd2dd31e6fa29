"""The per-operation context: who is asking, the loaders and the operation's `now`.

One per HTTP request and one per WebSocket operation (`api/sessions.py`): never shared by two
operations, so its clock, its loaders and its viewer are those of the operation. The process's
services (the engine, the settings, the broker's enqueue, the live-update bus, the sessions) are in
the lifespan `State` (`api/state.py`), reached with `services(info)`; not here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from agent_engine.api.auth import Caller
from agent_engine.api.errors import ApiError, Forbidden, Unauthenticated
from agent_engine.api.loaders import Loaders


@dataclass
class Context:
    # Builds this operation's loaders (on the process's engine) for the operation's `now`.
    new_loaders: Callable[[datetime], Loaders]
    now: datetime
    viewer: Caller | None = None
    # Why `viewer` is None although credentials were sent (bad token, deactivated user).
    auth_error: ApiError | None = None
    request: Any = None
    response: Any = None
    # Set by Strawberry from the graphql-transport-ws `connection_init` payload.
    connection_params: dict[str, Any] | None = None
    # The clock `now` was read from.
    clock: Callable[[], datetime] = field(default=lambda: datetime.now(UTC), repr=False)
    _loaders: Loaders | None = field(default=None, init=False, repr=False)

    @property
    def loaders(self) -> Loaders:
        """Built on first use: most subscription events resolve without touching the database,
        and nine DataLoaders per event and subscriber would cost the fan-out CPU for nothing."""
        if self._loaders is None:
            self._loaders = self.new_loaders(self.now)
        return self._loaders

    async def release(self) -> None:
        """Give the loaders' shared connection back to the pool (if they were ever used)."""
        if self._loaders is not None:
            await self._loaders.release()

    def for_operation(self, viewer: Caller) -> Context:
        """A fresh context for the next operation of a WebSocket (this one is the socket's): its
        own `now`, no loaders yet, the viewer just checked."""
        return dataclasses.replace(self, now=self.clock(), viewer=viewer, auth_error=None)

    def refresh(self) -> None:
        """A new `now` and empty loaders: a WebSocket context outlives many events, and each
        event is resolved as a request of its own (no stale cached rows, no unbounded cache)."""
        self.now = self.clock()
        self._loaders = None

    def require_viewer(self) -> Caller:
        if self.viewer is None:
            raise self.auth_error or Unauthenticated()
        return self.viewer

    def require_admin(self) -> Caller:
        viewer = self.require_viewer()
        if not viewer.is_admin:
            raise Forbidden("this field is for admins (role agent_admin) only")
        return viewer
