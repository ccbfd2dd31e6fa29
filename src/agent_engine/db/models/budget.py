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
