"""MCP tool sources (an admin's servers whose tools join the catalog) and the owners' approvals
of write-tool calls (e0007_mcp_tools)."""

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
    func,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from agent_engine.db.models.base import Base, created_at, in_list
from agent_engine.domain.mcp import ApprovalStatus


class ToolSource(Base):
    __tablename__ = "tool_sources"
    __table_args__ = (CheckConstraint("name ~ '^[a-z][a-z0-9_]{0,31}$'", name="name"),)

    id: Mapped[int] = mapped_column(BigInteger, Identity(always=False), primary_key=True)
    name: Mapped[str] = mapped_column(Text, nullable=False, unique=True)
    url: Mapped[str] = mapped_column(Text, nullable=False)
    # The variable holding the bearer credential (never the credential).
    auth_env: Mapped[str | None] = mapped_column(Text)
    enabled: Mapped[bool] = mapped_column(Boolean, nullable=False, server_default=text("true"))
    last_synced_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    last_error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = created_at()
    updated_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), nullable=False, server_default=func.now()
    )


class ToolApproval(Base):
    """A WRITE tool call waiting for (or decided by) the run's owner. The run is parked on it:
    `checkpoint` holds the conversation so far, so any worker can resume it. `call_started_at` is
    the compare-and-set that makes the call happen at most once."""

    __tablename__ = "tool_approvals"
    __table_args__ = (
        CheckConstraint(in_list("status", ApprovalStatus), name="status"),
        # One approval a run waits on at a time.
        Index(
            "uq_tool_approvals_pending_run",
            "run_id",
            unique=True,
            postgresql_where=text("status = 'pending'"),
        ),
        Index("ix_tool_approvals_owner", "owner_id", text("id DESC")),
        Index(
            "ix_tool_approvals_expiry",
            "expires_at",
            postgresql_where=text("status = 'pending'"),
        ),
    )

    id: Mapped[int] = mapped_column(BigInteger, Identity(always=False), primary_key=True)
    run_id: Mapped[int] = mapped_column(
        BigInteger, ForeignKey("agent_runs.id", ondelete="CASCADE"), nullable=False, index=True
    )
    agent_id: Mapped[int] = mapped_column(
        BigInteger, ForeignKey("agents.id", ondelete="CASCADE"), nullable=False
    )
    owner_id: Mapped[int] = mapped_column(
        BigInteger, ForeignKey("users.id", ondelete="CASCADE"), nullable=False
    )
    step_index: Mapped[int] = mapped_column(Integer, nullable=False)
    # The tool may leave the catalog while the approval waits; its name stays.
    tool_id: Mapped[int | None] = mapped_column(
        BigInteger, ForeignKey("tools.id", ondelete="SET NULL"), index=True
    )
    tool_name: Mapped[str] = mapped_column(Text, nullable=False)
    input: Mapped[Any] = mapped_column(JSONB, nullable=True)
    status: Mapped[str] = mapped_column(Text, nullable=False, server_default="pending")
    requested_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), nullable=False, server_default=func.now()
    )
    expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False)
    decided_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    decided_by: Mapped[int | None] = mapped_column(BigInteger)
    note: Mapped[str | None] = mapped_column(Text)
    checkpoint: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    call_started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
