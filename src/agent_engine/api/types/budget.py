"""The owner's weekly budget: spend, forecast and threshold alerts."""

from __future__ import annotations

from datetime import datetime

import strawberry

from agent_engine.api.resolvers import Info, described
from agent_engine.api.scalars import DecimalText, decimal_text_or_none
from agent_engine.api.types.users import User, existing_user, owner_zone
from agent_engine.db import alerts as alert_rows
from agent_engine.db.spend import OwnerSpend as OwnerSpendValue
from agent_engine.domain.budget import Budget as BudgetValue
from agent_engine.domain.forecast import forecast_budget
from agent_engine.runs.spend import agent_paces


@strawberry.type(
    description="The owner's spend this calendar week (Sunday 00:00 in the organisation zone)."
)
class Budget:
    owner_id: strawberry.Private[int]
    value: strawberry.Private[BudgetValue]
    cap_tokens: int | None = strawberry.field(description="null when no cap is configured")
    used_tokens: int
    remaining_tokens: int | None = strawberry.field(description="null when no cap is configured")
    exceeded: bool
    window_start: datetime
    window_end: datetime
    timezone: str

    @classmethod
    def from_value(cls, budget: BudgetValue, *, owner_id: int) -> Budget:
        return cls(
            owner_id=owner_id,
            value=budget,
            cap_tokens=budget.cap_tokens,
            used_tokens=budget.used_tokens,
            remaining_tokens=budget.remaining_tokens,
            exceeded=budget.exceeded,
            window_start=budget.window.start,
            window_end=budget.window.end,
            timezone=str(budget.window.timezone),
        )

    @described(
        description=(
            "The week's spend priced per run; null when no run of the week had a priced model."
        )
    )
    async def used_cost(self, info: Info) -> DecimalText | None:
        return decimal_text_or_none(await info.context.loaders.budget_cost.load(self.owner_id))

    @strawberry.field
    async def forecast(self, info: Info) -> BudgetForecast:
        loaders = info.context.loaders
        agents = [
            row
            for row in await loaders.agents_of_owner.load(self.owner_id)
            if row.next_run_at is not None
        ]
        ids = [row.id for row in agents]
        expected = dict(zip(ids, await loaders.expected_tokens.load_many(ids), strict=True))
        zone = await owner_zone(info, self.owner_id)
        value = forecast_budget(
            self.value, agent_paces(agents, expected, zone=zone), now=info.context.now
        )
        return BudgetForecast(
            projected_tokens=value.projected_tokens,
            exhausts_at=value.exhausts_at,
            agents_without_history=value.agents_without_history,
        )


@strawberry.type(
    description=(
        "What the owner's enabled agents will spend by windowEnd at their current pace: each "
        "remaining schedule slot in the window costs that agent's expectedTokensPerRun."
    )
)
class BudgetForecast:
    projected_tokens: int = strawberry.field(
        description="usedTokens plus the expected spend of every remaining slot before windowEnd."
    )
    exhausts_at: datetime | None = strawberry.field(
        description=(
            "The slot at which the projected spend first reaches the cap; null when it does not "
            "within the window, there is no cap, or the week's spend has reached it already "
            "(exceeded)."
        )
    )
    agents_without_history: int = strawberry.field(
        description=(
            "Scheduled agents left out of the projection because they have no run history yet."
        )
    )


@strawberry.type(description="One owner's spend in one budget week.")
class OwnerSpend:
    owner_id: strawberry.Private[int]
    tokens: int
    cost: DecimalText | None = strawberry.field(
        description="null when none of the week's runs was priced"
    )
    runs: int = strawberry.field(description="The week's runs that were not skipped.")

    @classmethod
    def from_value(cls, value: OwnerSpendValue) -> OwnerSpend:
        return cls(
            owner_id=value.owner_id,
            tokens=value.tokens,
            cost=decimal_text_or_none(value.cost),
            runs=value.runs,
        )

    @strawberry.field
    async def owner(self, info: Info) -> User:
        return await existing_user(info, self.owner_id)


@strawberry.type(
    description=(
        "An owner's spend crossed a threshold of the cap; recorded once per owner, week and "
        "threshold."
    )
)
class BudgetAlert:
    owner_id: strawberry.Private[int]
    id: strawberry.ID
    percent: int = strawberry.field(description="One of PlatformSettings.budgetAlertPercents.")
    used_tokens: int = strawberry.field(description="The week's spend when it was recorded.")
    cap_tokens: int = strawberry.field(description="The cap when it was recorded.")
    window_start: datetime
    crossed_at: datetime

    @classmethod
    def from_value(cls, alert: alert_rows.BudgetAlertRow) -> BudgetAlert:
        return cls(
            owner_id=alert.owner_id,
            id=strawberry.ID(str(alert.id)),
            percent=alert.percent,
            used_tokens=alert.used_tokens,
            cap_tokens=alert.cap_tokens,
            window_start=alert.window_start,
            crossed_at=alert.crossed_at,
        )

    @strawberry.field
    async def owner(self, info: Info) -> User:
        return await existing_user(info, self.owner_id)
