"""Runs waiting for their owner's account at an OWNER_OAUTH tool source (`connection_waits`).

Like an approval (`tool_sources.ToolApproval`): the run is parked on the row, `checkpoint` holds
the conversation so far, so any worker can resume it, and `call_started_at` is the compare-and-set
that makes the call happen at most once. `taken_at` marks the wait a worker took back, so the
run's next park is never confused with it."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    DateTime,
    ForeignKey,
    Identity,
    Index,
    Integer,
    Text,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from agent_engine.db.models.base import Base

WAIT_STATUSES = ("pending", "connected", "expired", "cancelled")


class ConnectionWait(Base):
    __tablename__ = "connection_waits"
    __table_args__ = (
        CheckConstraint(
            "status IN (" + ", ".join(f"'{s}'" for s in WAIT_STATUSES) + ")", name="status"
        ),
        # One wait a run is parked on (or about to resume from) at a time.
        Index(
            "uq_connection_waits_open_run",
            "run_id",
            unique=True,
            postgresql_where=text("taken_at IS NULL AND status <> 'cancelled'"),
        ),
        # The owner connects: every run of theirs waiting on that source.
        Index(
            "ix_connection_waits_owner_source",
            "owner_id",
            "source_id",
            postgresql_where=text("status = 'pending'"),
        ),
        Index(
            "ix_connection_waits_expiry", "expires_at", postgresql_where=text("status = 'pending'")
        ),
    )

    id: Mapped[int] = mapped_column(BigInteger, Identity(always=False), primary_key=True)
    run_id: Mapped[int] = mapped_column(
        BigInteger, ForeignKey("agent_runs.id", ondelete="CASCADE"), nullable=False, index=True
    )
    agent_id: Mapped[int] = mapped_column(
        BigInteger, ForeignKey("agents.id", ondelete="CASCADE"), nullable=False, index=True
    )
    owner_id: Mapped[int] = mapped_column(
        BigInteger, ForeignKey("users.id", ondelete="CASCADE"), nullable=False
    )
    # The source may be removed while the run waits; its name stays (what the model hears).
    source_id: Mapped[int | None] = mapped_column(
        BigInteger, ForeignKey("tool_sources.id", ondelete="SET NULL"), index=True
    )
    source_name: Mapped[str] = mapped_column(Text, nullable=False)
    step_index: Mapped[int] = mapped_column(Integer, nullable=False)
    tool_id: Mapped[int | None] = mapped_column(
        BigInteger, ForeignKey("tools.id", ondelete="SET NULL"), index=True
    )
    tool_name: Mapped[str] = mapped_column(Text, nullable=False)
    status: Mapped[str] = mapped_column(Text, nullable=False, server_default="pending")
    requested_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), nullable=False, server_default=func.now()
    )
    expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False)
    resolved_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    taken_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    checkpoint: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    call_started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
