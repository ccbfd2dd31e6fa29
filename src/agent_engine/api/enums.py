"""The contract's enums."""

from __future__ import annotations

from enum import Enum

import strawberry


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
