"""Strawberry types of the contract, each built from a database row by a `from_row` constructor.

Related objects are resolved through the request's DataLoaders, never by a query per object.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from enum import Enum
from typing import Annotated, Any, TypeVar, cast

import strawberry
from strawberry.dataloader import DataLoader
from strawberry.scalars import JSON
from strawberry.types.nodes import SelectedField, Selection

from agent_engine.agents.audit import AuditRow
from agent_engine.api.context import Context
from agent_engine.api.errors import BadUserInput, NotFound
from agent_engine.api.guards import MAX_UPCOMING_RUN_TIMES, page_size
from agent_engine.api.scalars import DecimalText, decimal_text
from agent_engine.db.platform import PlatformSettings as PlatformSettingsRow
from agent_engine.db.platform import zone_or_utc
from agent_engine.domain import gate
from agent_engine.domain.budget import Budget as BudgetValue
from agent_engine.domain.forecast import forecast_budget
from agent_engine.domain.schedule import next_slots, parse_schedule
from agent_engine.runs import alerts as alert_rows
from agent_engine.runs.spend import OwnerSpend as OwnerSpendValue
from agent_engine.runs.spend import agent_paces
from agent_engine.runtime.tools.registry import core_tools

Row = dict[str, Any]
Info = strawberry.Info[Context, None]
F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")


def awaited_later(value: Awaitable[T]) -> T:
    """A sync resolver's result that graphql-core awaits (it awaits any awaitable result).

    Resolvers whose value is usually at hand (prefetched for a page) stay sync: an async resolver
    costs a coroutine and a task per object even when there is nothing to wait for.
    """
    return cast(T, value)


def described(description: str) -> Callable[[F], F]:
    """`@strawberry.field(description=…)` with its type kept (Strawberry types it as Any)."""
    decorator: Callable[[F], F] = strawberry.field(description=description)
    return decorator


def described_mutation(description: str) -> Callable[[F], F]:
    decorator: Callable[[F], F] = strawberry.mutation(description=description)
    return decorator


# --- enums --------------------------------------------------------------------------------------


@strawberry.enum
class RunTrigger(Enum):
    MANUAL = "manual"
    SCHEDULED = "scheduled"


@strawberry.enum
class RunState(Enum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    SKIPPED = "skipped"


@strawberry.enum
class RunReason(Enum):
    BUDGET_EXCEEDED = "budget_exceeded"
    ALREADY_RUNNING = "already_running"
    ITERATION_CAP = "iteration_cap"
    ERROR = "error"
    STALE = "stale"
    CANCELLED = "cancelled"


@strawberry.enum
class RunStepKind(Enum):
    MODEL_CALL = "model_call"
    TOOL_CALL = "tool_call"


@strawberry.enum
class DeliveryStatus(Enum):
    PENDING = "pending"
    DELIVERED = "delivered"
    FAILED = "failed"


@strawberry.enum
class Cadence(Enum):
    DAILY = "daily"
    WEEKLY = "weekly"


@strawberry.enum(
    description=(
        "Derived from the definition, never stored. "
        "Precedence: ADMIN_PAUSED > DISABLED > NO_MODEL > SCHEDULED > MANUAL."
    )
)
class AgentStatus(Enum):
    SCHEDULED = strawberry.enum_value(
        "scheduled", description="Can start; has a schedule, so nextRunAt is set."
    )
    MANUAL = strawberry.enum_value(
        "manual", description="Can start; no schedule, manual runs only."
    )
    DISABLED = strawberry.enum_value("disabled", description="The owner's switch is off.")
    ADMIN_PAUSED = strawberry.enum_value(
        "admin_paused", description="An admin's lock is on; only an admin can lift it."
    )
    NO_MODEL = strawberry.enum_value(
        "no_model",
        description="No model chosen, or the chosen model was removed from the allowed list.",
    )


# --- ids and cursors ----------------------------------------------------------------------------

MAX_DATABASE_ID = 2**63 - 1


def parse_id(value: str | strawberry.ID, field: str) -> int:
    """A database id from its string form; anything else is the client's mistake."""
    text = str(value).strip()
    if not text.isdigit() or not 0 < int(text) <= MAX_DATABASE_ID:
        raise BadUserInput(field, f"not a valid id: {str(value)[:40]!r}")
    return int(text)


def encode_cursor(kind: str, ident: int) -> str:
    return base64.urlsafe_b64encode(f"{kind}:{ident}".encode()).decode().rstrip("=")


def decode_cursor(kind: str, cursor: str | None, field: str = "after") -> int | None:
    """Opaque cursors encode the id of the last row seen (keyset paging, newest first)."""
    if cursor is None:
        return None
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
    except (binascii.Error, UnicodeDecodeError, ValueError) as exc:
        raise BadUserInput(field, "not a cursor returned by this API") from exc
    prefix, _, ident = raw.partition(":")
    if prefix != kind or not ident.isdigit() or int(ident) > MAX_DATABASE_ID:
        raise BadUserInput(field, "not a cursor returned by this API")
    return int(ident)


# --- plain objects ------------------------------------------------------------------------------


@strawberry.type
class User:
    id: strawberry.ID
    email: str | None
    display_name: str | None
    timezone: str = strawberry.field(description="IANA zone; calendar schedules run in it.")
    active: bool = strawberry.field(
        description="False after deactivateOwner, until reactivateOwner."
    )

    @classmethod
    def from_row(cls, row: Row, *, platform_zone: str) -> User:
        return cls(
            id=strawberry.ID(str(row["id"])),
            email=row["email"],
            display_name=row["display_name"],
            timezone=row["timezone"] or platform_zone,
            active=bool(row["is_active"]),
        )


def _viewer_is_admin(info: Info) -> bool:
    viewer = info.context.viewer
    return viewer is not None and viewer.is_admin


@strawberry.type
class AgentModel:
    row: strawberry.Private[Row]
    id: strawberry.ID
    name: str
    provider: str = strawberry.field(description="openai | builtin")
    model: str = strawberry.field(description="The provider's model name, e.g. gpt-4o-mini.")
    is_default: bool = strawberry.field(description="Preselected for new agents.")
    max_concurrent_runs: int | None = strawberry.field(
        description=(
            "At most this many runs of this model are RUNNING at once across all workers; the"
            " rest wait QUEUED. null = no limit."
        )
    )
    input_price_per_million: DecimalText | None = strawberry.field(
        description=(
            "Price per million prompt (input) tokens, in PlatformSettings.currency; "
            "null = not priced."
        )
    )
    output_price_per_million: DecimalText | None = strawberry.field(
        description="Price per million completion (output) tokens; null = not priced."
    )

    @classmethod
    def from_row(cls, row: Row) -> AgentModel:
        return cls(
            row=row,
            id=strawberry.ID(str(row["id"])),
            name=row["name"],
            provider=row["provider"],
            model=row["model"],
            is_default=row["is_default"],
            max_concurrent_runs=row.get("max_concurrent_runs"),
            input_price_per_million=_decimal_or_none(row.get("input_price_per_million")),
            output_price_per_million=_decimal_or_none(row.get("output_price_per_million")),
        )

    # Where a model lives and which variable holds its key are the operator's business.
    @described(
        description=(
            "Admins only: null for everyone else. The OpenAI-compatible endpoint; null = the "
            "provider's default."
        )
    )
    def base_url(self, info: Info) -> str | None:
        return cast(str | None, self.row["base_url"]) if _viewer_is_admin(info) else None

    @described(
        description=(
            "Admins only: null for everyone else. The name of the environment variable that "
            "holds the key (never the key)."
        )
    )
    def api_key_env(self, info: Info) -> str | None:
        return cast(str | None, self.row["api_key_env"]) if _viewer_is_admin(info) else None


def _decimal_or_none(value: Decimal | None) -> DecimalText | None:
    return decimal_text(value) if value is not None else None


@strawberry.type
class Tool:
    id: strawberry.ID
    name: str
    description: str
    agents_allowed: bool

    @classmethod
    def from_row(cls, row: Row) -> Tool:
        return cls(
            id=strawberry.ID(str(row["id"])),
            name=row["name"],
            description=row["description"],
            agents_allowed=row["agents_allowed"],
        )


@strawberry.type
class IntervalSchedule:
    every_hours: int


@strawberry.type
class CalendarSchedule:
    cadence: Cadence
    weekday: int | None
    time: str


Schedule = Annotated[IntervalSchedule | CalendarSchedule, strawberry.union("Schedule")]


def schedule_from_json(value: dict[str, Any] | None) -> IntervalSchedule | CalendarSchedule | None:
    if value is None:
        return None
    if value.get("type") == "interval":
        return IntervalSchedule(every_hours=int(value["every_hours"]))
    return CalendarSchedule(
        cadence=Cadence(value["cadence"]),
        weekday=value.get("weekday"),
        time=str(value["time"]),
    )


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
        return _decimal_or_none(await info.context.loaders.budget_cost.load(self.owner_id))

    @strawberry.field
    async def forecast(self, info: Info) -> BudgetForecast:
        loaders = info.context.loaders
        agents = [
            row
            for row in await loaders.agents_of_owner.load(self.owner_id)
            if row["next_run_at"] is not None
        ]
        ids = [int(row["id"]) for row in agents]
        expected = dict(zip(ids, await loaders.expected_tokens.load_many(ids), strict=True))
        zone = await _owner_zone(info, self.owner_id)
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
            cost=_decimal_or_none(value.cost),
            runs=value.runs,
        )

    @strawberry.field
    async def owner(self, info: Info) -> User:
        return await _user(info, self.owner_id)


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
    def from_value(cls, alert: alert_rows.BudgetAlert) -> BudgetAlert:
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
        return await _user(info, self.owner_id)


async def _user(info: Info, user_id: int) -> User:
    row = await info.context.loaders.user.load(user_id)
    if row is None:  # the FKs cascade: spend and alerts never outlive their owner
        raise LookupError(f"user {user_id} vanished")
    platform = await info.context.loaders.platform()
    return User.from_row(row, platform_zone=platform.timezone)


@strawberry.type
class PlatformSettings:
    weekly_token_cap: int | None
    timezone: str
    platform_prompt: str
    iteration_cap: int
    currency: str = strawberry.field(
        description="ISO 4217 code the model prices are in; default USD."
    )
    budget_alert_percents: list[int] = strawberry.field(
        description=(
            "Thresholds, in percent of the cap, that record a BudgetAlert when crossed; "
            "default [80, 100]."
        )
    )
    run_retention_days: int | None = strawberry.field(
        description=(
            "Finished runs older than this many days are pruned, except the current budget week "
            "and each agent's last run; null = keep forever."
        )
    )

    @classmethod
    def from_value(cls, value: PlatformSettingsRow) -> PlatformSettings:
        return cls(
            weekly_token_cap=value.weekly_token_cap,
            timezone=value.timezone,
            platform_prompt=value.platform_prompt,
            iteration_cap=value.iteration_cap,
            currency=value.currency,
            budget_alert_percents=list(value.budget_alert_percents),
            run_retention_days=value.run_retention_days,
        )


@strawberry.type
class PageInfo:
    has_next_page: bool
    end_cursor: str | None


# --- transcript and delivery -------------------------------------------------------------------


@strawberry.type
class RunStep:
    index: int = strawberry.field(description="0, 1, 2 … in the order the steps started.")
    kind: RunStepKind
    name: str = strawberry.field(
        description="The model name for MODEL_CALL, the tool name for TOOL_CALL."
    )
    input: JSON | None = strawberry.field(
        description="TOOL_CALL: the arguments the model sent. Owner only."
    )
    output: str | None = strawberry.field(
        description=(
            "MODEL_CALL: the assistant text (may be empty when it only called tools); TOOL_CALL: "
            "the result as the model saw it (bounded). Owner only."
        )
    )
    error: str | None
    prompt_tokens: int | None
    completion_tokens: int | None
    started_at: datetime
    finished_at: datetime | None

    @classmethod
    def from_row(cls, row: Row, *, owner_view: bool) -> RunStep:
        """`owner_view`: the viewer owns the run; inputs and outputs were read with the owner's
        access and are the owner's alone (DESIGN §10)."""
        return cls(
            index=int(row["index"]),
            kind=RunStepKind(row["kind"]),
            name=row["name"],
            input=row["input"] if owner_view else None,
            output=row["output"] if owner_view else None,
            error=row["error"],
            prompt_tokens=row["prompt_tokens"],
            completion_tokens=row["completion_tokens"],
            started_at=row["started_at"],
            finished_at=row["finished_at"],
        )


@strawberry.type(
    description=(
        "An admin-approved place where run results are sent (an HTTPS webhook; http only for "
        "loopback)."
    )
)
class DeliveryTarget:
    id: strawberry.ID
    name: str
    url: str | None = strawberry.field(description="Admins only: null for everyone else.")
    secret_env: str | None = strawberry.field(
        description=(
            "Admins only: null for everyone else. The environment variable that holds the "
            "signing secret (whsec_… base64)."
        )
    )
    enabled: bool

    @classmethod
    def from_row(cls, row: Row, *, admin: bool) -> DeliveryTarget:
        return cls(
            id=strawberry.ID(str(row["id"])),
            name=row["name"],
            url=row["url"] if admin else None,
            secret_env=row["secret_env"] if admin else None,
            enabled=row["enabled"],
        )


@strawberry.type(
    description=(
        "One run's delivery to one target: signed per the Standard Webhooks specification, "
        "retried with backoff."
    )
)
class Delivery:
    target: DeliveryTarget
    status: DeliveryStatus
    webhook_id: str = strawberry.field(
        description="The webhook-id header; the same on every retry."
    )
    attempts: int
    last_status_code: int | None
    last_error: str | None
    delivered_at: datetime | None
    next_attempt_at: datetime | None = strawberry.field(
        description="When the next attempt is due (null once delivered or failed)."
    )

    @classmethod
    def from_row(cls, row: Row, *, admin: bool) -> Delivery:
        """A row of `run_deliveries` joined with its target's columns as `target_*`."""
        target = {
            "id": row["target_id"],
            "name": row["target_name"],
            "url": row["target_url"],
            "secret_env": row["target_secret_env"],
            "enabled": row["target_enabled"],
        }
        return cls(
            target=DeliveryTarget.from_row(target, admin=admin),
            status=DeliveryStatus(row["status"]),
            webhook_id=row["webhook_id"],
            attempts=int(row["attempts"]),
            last_status_code=row["last_status_code"],
            last_error=row["last_error"],
            delivered_at=row["delivered_at"],
            next_attempt_at=row["next_attempt_at"] if row["status"] == "pending" else None,
        )


async def viewer_owns_run(info: Info, run_row: Row) -> bool:
    """Whether the viewer is the owner of the run's agent (batched through the agent loader)."""
    viewer = info.context.viewer
    if viewer is None:
        return False
    agent = await info.context.loaders.agent.load(int(run_row["agent_id"]))
    return agent is not None and int(agent["user_id"]) == viewer.user_id


def viewer_is_admin(info: Info) -> bool:
    return info.context.viewer is not None and info.context.viewer.is_admin


# --- agents and runs ----------------------------------------------------------------------------


@strawberry.type
class Run:
    row: strawberry.Private[Row]
    id: strawberry.ID
    trigger: RunTrigger
    state: RunState
    reason: RunReason | None
    tokens_used: int
    error: str | None
    started_at: datetime | None
    finished_at: datetime | None
    heartbeat_at: datetime | None
    created_at: datetime
    # The agent's owner when the caller knows it (else `output` looks it up).
    owner_id: strawberry.Private[int | None] = None
    prompt_tokens: int = strawberry.field(
        description="Provider-reported prompt tokens; promptTokens + completionTokens = tokensUsed."
    )
    completion_tokens: int
    cost: DecimalText | None = strawberry.field(
        description=(
            "tokens priced at the model's prices at the time of the run; null when the model has "
            "no prices."
        )
    )

    @classmethod
    def from_row(cls, row: Row, *, owner_id: int | None = None) -> Run:
        if owner_id is None and row.get("owner_id") is not None:
            owner_id = int(row["owner_id"])
        return cls(
            row=row,
            owner_id=owner_id,
            prompt_tokens=int(row.get("prompt_tokens") or 0),
            completion_tokens=int(row.get("completion_tokens") or 0),
            cost=_decimal_or_none(row.get("cost")),
            id=strawberry.ID(str(row["id"])),
            trigger=RunTrigger(row["trigger"]),
            state=RunState(row["state"]),
            reason=RunReason(row["reason"]) if row["reason"] else None,
            tokens_used=int(row["tokens_used"]),
            error=row["error"],
            started_at=row["started_at"],
            finished_at=row["finished_at"],
            heartbeat_at=row["heartbeat_at"],
            created_at=row["created_at"],
        )

    # The output was read with the owner's Knowledge Store access: it is the owner's alone.
    @described(
        description=(
            "The agent's final answer. The run's owner only: null for anyone else, admins included."
        )
    )
    def output(self, info: Info) -> str | None:
        viewer = info.context.viewer
        if viewer is None or self.row["output"] is None:
            return None
        if self.owner_id is not None:
            return cast(str, self.row["output"]) if self.owner_id == viewer.user_id else None
        return awaited_later(self._output_for(info, viewer.user_id))

    async def _output_for(self, info: Info, viewer_id: int) -> str | None:
        agent = await info.context.loaders.agent.load(int(self.row["agent_id"]))
        if agent is None or int(agent["user_id"]) != viewer_id:
            return None
        return cast(str, self.row["output"])

    @described(
        description=(
            "The run's transcript in order: every model call and tool call. Inputs and outputs are "
            "visible to the run's owner only (null for others, admins included)."
        )
    )
    async def steps(self, info: Info) -> list[RunStep]:
        rows, owner_view = await asyncio.gather(
            info.context.loaders.steps_of_run.load(int(self.id)),
            viewer_owns_run(info, self.row),
        )
        return [RunStep.from_row(r, owner_view=owner_view) for r in rows]

    @described(description="One per delivery target attached to the agent when the run finished.")
    async def deliveries(self, info: Info) -> list[Delivery]:
        rows = await info.context.loaders.deliveries_of_run.load(int(self.id))
        admin = viewer_is_admin(info)
        return [Delivery.from_row(r, admin=admin) for r in rows]

    @strawberry.field
    async def agent(self, info: Info) -> Agent:
        row = await info.context.loaders.agent.load(int(self.row["agent_id"]))
        if row is None:
            # Deleted (hidden or gone) after this run was read: as for any vanished agent.
            raise NotFound("agent", self.row["agent_id"])
        return Agent.from_row(row)


@strawberry.type
class RunEdge:
    cursor: str
    node: Run


@strawberry.type
class RunConnection:
    edges: list[RunEdge]
    page_info: PageInfo

    @classmethod
    def from_rows(
        cls, rows: list[Row], first: int, *, owner_id: int | None = None
    ) -> RunConnection:
        page = rows[:first]
        edges = [
            RunEdge(
                cursor=encode_cursor("run", int(r["id"])), node=Run.from_row(r, owner_id=owner_id)
            )
            for r in page
        ]
        return cls(
            edges=edges,
            page_info=PageInfo(
                has_next_page=len(rows) > first,
                end_cursor=edges[-1].cursor if edges else None,
            ),
        )


def _gate(row: Row) -> dict[str, bool]:
    return {
        "enabled": bool(row["enabled"]),
        "admin_paused": bool(row["admin_paused"]),
        "has_model": row["model_id"] is not None,
    }


@dataclass(frozen=True)
class AgentRelations:
    """An agent's related rows, fetched for a whole page at once (Viewer.agents)."""

    model: Row | None
    tools: list[Row]
    active_run: Row | None
    last_run: Row | None


# GraphQL names of the Agent fields served from AgentRelations when a page asks for them.
_PREFETCHED_AGENT_FIELDS = frozenset({"model", "tools", "activeRun", "lastRun"})


@strawberry.type
class Agent:
    row: strawberry.Private[Row]
    id: strawberry.ID
    name: str
    description: str | None
    prompt: str
    enabled: bool
    admin_paused: bool
    next_run_at: datetime | None
    meta: JSON | None
    created_at: datetime
    updated_at: datetime
    relations: strawberry.Private[AgentRelations | None] = None

    @classmethod
    def from_row(cls, row: Row, relations: AgentRelations | None = None) -> Agent:
        return cls(
            row=row,
            relations=relations,
            id=strawberry.ID(str(row["id"])),
            name=row["name"],
            description=row["description"],
            prompt=row["prompt"],
            enabled=row["enabled"],
            admin_paused=row["admin_paused"],
            next_run_at=row["next_run_at"],
            meta=row["meta"],
            created_at=row["created_at"],
            updated_at=row["updated_at"],
        )

    @strawberry.field
    async def owner(self, info: Info) -> User:
        row = await info.context.loaders.user.load(int(self.row["user_id"]))
        if row is None:
            raise LookupError(f"owner of agent {self.id} vanished")
        platform = await info.context.loaders.platform()
        return User.from_row(row, platform_zone=platform.timezone)

    @strawberry.field
    def schedule(self) -> Schedule | None:
        return schedule_from_json(self.row["schedule"])

    @strawberry.field
    def model(self, info: Info) -> AgentModel | None:
        if self.relations is not None:
            row = self.relations.model
            return AgentModel.from_row(row) if row else None
        return awaited_later(self._load_model(info))

    async def _load_model(self, info: Info) -> AgentModel | None:
        if self.row["model_id"] is None:
            return None
        row = await info.context.loaders.model.load(int(self.row["model_id"]))
        return AgentModel.from_row(row) if row else None

    @strawberry.field
    def status(self) -> AgentStatus:
        status = gate.agent_status(**_gate(self.row), has_schedule=self.row["schedule"] is not None)
        return AgentStatus[status.name]

    @described(description="Why an admin paused it (null when not paused or no note was given).")
    def admin_pause_note(self) -> str | None:
        note: str | None = self.row.get("admin_pause_note")
        return note

    @described(
        description=(
            "True when the start gate is open "
            "(a manual start would be accepted or journaled as skipped)."
        )
    )
    def can_start(self) -> bool:
        return gate.closed_lock(**_gate(self.row)) is None

    @described(
        description=(
            "The next slots of the schedule (empty when the agent cannot start or has no "
            f"schedule). At most {MAX_UPCOMING_RUN_TIMES}."
        )
    )
    async def upcoming_run_times(self, info: Info, limit: int = 5) -> list[datetime]:
        if not 0 <= limit <= MAX_UPCOMING_RUN_TIMES:
            raise BadUserInput("limit", f"must be between 0 and {MAX_UPCOMING_RUN_TIMES}")
        first: datetime | None = self.row["next_run_at"]
        schedule = parse_schedule(self.row["schedule"])
        if limit == 0 or first is None or schedule is None or not self.can_start():
            return []
        zone = await _owner_zone(info, int(self.row["user_id"]))
        following = next_slots(schedule, after=first, zone=zone, count=limit - 1, anchor=first)
        return [first, *following][:limit]

    @described(description="The locked Knowledge Store tools every agent has.")
    def core_tools(self) -> list[str]:
        return list(core_tools())

    @described(
        description=(
            "The owner's optional selection, including tools an admin has since disallowed "
            "(agentsAllowed = false)."
        )
    )
    def tools(self, info: Info) -> list[Tool]:
        if self.relations is not None:
            return [Tool.from_row(r) for r in self.relations.tools]
        return awaited_later(self._load_tools(info))

    async def _load_tools(self, info: Info) -> list[Tool]:
        rows = await info.context.loaders.tools_of_agent.load(int(self.row["id"]))
        return [Tool.from_row(r) for r in rows]

    @described(description="The unfinished (queued or running) run, if any.")
    def active_run(self, info: Info) -> Run | None:
        if self.relations is not None:
            row = self.relations.active_run
            return self._run(row) if row else None
        return awaited_later(self._load_run(info.context.loaders.active_run))

    @described(description="The newest finished run (succeeded, failed or skipped).")
    def last_run(self, info: Info) -> Run | None:
        if self.relations is not None:
            row = self.relations.last_run
            return self._run(row) if row else None
        return awaited_later(self._load_run(info.context.loaders.last_run))

    @described(
        description=(
            "Median tokensUsed of this agent's last 10 SUCCEEDED or FAILED runs; null without "
            "history."
        )
    )
    async def expected_tokens_per_run(self, info: Info) -> int | None:
        return await info.context.loaders.expected_tokens.load(int(self.row["id"]))

    async def _load_run(self, loader: DataLoader[int, Row | None]) -> Run | None:
        row = await loader.load(int(self.row["id"]))
        return self._run(row) if row else None

    def _run(self, row: Row) -> Run:
        return Run.from_row(row, owner_id=int(self.row["user_id"]))

    @described(
        description=(
            "Where each finished run of this agent is delivered (admin-approved targets the owner "
            "picked)."
        )
    )
    async def delivery_targets(self, info: Info) -> list[DeliveryTarget]:
        rows = await info.context.loaders.targets_of_agent.load(int(self.row["id"]))
        admin = viewer_is_admin(info)
        return [DeliveryTarget.from_row(r, admin=admin) for r in rows]

    @described(description="The journal, newest first.")
    async def runs(
        self,
        info: Info,
        first: int = 20,
        after: str | None = None,
        states: list[RunState] | None = None,
    ) -> RunConnection:
        size = page_size(first)
        key = (
            int(self.row["id"]),
            size + 1,  # one more tells hasNextPage
            decode_cursor("run", after),
            tuple(sorted({s.value for s in states})) if states is not None else None,
        )
        rows = await info.context.loaders.run_page.load(key)
        return RunConnection.from_rows(rows, size, owner_id=int(self.row["user_id"]))


async def _owner_zone(info: Info, owner_id: int) -> Any:
    row = await info.context.loaders.user.load(owner_id)
    if row is not None and row["timezone"]:
        return zone_or_utc(row["timezone"])
    return (await info.context.loaders.platform()).zone


@strawberry.type
class AgentEdge:
    cursor: str
    node: Agent


@strawberry.type
class AgentConnection:
    edges: list[AgentEdge]
    page_info: PageInfo

    @classmethod
    def from_rows(cls, rows: list[Row], first: int) -> AgentConnection:
        page = rows[:first]
        edges = [
            AgentEdge(cursor=encode_cursor("agent", int(r["id"])), node=Agent.from_row(r))
            for r in page
        ]
        return cls(
            edges=edges,
            page_info=PageInfo(
                has_next_page=len(rows) > first,
                end_cursor=edges[-1].cursor if edges else None,
            ),
        )


@strawberry.type
class RunEvent:
    run: Run
    previous_state: RunState | None


@strawberry.type
class AuditEntry:
    entry: strawberry.Private[AuditRow]
    id: strawberry.ID
    at: datetime
    action: str = strawberry.field(
        description=(
            "e.g. agent.admin_paused, agent.admin_unpaused, agent.deleted, user.deactivated, "
            "user.reactivated, model.upserted, model.removed, tool.allowed, tool.disallowed, "
            "settings.updated, delivery_target.upserted"
        )
    )
    agent_id: strawberry.ID | None
    user_id: strawberry.ID | None
    details: JSON | None

    @classmethod
    def from_row(cls, entry: AuditRow) -> AuditEntry:
        def ident(value: int | None) -> strawberry.ID | None:
            return strawberry.ID(str(value)) if value is not None else None

        return cls(
            entry=entry,
            id=strawberry.ID(str(entry.id)),
            at=entry.at,
            action=entry.action,
            agent_id=ident(entry.agent_id),
            user_id=ident(entry.user_id),
            details=entry.details,
        )

    @described(description="The user who did it; null for the engine itself.")
    async def actor(self, info: Info) -> User | None:
        if self.entry.actor_id is None:
            return None
        row = await info.context.loaders.user.load(self.entry.actor_id)
        if row is None:
            return None
        platform = await info.context.loaders.platform()
        return User.from_row(row, platform_zone=platform.timezone)


@strawberry.type
class AuditEntryEdge:
    cursor: str
    node: AuditEntry


@strawberry.type
class AuditEntryConnection:
    edges: list[AuditEntryEdge]
    page_info: PageInfo

    @classmethod
    def from_rows(cls, rows: list[AuditRow], first: int) -> AuditEntryConnection:
        page = rows[:first]
        edges = [
            AuditEntryEdge(cursor=encode_cursor("audit", r.id), node=AuditEntry.from_row(r))
            for r in page
        ]
        return cls(
            edges=edges,
            page_info=PageInfo(
                has_next_page=len(rows) > first,
                end_cursor=edges[-1].cursor if edges else None,
            ),
        )


@strawberry.type
class Viewer:
    viewer_id: strawberry.Private[int]
    is_admin: bool

    @strawberry.field
    async def user(self, info: Info) -> User:
        row = await info.context.loaders.user.load(self.viewer_id)
        if row is None:
            raise LookupError(f"viewer {self.viewer_id} vanished")
        platform = await info.context.loaders.platform()
        return User.from_row(row, platform_zone=platform.timezone)

    @described(description="The viewer's own agents, oldest first.")
    async def agents(self, info: Info) -> list[Agent]:
        loaders = info.context.loaders
        rows = await loaders.agents_of_owner.load(self.viewer_id)
        for row in rows:
            loaders.prime_agent(row)
        if not rows or not _PREFETCHED_AGENT_FIELDS & _selected_names(info.selected_fields):
            return [Agent.from_row(r) for r in rows]
        # The whole page's relations at once, one statement each, so the per-agent fields need
        # no awaiting (see `awaited_later`).
        ids = [int(r["id"]) for r in rows]
        model_ids = sorted({int(r["model_id"]) for r in rows if r["model_id"] is not None})
        found = await loaders.page_relations(ids, model_ids)
        return [
            Agent.from_row(
                row,
                AgentRelations(
                    model=found.models.get(row["model_id"]),
                    tools=found.tools[agent_id],
                    active_run=found.active_runs.get(agent_id),
                    last_run=found.last_runs.get(agent_id),
                ),
            )
            for row, agent_id in zip(rows, ids, strict=True)
        ]

    @strawberry.field
    async def budget(self, info: Info) -> Budget:
        value = await info.context.loaders.budget.load(self.viewer_id)
        return Budget.from_value(value, owner_id=self.viewer_id)

    @described(description="This week's alerts for the viewer's own spend.")
    async def budget_alerts(self, info: Info) -> list[BudgetAlert]:
        alerts = await info.context.loaders.alerts_this_week.load(self.viewer_id)
        return [BudgetAlert.from_value(alert) for alert in alerts]


def _selected_names(fields: list[Selection]) -> set[str]:
    """The names of the fields selected below `fields` (the resolver's own), through fragments."""
    names: set[str] = set()
    pending: list[Selection] = [selection for field in fields for selection in field.selections]
    while pending:
        selection = pending.pop()
        if isinstance(selection, SelectedField):
            names.add(selection.name)
        else:
            pending.extend(selection.selections)
    return names


# --- inputs -------------------------------------------------------------------------------------


@strawberry.input
class IntervalScheduleInput:
    every_hours: int


@strawberry.input(
    description=(
        "weekday: 0 = Monday … 6 = Sunday, required for WEEKLY. time: HH:MM in the owner's zone."
    )
)
class CalendarScheduleInput:
    cadence: Cadence
    time: str
    weekday: int | None = None


@strawberry.input(one_of=True)
class ScheduleInput:
    interval: IntervalScheduleInput | None = strawberry.UNSET
    calendar: CalendarScheduleInput | None = strawberry.UNSET


@strawberry.input
class CreateAgentInput:
    name: str
    prompt: str
    description: str | None = None
    schedule: ScheduleInput | None = None
    model_id: strawberry.ID | None = strawberry.field(
        default=None, description="Defaults to the allowed list's default model."
    )
    tool_ids: list[strawberry.ID] | None = None
    enabled: bool = True
    meta: JSON | None = None


@strawberry.input(
    description=(
        "An absent field is left unchanged; an explicit null clears description, schedule or meta."
    )
)
class UpdateAgentInput:
    name: str | None = strawberry.UNSET
    description: str | None = strawberry.UNSET
    prompt: str | None = strawberry.UNSET
    schedule: ScheduleInput | None = strawberry.UNSET
    model_id: strawberry.ID | None = strawberry.UNSET
    meta: JSON | None = strawberry.UNSET


@strawberry.input
class AgentModelInput:
    name: str
    provider: str
    model: str
    id: strawberry.ID | None = strawberry.field(default=None, description="Omit to create.")
    base_url: str | None = None
    api_key_env: str | None = None
    is_default: bool = False
    max_concurrent_runs: int | None = strawberry.field(
        default=strawberry.UNSET,
        description="Absent: unchanged (on create: no limit). Explicit null: no limit.",
    )
    input_price_per_million: DecimalText | None = strawberry.field(
        default=strawberry.UNSET, description="Absent: unchanged. Explicit null: not priced."
    )
    output_price_per_million: DecimalText | None = strawberry.UNSET


@strawberry.input
class DeliveryTargetInput:
    name: str
    url: str
    secret_env: str
    id: strawberry.ID | None = strawberry.field(default=None, description="Omit to create.")
    enabled: bool = True


@strawberry.input
class PlatformSettingsInput:
    weekly_token_cap: int | None = strawberry.field(
        default=strawberry.UNSET, description="Absent: unchanged. Explicit null: no cap."
    )
    timezone: str | None = strawberry.UNSET
    platform_prompt: str | None = strawberry.UNSET
    iteration_cap: int | None = strawberry.UNSET
    currency: str | None = strawberry.UNSET
    budget_alert_percents: list[int] | None = strawberry.UNSET
    run_retention_days: int | None = strawberry.field(
        default=strawberry.UNSET, description="Absent: unchanged. Explicit null: keep forever."
    )
