"""The run journal and each run's transcript; the CHECKs and partial indexes follow the domain's
states, reasons and step kinds."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
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
    Numeric,
    Text,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from agent_engine.db.models.base import Base, created_at, in_list
from agent_engine.domain.runs import (
    REASONS_BY_STATE,
    UNFINISHED_STATES,
    RunReason,
    RunState,
    RunStepKind,
    RunTrigger,
)


def _reason_fits_state() -> str:
    """The CHECK form of `REASONS_BY_STATE`: a state with reasons needs one of them, the others
    none."""
    whens = "".join(
        f" WHEN {str(state)!r} THEN"
        f" COALESCE({in_list('reason', [r for r in RunReason if r in reasons])}, false)"
        for state, reasons in REASONS_BY_STATE.items()
        if reasons
    )
    return f"CASE state{whens} ELSE reason IS NULL END"


UNFINISHED = in_list("state", [s for s in RunState if s in UNFINISHED_STATES])


class AgentRun(Base):
    __tablename__ = "agent_runs"
    __table_args__ = (
        CheckConstraint(in_list("trigger", RunTrigger), name="trigger"),
        CheckConstraint(in_list("state", RunState), name="state"),
        CheckConstraint("reason IS NULL OR " + in_list("reason", RunReason), name="reason"),
        CheckConstraint(_reason_fits_state(), name="reason_fits_state"),
        CheckConstraint("tokens_used >= 0", name="tokens_used_non_negative"),
        # One unfinished run per agent: the lock lives in the database.
        Index(
            "uq_agent_runs_one_unfinished",
            "agent_id",
            unique=True,
            postgresql_where=text(UNFINISHED),
        ),
        # Budget sum: the owner's agents' runs finished in the window, tokens read from the index.
        Index(
            "ix_agent_runs_budget",
            "agent_id",
            "finished_at",
            postgresql_include=["tokens_used"],
        ),
        # Run journal paging, newest first.
        Index("ix_agent_runs_journal", "agent_id", text("id DESC")),
        # An agent's pace: its newest runs that ran, with their tokens, index-only.
        Index(
            "ix_agent_runs_pace",
            "agent_id",
            text("id DESC"),
            postgresql_include=["tokens_used"],
            postgresql_where=text(in_list("state", (RunState.SUCCEEDED, RunState.FAILED))),
        ),
        # Reaper: unfinished runs by age, a small partial index.
        Index(
            "ix_agent_runs_unfinished",
            "state",
            "heartbeat_at",
            postgresql_where=text(UNFINISHED),
        ),
        # Per-model limits: a model's running runs, and its queued runs oldest first.
        Index(
            "ix_agent_runs_model_unfinished",
            "model_id",
            "state",
            "id",
            postgresql_where=text(UNFINISHED),
        ),
    )

    id: Mapped[int] = mapped_column(BigInteger, Identity(always=False), primary_key=True)
    agent_id: Mapped[int] = mapped_column(
        BigInteger, ForeignKey("agents.id", ondelete="CASCADE"), nullable=False, index=True
    )
    trigger: Mapped[str] = mapped_column(Text, nullable=False)
    state: Mapped[str] = mapped_column(Text, nullable=False)
    reason: Mapped[str | None] = mapped_column(Text)
    output: Mapped[str | None] = mapped_column(Text)
    tokens_used: Mapped[int] = mapped_column(BigInteger, nullable=False, server_default="0")
    error: Mapped[str | None] = mapped_column(Text)
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), index=True)
    heartbeat_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    created_at: Mapped[datetime] = created_at()
    # The model the run is queued for / ran on (set at the request, refreshed at the claim). Not a
    # foreign key: the journal outlives the model list.
    model_id: Mapped[int | None] = mapped_column(BigInteger)
    # When the reaper last re-sent the execute message (NULL: only the first send).
    last_sent_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # The provider's token split.
    prompt_tokens: Mapped[int] = mapped_column(BigInteger, nullable=False, server_default="0")
    completion_tokens: Mapped[int] = mapped_column(BigInteger, nullable=False, server_default="0")
    # Fixed when the run finishes, from its model's prices then (trigger); NULL = not priced.
    cost: Mapped[Decimal | None] = mapped_column(Numeric)
    # The W3C traceparent of the run's `invoke_agent` span (tracing on): a resume continues the
    # run's trace from it, a delivery joins it, and `Run.traceId` is its trace id.
    trace_parent: Mapped[str | None] = mapped_column(Text)
    # Set while the run waits for its owner's approval of a write-tool call (no worker holds it;
    # the reaper and the wall-clock limit leave it alone); NULL otherwise. e0007_mcp_tools.
    parked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # A retry run: the failed run it continues. UNIQUE: a run is retried at most once
    # (e0012_runs_recover).
    retry_of: Mapped[int | None] = mapped_column(
        BigInteger, ForeignKey("agent_runs.id", ondelete="SET NULL"), unique=True
    )


class AgentRunStep(Base):
    """One model call or tool call of a run, written as the loop goes (the run's transcript)."""

    __tablename__ = "agent_run_steps"
    __table_args__ = (
        CheckConstraint(in_list("kind", RunStepKind), name="kind"),
        CheckConstraint(
            "authority IS NULL OR authority IN ('none', 'shared', 'owner_oauth')",
            name="authority",
        ),
    )

    # (run_id, index) is the key: UNIQUE per run, and the only index the table needs.
    run_id: Mapped[int] = mapped_column(
        BigInteger, ForeignKey("agent_runs.id", ondelete="CASCADE"), primary_key=True
    )
    index: Mapped[int] = mapped_column(Integer, primary_key=True)
    kind: Mapped[str] = mapped_column(Text, nullable=False)
    name: Mapped[str] = mapped_column(Text, nullable=False)
    input: Mapped[Any] = mapped_column(JSONB, nullable=True)
    output: Mapped[str | None] = mapped_column(Text)
    error: Mapped[str | None] = mapped_column(Text)
    prompt_tokens: Mapped[int | None] = mapped_column(BigInteger)
    completion_tokens: Mapped[int | None] = mapped_column(BigInteger)
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False)
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # A model call a fallback model answered (`name` is that model's); e0011_model_fallback.
    fallback: Mapped[bool] = mapped_column(Boolean, nullable=False, server_default=text("false"))
    # The model that answered a fallback step (no foreign key: the run's cost is fixed at finish).
    model_id: Mapped[int | None] = mapped_column(BigInteger)
    # A retry run's step carried over from the failed run: not made again, its tokens counted
    # nowhere (e0012_runs_recover).
    reused: Mapped[bool] = mapped_column(Boolean, nullable=False, server_default=text("false"))
    # An MCP tool step: whose authority the call carried (its source's `auth`) and, for
    # 'owner_oauth', the owner's account at the server. e0010_connection_waits.
    authority: Mapped[str | None] = mapped_column(Text)
    account: Mapped[str | None] = mapped_column(Text)
