"""Strawberry types of the contract, each built from a database row by a `from_row` constructor.

Related objects are resolved through the request's DataLoaders, never by a query per object.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from enum import Enum
from typing import Annotated, Any, TypeVar, cast

import strawberry
from strawberry.dataloader import DataLoader
from strawberry.scalars import JSON
from strawberry.types.nodes import SelectedField, Selection

from agent_engine.api.context import Context
from agent_engine.api.errors import BadUserInput
from agent_engine.api.guards import MAX_UPCOMING_RUN_TIMES, page_size
from agent_engine.db.platform import PlatformSettings as PlatformSettingsRow
from agent_engine.db.platform import zone_or_utc
from agent_engine.domain import gate
from agent_engine.domain.budget import Budget as BudgetValue
from agent_engine.domain.schedule import next_slots, parse_schedule
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

    @classmethod
    def from_row(cls, row: Row, *, platform_zone: str) -> User:
        return cls(
            id=strawberry.ID(str(row["id"])),
            email=row["email"],
            display_name=row["display_name"],
            timezone=row["timezone"] or platform_zone,
        )


@strawberry.type
class AgentModel:
    id: strawberry.ID
    name: str
    provider: str = strawberry.field(description="openai | builtin")
    model: str = strawberry.field(description="The provider's model name, e.g. gpt-4o-mini.")
    is_default: bool = strawberry.field(description="Preselected for new agents.")
    base_url: str | None = strawberry.field(
        description="OpenAI-compatible endpoint; null = the provider's default."
    )
    api_key_env: str | None = strawberry.field(
        description="Name of the environment variable that holds the API key (never the key)."
    )

    @classmethod
    def from_row(cls, row: Row) -> AgentModel:
        return cls(
            id=strawberry.ID(str(row["id"])),
            name=row["name"],
            provider=row["provider"],
            model=row["model"],
            is_default=row["is_default"],
            base_url=row["base_url"],
            api_key_env=row["api_key_env"],
        )


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
    cap_tokens: int | None = strawberry.field(description="null when no cap is configured")
    used_tokens: int
    remaining_tokens: int | None = strawberry.field(description="null when no cap is configured")
    exceeded: bool
    window_start: datetime
    window_end: datetime
    timezone: str

    @classmethod
    def from_value(cls, budget: BudgetValue) -> Budget:
        return cls(
            cap_tokens=budget.cap_tokens,
            used_tokens=budget.used_tokens,
            remaining_tokens=budget.remaining_tokens,
            exceeded=budget.exceeded,
            window_start=budget.window.start,
            window_end=budget.window.end,
            timezone=str(budget.window.timezone),
        )


@strawberry.type
class PlatformSettings:
    weekly_token_cap: int | None
    timezone: str
    platform_prompt: str
    iteration_cap: int

    @classmethod
    def from_value(cls, value: PlatformSettingsRow) -> PlatformSettings:
        return cls(
            weekly_token_cap=value.weekly_token_cap,
            timezone=value.timezone,
            platform_prompt=value.platform_prompt,
            iteration_cap=value.iteration_cap,
        )


@strawberry.type
class PageInfo:
    has_next_page: bool
    end_cursor: str | None


# --- agents and runs ----------------------------------------------------------------------------


@strawberry.type
class Run:
    row: strawberry.Private[Row]
    id: strawberry.ID
    trigger: RunTrigger
    state: RunState
    reason: RunReason | None
    output: str | None
    tokens_used: int
    error: str | None
    started_at: datetime | None
    finished_at: datetime | None
    heartbeat_at: datetime | None
    created_at: datetime

    @classmethod
    def from_row(cls, row: Row) -> Run:
        return cls(
            row=row,
            id=strawberry.ID(str(row["id"])),
            trigger=RunTrigger(row["trigger"]),
            state=RunState(row["state"]),
            reason=RunReason(row["reason"]) if row["reason"] else None,
            output=row["output"],
            tokens_used=int(row["tokens_used"]),
            error=row["error"],
            started_at=row["started_at"],
            finished_at=row["finished_at"],
            heartbeat_at=row["heartbeat_at"],
            created_at=row["created_at"],
        )

    @strawberry.field
    async def agent(self, info: Info) -> Agent:
        row = await info.context.loaders.agent.load(int(self.row["agent_id"]))
        if row is None:  # the FK cascades: a run never outlives its agent
            raise LookupError(f"agent {self.row['agent_id']} of run {self.id} vanished")
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
    def from_rows(cls, rows: list[Row], first: int) -> RunConnection:
        page = rows[:first]
        edges = [
            RunEdge(cursor=encode_cursor("run", int(r["id"])), node=Run.from_row(r)) for r in page
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
            return Run.from_row(row) if row else None
        return awaited_later(self._load_run(info.context.loaders.active_run))

    @described(description="The newest finished run (succeeded, failed or skipped).")
    def last_run(self, info: Info) -> Run | None:
        if self.relations is not None:
            row = self.relations.last_run
            return Run.from_row(row) if row else None
        return awaited_later(self._load_run(info.context.loaders.last_run))

    async def _load_run(self, loader: DataLoader[int, Row | None]) -> Run | None:
        row = await loader.load(int(self.row["id"]))
        return Run.from_row(row) if row else None

    @described(description="The journal, newest first.")
    async def runs(
        self,
        info: Info,
        first: int = 20,
        after: str | None = None,
        states: list[RunState] | None = None,
    ) -> RunConnection:
        from agent_engine.api.queries import fetch_runs

        size = page_size(first)
        rows = await fetch_runs(
            info.context.engine,
            first=size,
            after=decode_cursor("run", after),
            agent_id=int(self.row["id"]),
            states=states,
        )
        return RunConnection.from_rows(rows, size)


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
        return Budget.from_value(await info.context.loaders.budget.load(self.viewer_id))


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


@strawberry.input
class PlatformSettingsInput:
    weekly_token_cap: int | None = strawberry.field(
        default=strawberry.UNSET, description="Absent: unchanged. Explicit null: no cap."
    )
    timezone: str | None = strawberry.UNSET
    platform_prompt: str | None = strawberry.UNSET
    iteration_cap: int | None = strawberry.UNSET
