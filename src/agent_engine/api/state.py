"""The lifespan's state: what every request and socket of an api process shares."""

from __future__ import annotations

from typing import TypedDict, cast

import dramatiq
from sqlalchemy.ext.asyncio import AsyncEngine
from starlette.requests import HTTPConnection

from agent_engine.api.alert_events import BudgetAlertFeed
from agent_engine.api.approval_events import ApprovalFeed
from agent_engine.api.context import Enqueue
from agent_engine.api.events import RunEventHub
from agent_engine.api.fanout import Broadcaster
from agent_engine.api.sessions import SessionRegistry
from agent_engine.settings import Settings


class State(TypedDict):
    engine: AsyncEngine
    settings: Settings
    broker: dramatiq.Broker | None
    enqueue: Enqueue
    hub: RunEventHub
    sessions: SessionRegistry
    alert_feed: BudgetAlertFeed
    approval_feed: ApprovalFeed
    broadcaster: Broadcaster


def state_of(connection: HTTPConnection) -> State:
    # Starlette copies the lifespan's yielded mapping into each request's scope.
    return cast(State, connection.scope["state"])
