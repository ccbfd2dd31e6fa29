"""The contract's enums that need more than the domain's enum gives.

The others (RunState, RunTrigger, RunReason, RunStepKind, DeliveryStatus, Cadence) are the domain's
own enums, which Strawberry serves as they are: a GraphQL value is the member's name.
"""

from __future__ import annotations

from enum import Enum

import strawberry

from agent_engine.domain import gate


# Strawberry reads value descriptions only from `strawberry.enum_value` members, so this one is a
# class of its own; its members are the domain's, and a unit test keeps the two in step.
@strawberry.enum(
    description=(
        "Derived from the definition, never stored. "
        "Precedence: ADMIN_PAUSED > DISABLED > NO_MODEL > SCHEDULED > MANUAL."
    )
)
class AgentStatus(Enum):
    SCHEDULED = strawberry.enum_value(
        gate.AgentStatus.SCHEDULED,
        description="Can start; has a schedule, so nextRunAt is set.",
    )
    MANUAL = strawberry.enum_value(
        gate.AgentStatus.MANUAL, description="Can start; no schedule, manual runs only."
    )
    DISABLED = strawberry.enum_value(
        gate.AgentStatus.DISABLED, description="The owner's switch is off."
    )
    ADMIN_PAUSED = strawberry.enum_value(
        gate.AgentStatus.ADMIN_PAUSED,
        description="An admin's lock is on; only an admin can lift it.",
    )
    NO_MODEL = strawberry.enum_value(
        gate.AgentStatus.NO_MODEL,
        description="No model chosen, or the chosen model was removed from the allowed list.",
    )
