"""Subscription fields: live run events and the viewer's budget, fed by the process's RunEventHub.

Each event is resolved from the row the hub loaded for *its* transition (never a fresh load), so
a subscriber sees every state once, in order, each with its previous state. The stream is live:
a client that reconnects re-queries the journal for what it missed (DESIGN §7).

The resolvers check the viewer and the arguments when the operation starts (UNAUTHENTICATED,
NOT_FOUND for someone else's agent: the client gets a protocol `error` message instead of a
stream that ends with an error), then return a shared stream (api/fanout/): subscribers with
the same document, variables and audience are executed once per event, together.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Any, TypeVar

import strawberry

from agent_engine.api.access import is_owner, visible_agent, visible_run
from agent_engine.api.alert_events import BudgetAlertFeed
from agent_engine.api.context import Context
from agent_engine.api.events import RunEvent as HubEvent
from agent_engine.api.events import RunEventHub, Subscriber
from agent_engine.api.fanout import SKIP, SUBSCRIBER_TOO_SLOW, Feed, SubscriberLagged, shared_stream
from agent_engine.api.ids import parse_id
from agent_engine.api.resolvers import Info
from agent_engine.api.subscribers import SubscriberTooSlow
from agent_engine.api.types.agents import Run, RunEvent
from agent_engine.api.types.approvals import ToolApproval
from agent_engine.api.types.budget import Budget, BudgetAlert
from agent_engine.api.types.transcript import RunStep
from agent_engine.db import approvals as approvals_db
from agent_engine.db.run_events import steps_since
from agent_engine.db.run_steps import StepRow
from agent_engine.db.runs import RunRow
from agent_engine.domain.runs import TERMINAL_STATES, RunState
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
        run=Run.from_row(RunRow.from_row(event.run), owner_id=event.owner_id),
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
        return Budget.from_value(value, owner_id=owner_id)

    return Feed(("budget", owner_id), open_source, budget)


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


async def _tool_approvals(
    context: Context, owner_id: int | None
) -> AsyncGenerator[ToolApproval, None]:
    if context.approval_feed is None:
        raise RuntimeError("toolApprovals needs the approval feed of the api process")
    subscriber = context.approval_feed.subscribe(owner_id=owner_id)
    try:
        async for event in subscriber.approvals():
            context.refresh()
            async with context.engine.connect() as conn:
                row = await approvals_db.fetch(conn, event.id)
            if row is not None:
                yield ToolApproval.from_row(row)
    except SubscriberTooSlow as exc:
        raise SubscriberLagged(str(exc)) from exc
    finally:
        subscriber.close()


async def _run_steps(
    context: Context, run_id: int, *, owner_view: bool
) -> AsyncGenerator[RunStep, None]:
    """The steps written so far, then each step as it starts and as it finishes; ends when the
    run is terminal. Re-reads after every wake-up and emits what changed since it last looked."""
    watch = _hub(context).watch_steps(run_id)  # before the first read: no change falls between
    emitted: dict[int, bool] = {}  # index -> whether its finished form went out
    from_index = 0
    try:
        while True:
            async with context.engine.connect() as conn:
                rows = await steps_since(conn, run_id, from_index=from_index)
            if not rows:  # the run was deleted with its agent
                return
            for row in rows:
                if row["index"] is None:
                    continue
                index, finished = int(row["index"]), row["finished_at"] is not None
                before = emitted.get(index)
                if before is None or (finished and not before):
                    emitted[index] = finished
                    context.refresh()
                    yield RunStep.from_row(StepRow.from_row(row), owner_view=owner_view)
            while emitted.get(from_index):
                from_index += 1
            if rows[0]["run_state"] in TERMINAL_STATES:
                return
            await watch.wait()
    finally:
        watch.close()


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
            agent = (await visible_agent(info, parse_id(agent_id, "agentId"))).id
        # Owners see their own agents' runs; admins everyone's (also for a given agent).
        owner = None if viewer.is_admin else viewer.user_id
        return shared_stream(info, run_events_feed(_hub(info.context), owner, agent))

    @described_subscription(
        description="The viewer's budget, emitted whenever one of the viewer's runs finishes."
    )
    async def budget(self, info: Info) -> AsyncIterator[Budget]:
        viewer = info.context.require_viewer()
        return shared_stream(info, budget_feed(_hub(info.context), viewer.user_id))

    @described_subscription(
        description=(
            "Budget alerts as they are recorded: the viewer's own, or every owner's for an admin."
        )
    )
    async def budget_alerts(self, info: Info) -> AsyncGenerator[BudgetAlert, None]:
        viewer = info.context.require_viewer()
        _alert_feed(info.context)
        return _budget_alerts(info.context, None if viewer.is_admin else viewer.user_id)

    @described_subscription(
        description=(
            "The viewer's approvals as they are requested, decided or expire (admins: every "
            "owner's, without inputs)."
        )
    )
    async def tool_approvals(self, info: Info) -> AsyncGenerator[ToolApproval, None]:
        viewer = info.context.require_viewer()
        return _tool_approvals(info.context, None if viewer.is_admin else viewer.user_id)

    @described_subscription(
        description=(
            "One run's transcript: first the steps written so far, then each step when it starts "
            "and again when it finishes. Ends when the run finishes (at once for a finished run)."
        )
    )
    async def run_steps(self, info: Info, run_id: strawberry.ID) -> AsyncGenerator[RunStep, None]:
        viewer = info.context.require_viewer()
        ident = parse_id(run_id, "runId")
        _, owner_id = await visible_run(info, ident)
        _hub(info.context)
        return _run_steps(info.context, ident, owner_view=is_owner(viewer, owner_id))


__all__ = [
    "SUBSCRIBER_TOO_SLOW",
    "SubscriberLagged",
    "Subscription",
    "budget_feed",
    "run_events_feed",
]
