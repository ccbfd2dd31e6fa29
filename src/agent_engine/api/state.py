"""The lifespan's state: what every request and socket of an api process shares.

Resolvers and the socket handler reach these services through `state_of(context.request)`; the
per-operation `Context` carries none of them."""

from __future__ import annotations

from typing import TypedDict, cast

import dramatiq
from sqlalchemy.ext.asyncio import AsyncEngine
from starlette.requests import HTTPConnection

from agent_engine.api.auth import TokenVerifier
from agent_engine.api.live import LiveUpdates
from agent_engine.api.resolvers import Info
from agent_engine.api.sessions import SessionRegistry
from agent_engine.runs.request import Enqueue
from agent_engine.settings import Settings


class State(TypedDict):
    engine: AsyncEngine
    settings: Settings
    broker: dramatiq.Broker | None
    enqueue: Enqueue
    # The live-update path (bus, LISTEN source, subscription groups): api/live/.
    live: LiveUpdates
    sessions: SessionRegistry
    verifier: TokenVerifier


def state_of(connection: HTTPConnection) -> State:
    # Starlette copies the lifespan's yielded mapping into each request's scope.
    return cast(State, connection.scope["state"])


def services(info: Info) -> State:
    """The process's services for a resolver: the lifespan state of the operation's request."""
    return state_of(info.context.request)
