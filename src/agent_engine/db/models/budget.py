"""The budget alerts recorded when an owner's week crosses a threshold of the cap."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    DateTime,
    ForeignKey,
    Identity,
    Integer,
    UniqueConstraint,
    func,
)
from sqlalchemy.orm import Mapped, mapped_column

from agent_engine.db.models.base import Base


class BudgetAlert(Base):
    """An owner's week crossed a threshold of the cap: once per owner, week and percent."""

    __tablename__ = "budget_alerts"
    __table_args__ = (
        UniqueConstraint("owner_id", "window_start", "percent"),
        CheckConstraint("percent >= 1 AND percent <= 100", name="percent_range"),
    )

    id: Mapped[int] = mapped_column(BigInteger, Identity(always=False), primary_key=True)
    owner_id: Mapped[int] = mapped_column(
        BigInteger, ForeignKey("users.id", ondelete="CASCADE"), nullable=False
    )
    window_start: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False)
    percent: Mapped[int] = mapped_column(Integer, nullable=False)
    used_tokens: Mapped[int] = mapped_column(BigInteger, nullable=False)
    cap_tokens: Mapped[int] = mapped_column(BigInteger, nullable=False)
    crossed_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), nullable=False, server_default=func.now()
    )


class BudgetWeek(Base):
    """An owner's tokens in one budget week, kept by the database as runs finish (migration
    `e0008_budget_weeks`): what the budget gate reads instead of summing the week."""

    __tablename__ = "budget_weeks"

    user_id: Mapped[int] = mapped_column(
        BigInteger, ForeignKey("users.id", ondelete="CASCADE"), primary_key=True
    )
    window_start: Mapped[datetime] = mapped_column(DateTime(timezone=True), primary_key=True)
    window_end: Mapped[datetime] = mapped_column(DateTime(timezone=True), primary_key=True)
    tokens_used: Mapped[int] = mapped_column(BigInteger, nullable=False)
