"""Subscription fields: each a feed on the process's live-update bus (`api/live/`).

Each event is resolved from the row the bus loaded for *its* transition (never a fresh load), so
a subscriber sees every state once, in order, each with its previous state. `runEvents`,
`budget` and `budgetAlerts` are live: a client that reconnects re-queries the journal for what it
missed (docs/architecture.md §7). `runSteps` replays the steps so far, then follows the run to its
end.

The resolvers check the viewer and the arguments when the operation starts (UNAUTHENTICATED,
NOT_FOUND for someone else's agent or run: the client gets a protocol `error` message, before
anything is read), then return a shared stream: subscribers with the same document, variables
and audience are executed once per event, together.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

import strawberry

from agent_engine.api.access import is_owner, visible_agent, visible_run
from agent_engine.api.context import Context
from agent_engine.api.ids import parse_id
from agent_engine.api.live import (
    SKIP,
    SUBSCRIBER_TOO_SLOW,
    ApprovalChange,
    BusListener,
    Feed,
    LiveBus,
    RunChange,
    StepEvent,
    SubscriberTooSlow,
    Topic,
    shared_stream,
)
from agent_engine.api.resolvers import Info
from agent_engine.api.state import services
from agent_engine.api.types.agents import Run, RunEvent, RunStep, ToolApproval
from agent_engine.api.types.budget import Budget, BudgetAlert
from agent_engine.db import approvals as approvals_db
from agent_engine.db.alerts import BudgetAlertRow
from agent_engine.db.run_steps import StepRow
from agent_engine.db.runs import RunRow
from agent_engine.domain.runs import TERMINAL_STATES, RunState

F = TypeVar("F", bound=Callable[..., Any])


def described_subscription(description: str) -> Callable[[F], F]:
    """`@described_subscription(description=…)` with its type kept."""
    decorator: Callable[[F], F] = strawberry.subscription(description=description)
    return decorator


def run_events_feed(bus: LiveBus, owner_id: int | None, agent_id: int | None) -> Feed:
    """`owner_id`'s run events (None: every owner's), or one agent's."""

    def open_source(queue_size: int | None, counted: bool) -> BusListener[RunChange]:
        return bus.subscribe(
            Topic.RUNS,
            owner_id=owner_id,
            agent_id=agent_id,
            queue_size=queue_size,
            counted=counted,
        )

    return Feed(("runEvents", owner_id, agent_id), open_source, _run_event)


def _run_event(event: RunChange, context: Context) -> RunEvent:
    return RunEvent(
        run=Run.from_row(RunRow.from_row(event.run), owner_id=event.owner_id),
        previous_state=RunState(event.previous_state) if event.previous_state else None,
    )


def budget_feed(bus: LiveBus, owner_id: int) -> Feed:
    """The owner's budget after each of their runs finishes (the loaders' read: one per burst of
    events and group, as `viewer { budget }` reads it)."""

    def open_source(queue_size: int | None, counted: bool) -> BusListener[RunChange]:
        return bus.subscribe(Topic.RUNS, owner_id=owner_id, queue_size=queue_size, counted=counted)

    async def budget(event: RunChange, context: Context) -> Any:
        if event.state not in TERMINAL_STATES:
            return SKIP
        value = await context.loaders.budget.load(owner_id)
        return Budget.from_value(value, owner_id=owner_id)

    return Feed(("budget", owner_id), open_source, budget)


def budget_alerts_feed(bus: LiveBus, owner_id: int | None) -> Feed:
    """Budget alerts as recorded: `owner_id`'s (None: every owner's). No read per event."""

    def open_source(queue_size: int | None, counted: bool) -> BusListener[BudgetAlertRow]:
        return bus.subscribe(
            Topic.ALERTS, owner_id=owner_id, queue_size=queue_size, counted=counted
        )

    def alert(event: BudgetAlertRow, context: Context) -> BudgetAlert:
        return BudgetAlert.from_value(event)

    return Feed(("budgetAlerts", owner_id), open_source, alert)


def run_steps_feed(bus: LiveBus, run_id: int, owner_id: int) -> Feed:
    """One run's steps: the replay, then each change (read once per change by the bus)."""

    def open_source(queue_size: int | None, counted: bool) -> BusListener[StepEvent]:
        return bus.watch_steps(run_id, owner_id=owner_id, queue_size=queue_size, counted=counted)

    def step(event: StepEvent, context: Context) -> RunStep:
        viewer = context.require_viewer()
        return RunStep.from_row(StepRow.from_row(event.row), owner_view=is_owner(viewer, owner_id))

    async def replay() -> tuple[list[StepEvent], bool]:
        return await bus.replay_steps(run_id, owner_id)

    def shown_as(event: StepEvent) -> tuple[int, int]:
        return event.index, 1 if event.finished else 0

    return Feed(("runSteps", run_id), open_source, step, replay=replay, shown_as=shown_as)


def tool_approvals_feed(bus: LiveBus, owner_id: int | None) -> Feed:
    """Approvals as they are requested, decided, expire or are cancelled: `owner_id`'s (None:
    every owner's). One read of the approval per event and group; inputs only in the owner's
    group (the type's resolver)."""

    def open_source(queue_size: int | None, counted: bool) -> BusListener[ApprovalChange]:
        return bus.subscribe(
            Topic.APPROVALS, owner_id=owner_id, queue_size=queue_size, counted=counted
        )

    async def approval(event: ApprovalChange, context: Context) -> Any:
        async with context.loaders.connection() as conn:
            row = await approvals_db.fetch(conn, event.id)
        return SKIP if row is None else ToolApproval.from_row(row)

    return Feed(("toolApprovals", owner_id), open_source, approval)


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
        live = services(info)["live"]
        return shared_stream(info, run_events_feed(live.bus, owner, agent), live.broadcaster)

    @described_subscription(
        description="The viewer's budget, emitted whenever one of the viewer's runs finishes."
    )
    async def budget(self, info: Info) -> AsyncIterator[Budget]:
        viewer = info.context.require_viewer()
        live = services(info)["live"]
        return shared_stream(info, budget_feed(live.bus, viewer.user_id), live.broadcaster)

    @described_subscription(
        description=(
            "Budget alerts as they are recorded: the viewer's own, or every owner's for an admin."
        )
    )
    async def budget_alerts(self, info: Info) -> AsyncIterator[BudgetAlert]:
        viewer = info.context.require_viewer()
        live = services(info)["live"]
        owner = None if viewer.is_admin else viewer.user_id
        return shared_stream(info, budget_alerts_feed(live.bus, owner), live.broadcaster)

    @described_subscription(
        description=(
            "The viewer's approvals as they are requested, decided or expire (admins: every "
            "owner's, without inputs)."
        )
    )
    async def tool_approvals(self, info: Info) -> AsyncIterator[ToolApproval]:
        viewer = info.context.require_viewer()
        live = services(info)["live"]
        owner = None if viewer.is_admin else viewer.user_id
        return shared_stream(info, tool_approvals_feed(live.bus, owner), live.broadcaster)

    @described_subscription(
        description=(
            "One run's transcript: first the steps written so far, then each step when it starts "
            "and again when it finishes. Ends when the run finishes (at once for a finished run)."
        )
    )
    async def run_steps(self, info: Info, run_id: strawberry.ID) -> AsyncIterator[RunStep]:
        info.context.require_viewer()
        ident = parse_id(run_id, "runId")
        _, owner_id = await visible_run(info, ident)  # NOT_FOUND before anything is read
        live = services(info)["live"]
        return shared_stream(info, run_steps_feed(live.bus, ident, owner_id), live.broadcaster)


__all__ = [
    "SUBSCRIBER_TOO_SLOW",
    "SubscriberTooSlow",
    "Subscription",
    "budget_alerts_feed",
    "budget_feed",
    "run_events_feed",
    "run_steps_feed",
    "tool_approvals_feed",
]
