"""What operators read: the audit log and the engine's periodic activity."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    DateTime,
    Identity,
    Index,
    Text,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from agent_engine.db.models.base import Base


class AuditEntry(Base):
    """Append-only (a trigger refuses UPDATE and DELETE). No foreign keys: an entry outlives the
    agent or user it names -- deleting an agent is itself an audited action."""

    __tablename__ = "audit_log"
    __table_args__ = (
        Index("ix_audit_log_agent_id", "agent_id", text("id DESC")),
        Index("ix_audit_log_user_id", "user_id", text("id DESC")),
        Index("ix_audit_log_actor_id", "actor_id", text("id DESC")),
    )

    id: Mapped[int] = mapped_column(BigInteger, Identity(always=False), primary_key=True)
    at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), nullable=False, server_default=func.now()
    )
    actor_id: Mapped[int | None] = mapped_column(BigInteger)  # None: the engine itself
    action: Mapped[str] = mapped_column(Text, nullable=False)
    agent_id: Mapped[int | None] = mapped_column(BigInteger)
    user_id: Mapped[int | None] = mapped_column(BigInteger)
    details: Mapped[dict[str, Any] | None] = mapped_column(JSONB)


class EngineActivity(Base):
    """Cluster-wide counters and last-seen times of the engine's periodic work (ticks, pruning),
    read by `/metrics` at scrape time like the journal families."""

    __tablename__ = "engine_activity"

    name: Mapped[str] = mapped_column(Text, primary_key=True)
    count: Mapped[int] = mapped_column(BigInteger, nullable=False, server_default="0")
    last_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
