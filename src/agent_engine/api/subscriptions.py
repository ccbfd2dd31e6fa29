"""Subscription fields: live run events and the viewer's budget, fed by the process's RunEventHub.

Each event is resolved from the row the hub loaded for *its* transition (never a fresh load), so
a subscriber sees every state once, in order, each with its previous state. The stream is live:
a client that reconnects re-queries the journal for what it missed (DESIGN §7).

The resolvers are coroutines returning the stream rather than async generators, so authorization
(UNAUTHENTICATED, NOT_FOUND for someone else's agent) runs when the operation starts and the
client gets a protocol `error` message instead of a stream that ends with an error.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable
from typing import Any, TypeVar

import strawberry

from agent_engine.api.alert_events import BudgetAlertFeed
from agent_engine.api.context import Context
from agent_engine.api.errors import ApiError
from agent_engine.api.events import RunEventHub, SubscriberTooSlow
from agent_engine.api.queries import visible_agent
from agent_engine.api.types import Budget, BudgetAlert, Info, Run, RunEvent, RunState, parse_id
from agent_engine.domain.runs import TERMINAL_STATES
from agent_engine.runs.budget import owner_budget

F = TypeVar("F", bound=Callable[..., Any])

SUBSCRIBER_TOO_SLOW = "SUBSCRIBER_TOO_SLOW"


class SubscriberLagged(ApiError):
    """The client did not keep up; it re-subscribes and re-queries the journal."""

    code = SUBSCRIBER_TOO_SLOW


def described_subscription(description: str) -> Callable[[F], F]:
    """`@described_subscription(description=…)` with its type kept."""
    decorator: Callable[[F], F] = strawberry.subscription(description=description)
    return decorator


def _hub(context: Context) -> RunEventHub:
    if context.hub is None:
        raise RuntimeError("subscriptions need the run-event hub of the api process")
    return context.hub


async def _run_events(
    context: Context, owner_id: int | None, agent_id: int | None
) -> AsyncGenerator[RunEvent, None]:
    # Subscribed when the stream starts: a stream dropped before its first step leaks nothing.
    subscriber = _hub(context).subscribe(owner_id=owner_id, agent_id=agent_id)
    try:
        async for event in subscriber.events():
            context.refresh()
            yield RunEvent(
                run=Run.from_row(event.run, owner_id=event.owner_id),
                previous_state=RunState(event.previous_state) if event.previous_state else None,
            )
    except SubscriberTooSlow as exc:
        raise SubscriberLagged(str(exc)) from exc
    finally:
        subscriber.close()


async def _budgets(context: Context, owner_id: int) -> AsyncGenerator[Budget, None]:
    subscriber = _hub(context).subscribe(owner_id=owner_id)
    try:
        async for event in subscriber.events():
            if event.state not in TERMINAL_STATES:
                continue
            context.refresh()
            async with context.engine.connect() as conn:
                value = await owner_budget(conn, owner_id, now=context.now)
            yield Budget.from_value(value, owner_id=owner_id)
    except SubscriberTooSlow as exc:
        raise SubscriberLagged(str(exc)) from exc
    finally:
        subscriber.close()


def _alert_feed(context: Context) -> BudgetAlertFeed:
    if context.alert_feed is None:
        raise RuntimeError("budgetAlerts needs the alert feed of the api process")
    return context.alert_feed


async def _budget_alerts(
    context: Context, owner_id: int | None
) -> AsyncGenerator[BudgetAlert, None]:
    subscriber = _alert_feed(context).subscribe(owner_id=owner_id)
    try:
        async for alert in subscriber.alerts():
            context.refresh()
            yield BudgetAlert.from_value(alert)
    except SubscriberTooSlow as exc:
        raise SubscriberLagged(str(exc)) from exc
    finally:
        subscriber.close()


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
    ) -> AsyncGenerator[RunEvent, None]:
        viewer = info.context.require_viewer()
        agent: int | None = None
        if isinstance(agent_id, str):  # absent (UNSET) or null: every agent the viewer sees
            agent = int((await visible_agent(info, parse_id(agent_id, "agentId")))["id"])
        # Owners see their own agents' runs; admins everyone's (also for a given agent).
        owner = None if viewer.is_admin else viewer.user_id
        _hub(info.context)
        return _run_events(info.context, owner, agent)

    @described_subscription(
        description="The viewer's budget, emitted whenever one of the viewer's runs finishes."
    )
    async def budget(self, info: Info) -> AsyncGenerator[Budget, None]:
        viewer = info.context.require_viewer()
        _hub(info.context)
        return _budgets(info.context, viewer.user_id)

    @described_subscription(
        description=(
            "Budget alerts as they are recorded: the viewer's own, or every owner's for an admin."
        )
    )
    async def budget_alerts(self, info: Info) -> AsyncGenerator[BudgetAlert, None]:
        viewer = info.context.require_viewer()
        _alert_feed(info.context)
        return _budget_alerts(info.context, None if viewer.is_admin else viewer.user_id)


__all__ = ["Subscription"]
