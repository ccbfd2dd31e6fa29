"""Subscription fields: live run events and the viewer's budget, fed by the process's RunEventHub.

Each event is resolved from the row the hub loaded for *its* transition (never a fresh load), so
a subscriber sees every state once, in order, each with its previous state. The stream is live:
a client that reconnects re-queries the journal for what it missed (DESIGN §7).

The resolvers check the viewer and the arguments when the operation starts (UNAUTHENTICATED,
NOT_FOUND for someone else's agent: the client gets a protocol `error` message instead of a
stream that ends with an error), then return a shared stream (api/fanout.py): subscribers with
the same document, variables and audience are executed once per event, together.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

import strawberry

from agent_engine.api.context import Context
from agent_engine.api.events import RunEvent as HubEvent
from agent_engine.api.events import RunEventHub, Subscriber
from agent_engine.api.fanout import SKIP, SUBSCRIBER_TOO_SLOW, Feed, SubscriberLagged, shared_stream
from agent_engine.api.queries import visible_agent
from agent_engine.api.types import Budget, Info, Run, RunEvent, RunState, parse_id
from agent_engine.domain.runs import TERMINAL_STATES
from agent_engine.runs.budget import owner_budget

F = TypeVar("F", bound=Callable[..., Any])


def described_subscription(description: str) -> Callable[[F], F]:
    """`@described_subscription(description=…)` with its type kept."""
    decorator: Callable[[F], F] = strawberry.subscription(description=description)
    return decorator


def _hub(context: Context) -> RunEventHub:
    if context.hub is None:
        raise RuntimeError("subscriptions need the run-event hub of the api process")
    return context.hub


def run_events_feed(hub: RunEventHub, owner_id: int | None, agent_id: int | None) -> Feed:
    """`owner_id`'s run events (None: every owner's), or one agent's."""

    def open_source(queue_size: int | None, counted: bool) -> Subscriber:
        return hub.subscribe(
            owner_id=owner_id, agent_id=agent_id, queue_size=queue_size, counted=counted
        )

    return Feed(("runEvents", owner_id, agent_id), open_source, _run_event)


def _run_event(event: HubEvent, context: Context) -> RunEvent:
    return RunEvent(
        run=Run.from_row(event.run),
        previous_state=RunState(event.previous_state) if event.previous_state else None,
    )


def budget_feed(hub: RunEventHub, owner_id: int) -> Feed:
    """The owner's budget after each of their runs finishes."""

    def open_source(queue_size: int | None, counted: bool) -> Subscriber:
        return hub.subscribe(owner_id=owner_id, queue_size=queue_size, counted=counted)

    async def budget(event: HubEvent, context: Context) -> Any:
        if event.state not in TERMINAL_STATES:
            return SKIP
        async with context.engine.connect() as conn:
            value = await owner_budget(conn, owner_id, now=context.now)
        return Budget.from_value(value)

    return Feed(("budget", owner_id), open_source, budget)


@strawberry.type
class Subscription:
    @described_subscription(
        description=(
            "Run state changes: one agent's, or all the viewer's agents when agentId is omitted "
            "(every agent for an admin)."
        )
    )
    async def run_events(
        self, info: Info, agent_id: strawberry.ID | None = strawberry.UNSET
    ) -> AsyncIterator[RunEvent]:
        viewer = info.context.require_viewer()
        agent: int | None = None
        if isinstance(agent_id, str):  # absent (UNSET) or null: every agent the viewer sees
            agent = int((await visible_agent(info, parse_id(agent_id, "agentId")))["id"])
        # Owners see their own agents' runs; admins everyone's (also for a given agent).
        owner = None if viewer.is_admin else viewer.user_id
        return shared_stream(info, run_events_feed(_hub(info.context), owner, agent))

    @described_subscription(
        description="The viewer's budget, emitted whenever one of the viewer's runs finishes."
    )
    async def budget(self, info: Info) -> AsyncIterator[Budget]:
        viewer = info.context.require_viewer()
        return shared_stream(info, budget_feed(_hub(info.context), viewer.user_id))


__all__ = [
    "SUBSCRIBER_TOO_SLOW",
    "SubscriberLagged",
    "Subscription",
    "budget_feed",
    "run_events_feed",
]
