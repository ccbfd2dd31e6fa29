"""The contract's input objects."""

from __future__ import annotations

import strawberry
from strawberry.scalars import JSON

from agent_engine.api.scalars import DecimalText
from agent_engine.api.types.connections import ToolSourceAuth
from agent_engine.domain.schedule import Cadence


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
    weekly_token_cap: int | None = None
    max_tokens_per_run: int | None = None


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
    weekly_token_cap: int | None = strawberry.field(
        default=strawberry.UNSET, description="Explicit null: no cap."
    )
    max_tokens_per_run: int | None = strawberry.field(
        default=strawberry.UNSET, description="Explicit null: no cap."
    )


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
    fallback_model_id: strawberry.ID | None = strawberry.field(
        default=strawberry.UNSET,
        description=(
            "Absent: unchanged. Explicit null: none. Must be another model of the allowed list; a"
            " chain that comes back to this model is BAD_USER_INPUT."
        ),
    )


@strawberry.input
class DeliveryTargetInput:
    name: str
    url: str
    secret_env: str
    id: strawberry.ID | None = strawberry.field(default=None, description="Omit to create.")
    enabled: bool = True


@strawberry.input
class ToolSourceInput:
    name: str
    url: str = strawberry.field(
        description=(
            "http(s) URL of the server's Streamable HTTP endpoint; http only for loopback; no "
            "credentials in the URL."
        )
    )
    id: strawberry.ID | None = strawberry.field(default=None, description="Omit to create.")
    auth_env: str | None = None
    auth: ToolSourceAuth | None = strawberry.field(
        default=None, description="Absent: SHARED when authEnv is set, else NONE."
    )
    oauth_scopes: list[str] | None = None
    oauth_client_id_env: str | None = strawberry.field(
        default=None,
        description=(
            "OWNER_OAUTH with a client registered in advance (no dynamic client registration): "
            "the variables holding its id and secret."
        ),
    )
    oauth_client_secret_env: str | None = None
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
