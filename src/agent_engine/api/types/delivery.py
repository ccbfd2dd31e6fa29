"""Where run results go: delivery targets and one run's deliveries to them."""

from __future__ import annotations

from datetime import datetime

import strawberry

from agent_engine.db.deliveries import DeliveryTargetRow, RunDeliveryRow
from agent_engine.domain.delivery import DeliveryStatus


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
    def from_row(cls, row: DeliveryTargetRow, *, admin: bool) -> DeliveryTarget:
        return cls(
            id=strawberry.ID(str(row.id)),
            name=row.name,
            url=row.url if admin else None,
            secret_env=row.secret_env if admin else None,
            enabled=row.enabled,
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
    def from_row(cls, row: RunDeliveryRow, *, admin: bool) -> Delivery:
        status = DeliveryStatus(row.status)
        return cls(
            target=DeliveryTarget.from_row(row.target, admin=admin),
            status=status,
            webhook_id=row.webhook_id,
            attempts=row.attempts,
            last_status_code=row.last_status_code,
            last_error=row.last_error,
            delivered_at=row.delivered_at,
            next_attempt_at=row.next_attempt_at if status is DeliveryStatus.PENDING else None,
        )
