"""Delivery targets, the agents' choice of them, and the outbox of run deliveries."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    DateTime,
    ForeignKey,
    Identity,
    Index,
    Integer,
    Text,
    UniqueConstraint,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from agent_engine.db.models.base import Base, created_at, in_list
from agent_engine.domain.delivery import DeliveryStatus


class DeliveryTarget(Base):
    """An admin-approved webhook; `secret_env` names the variable holding its whsec_ secret."""

    __tablename__ = "delivery_targets"

    id: Mapped[int] = mapped_column(BigInteger, Identity(always=False), primary_key=True)
    name: Mapped[str] = mapped_column(Text, nullable=False)
    url: Mapped[str] = mapped_column(Text, nullable=False)
    secret_env: Mapped[str] = mapped_column(Text, nullable=False)
    enabled: Mapped[bool] = mapped_column(Boolean, nullable=False, server_default=text("true"))
    created_at: Mapped[datetime] = created_at()
    updated_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), nullable=False, server_default=func.now()
    )


class AgentDeliveryTarget(Base):
    """The owner's choice of targets for an agent (like agent_tools for tools)."""

    __tablename__ = "agent_delivery_targets"

    agent_id: Mapped[int] = mapped_column(
        BigInteger, ForeignKey("agents.id", ondelete="CASCADE"), primary_key=True
    )
    target_id: Mapped[int] = mapped_column(
        BigInteger,
        ForeignKey("delivery_targets.id", ondelete="CASCADE"),
        primary_key=True,
        index=True,
    )
    created_at: Mapped[datetime] = created_at()


class RunDelivery(Base):
    """The outbox: one row per (terminal run, target), written in the run's finishing transaction
    by a trigger, then sent (and retried) by the delivery actors."""

    __tablename__ = "run_deliveries"
    __table_args__ = (
        CheckConstraint(in_list("status", DeliveryStatus), name="status"),
        UniqueConstraint("run_id", "target_id"),
        # The dispatcher's scan: pending deliveries by due time, a small partial index.
        Index(
            "ix_run_deliveries_due",
            "next_attempt_at",
            postgresql_where=text(f"status = {str(DeliveryStatus.PENDING)!r}"),
        ),
        Index(
            "ix_run_deliveries_finished_at",
            "finished_at",
            postgresql_where=text("finished_at IS NOT NULL"),
        ),
    )

    id: Mapped[int] = mapped_column(BigInteger, Identity(always=False), primary_key=True)
    run_id: Mapped[int] = mapped_column(
        BigInteger, ForeignKey("agent_runs.id", ondelete="CASCADE"), nullable=False
    )
    target_id: Mapped[int] = mapped_column(
        BigInteger,
        ForeignKey("delivery_targets.id", ondelete="CASCADE"),
        nullable=False,
        index=True,
    )
    # The `webhook-id` header: the same on every attempt, so receivers can deduplicate.
    webhook_id: Mapped[str] = mapped_column(Text, nullable=False, unique=True)
    event_type: Mapped[str] = mapped_column(Text, nullable=False)
    # The body, fixed when the run finished: every attempt sends the same bytes.
    payload: Mapped[Any] = mapped_column(JSONB, nullable=False)
    status: Mapped[str] = mapped_column(Text, nullable=False, server_default="pending")
    attempts: Mapped[int] = mapped_column(Integer, nullable=False, server_default="0")
    next_attempt_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # Set when the dispatcher hands the delivery to an actor; only that message may record the
    # attempt (a duplicate or a late one matches no row). Expired leases are dispatched again.
    lease_token: Mapped[str | None] = mapped_column(Text)
    leased_until: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    last_status_code: Mapped[int | None] = mapped_column(Integer)
    last_error: Mapped[str | None] = mapped_column(Text)
    delivered_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    created_at: Mapped[datetime] = created_at()
