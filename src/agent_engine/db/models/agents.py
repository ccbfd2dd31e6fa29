"""The engine's agents and their optional tools (the seed's tables, column by column)."""

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
    Text,
    UniqueConstraint,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from agent_engine.db.models.base import Base, created_at

ADMIN_PAUSE_NOTE_MAX_CHARS = 500


class Agent(Base):
    __tablename__ = "agents"
    __table_args__ = (
        CheckConstraint(
            "admin_pause_note IS NULL"
            f" OR (admin_paused AND char_length(admin_pause_note) <= {ADMIN_PAUSE_NOTE_MAX_CHARS})",
            name="admin_pause_note",
        ),
        # The due scan reads only agents with a slot; NULL (gate closed, manual) is not indexed.
        Index(
            "ix_agents_next_run_at",
            "next_run_at",
            postgresql_where=text("next_run_at IS NOT NULL"),
        ),
        # A hidden (deleted) agent is switched off: the gate stays closed, it never runs again.
        CheckConstraint("deleted_at IS NULL OR NOT enabled", name="hidden_is_switched_off"),
        # The owner's caps on the agent's tokens (e0012_runs_recover); NULL = none.
        CheckConstraint(
            "weekly_token_cap IS NULL OR weekly_token_cap > 0", name="weekly_token_cap_positive"
        ),
        CheckConstraint(
            "max_tokens_per_run IS NULL OR max_tokens_per_run > 0",
            name="max_tokens_per_run_positive",
        ),
        # The purge of hidden agents reads only them.
        Index(
            "ix_agents_deleted_at",
            "deleted_at",
            postgresql_where=text("deleted_at IS NOT NULL"),
        ),
    )

    id: Mapped[int] = mapped_column(BigInteger, Identity(always=False), primary_key=True)
    user_id: Mapped[int] = mapped_column(
        BigInteger, ForeignKey("users.id", ondelete="CASCADE"), nullable=False, index=True
    )
    name: Mapped[str] = mapped_column(Text, nullable=False)
    description: Mapped[str | None] = mapped_column(Text)
    prompt: Mapped[str] = mapped_column(Text, nullable=False)
    schedule: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    model_id: Mapped[int | None] = mapped_column(
        BigInteger, ForeignKey("agent_models.id", ondelete="SET NULL"), index=True
    )
    enabled: Mapped[bool] = mapped_column(Boolean, nullable=False, server_default=text("true"))
    admin_paused: Mapped[bool] = mapped_column(
        Boolean, nullable=False, server_default=text("false")
    )
    next_run_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    meta: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    created_at: Mapped[datetime] = created_at()
    updated_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), nullable=False, server_default=func.now()
    )
    # Set by deleteAgent while the agent's runs still count in a budget week.
    deleted_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # Why an admin paused it, shown to the owner; only while paused (a CHECK of e0005_operators).
    admin_pause_note: Mapped[str | None] = mapped_column(Text)
    # The owner's caps: tokens per budget week, tokens per run (e0012_runs_recover).
    weekly_token_cap: Mapped[int | None] = mapped_column(BigInteger)
    max_tokens_per_run: Mapped[int | None] = mapped_column(BigInteger)


class AgentTool(Base):
    __tablename__ = "agent_tools"
    __table_args__ = (UniqueConstraint("agent_id", "tool_id"),)

    id: Mapped[int] = mapped_column(BigInteger, Identity(always=False), primary_key=True)
    agent_id: Mapped[int] = mapped_column(
        BigInteger, ForeignKey("agents.id", ondelete="CASCADE"), nullable=False, index=True
    )
    tool_id: Mapped[int] = mapped_column(
        BigInteger, ForeignKey("tools.id", ondelete="CASCADE"), nullable=False, index=True
    )
    created_at: Mapped[datetime] = created_at()
    # A WRITE tool the owner lets run without asking (setToolAutoApproved; e0007_mcp_tools).
    auto_approved: Mapped[bool] = mapped_column(
        Boolean, nullable=False, server_default=text("false")
    )
