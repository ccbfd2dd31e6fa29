"""SQLAlchemy 2 models.

Engine-owned tables (`agents`, `agent_runs`, `agent_tools`) follow the seed document column by
column. The neighbours' tables (users, agent_models, tools, platform_settings, the Knowledge Store)
are stand-ins owned by other services in the real platform; they live in their own Alembic branch.
Database-held behaviour (triggers) is created by the migrations, see `db/ddl.py`.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from decimal import Decimal
from enum import StrEnum
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Computed,
    DateTime,
    ForeignKey,
    Identity,
    Index,
    Integer,
    MetaData,
    Numeric,
    Text,
    UniqueConstraint,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB, TSVECTOR
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from agent_engine.domain.delivery import DeliveryStatus
from agent_engine.domain.providers import Provider
from agent_engine.domain.runs import (
    REASONS_BY_STATE,
    UNFINISHED_STATES,
    RunReason,
    RunState,
    RunStepKind,
    RunTrigger,
)

NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

ADMIN_PAUSE_NOTE_MAX_CHARS = 500


def _in(column: str, values: Iterable[StrEnum]) -> str:
    return f"{column} IN ({', '.join(repr(str(v)) for v in values)})"


def _reason_fits_state() -> str:
    """The CHECK form of `REASONS_BY_STATE`: a state with reasons needs one of them, the others
    none."""
    whens = "".join(
        f" WHEN {str(state)!r} THEN"
        f" COALESCE({_in('reason', [r for r in RunReason if r in reasons])}, false)"
        for state, reasons in REASONS_BY_STATE.items()
        if reasons
    )
    return f"CASE state{whens} ELSE reason IS NULL END"


UNFINISHED = _in("state", [s for s in RunState if s in UNFINISHED_STATES])


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)


def _created_at() -> Mapped[datetime]:
    return mapped_column(DateTime(timezone=True), nullable=False, server_default=func.now())


# --- neighbours' stand-ins -------------------------------------------------------------------


class User(Base):
    __tablename__ = "users"

    id: Mapped[int] = mapped_column(BigInteger, Identity(always=False), primary_key=True)
    email: Mapped[str | None] = mapped_column(Text)
    display_name: Mapped[str | None] = mapped_column(Text)
    timezone: Mapped[str | None] = mapped_column(Text)
    is_active: Mapped[bool] = mapped_column(Boolean, nullable=False, server_default=text("true"))
    created_at: Mapped[datetime] = _created_at()


class AgentModel(Base):
    __tablename__ = "agent_models"
    __table_args__ = (
        CheckConstraint(_in("provider", Provider), name="provider"),
        CheckConstraint(
            "max_concurrent_runs IS NULL OR max_concurrent_runs >= 1",
            name="max_concurrent_runs_positive",
        ),
        Index(
            "uq_agent_models_one_default",
            "is_default",
            unique=True,
            postgresql_where=text("is_default"),
        ),
        *(
            CheckConstraint(
                f"{column} IS NULL OR ({column} >= 0 AND {column} <= 10000)",
                name=f"{column}_range",
            )
            for column in ("input_price_per_million", "output_price_per_million")
        ),
    )

    id: Mapped[int] = mapped_column(BigInteger, Identity(always=False), primary_key=True)
    name: Mapped[str] = mapped_column(Text, nullable=False)
    provider: Mapped[str] = mapped_column(Text, nullable=False)
    model: Mapped[str] = mapped_column(Text, nullable=False)
    base_url: Mapped[str | None] = mapped_column(Text)
    api_key_env: Mapped[str | None] = mapped_column(Text)
    is_default: Mapped[bool] = mapped_column(Boolean, nullable=False, server_default=text("false"))
    created_at: Mapped[datetime] = _created_at()
    # At most this many runs of the model `running` at once across all workers; NULL = no limit.
    max_concurrent_runs: Mapped[int | None] = mapped_column(Integer)
    # Prices per million prompt / completion tokens in the platform currency; NULL = not priced.
    input_price_per_million: Mapped[Decimal | None] = mapped_column(Numeric)
    output_price_per_million: Mapped[Decimal | None] = mapped_column(Numeric)


class Tool(Base):
    __tablename__ = "tools"

    id: Mapped[int] = mapped_column(BigInteger, Identity(always=False), primary_key=True)
    name: Mapped[str] = mapped_column(Text, nullable=False, unique=True)
    description: Mapped[str] = mapped_column(Text, nullable=False, server_default="")
    agents_allowed: Mapped[bool] = mapped_column(
        Boolean, nullable=False, server_default=text("false")
    )
    created_at: Mapped[datetime] = _created_at()


class PlatformSetting(Base):
    __tablename__ = "platform_settings"

    key: Mapped[str] = mapped_column(Text, primary_key=True)
    value: Mapped[Any] = mapped_column(JSONB, nullable=True)
    updated_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), nullable=False, server_default=func.now()
    )


class KnowledgeDocument(Base):
    __tablename__ = "kb_documents"
    __table_args__ = (Index("ix_kb_documents_search", "search_vector", postgresql_using="gin"),)

    id: Mapped[int] = mapped_column(BigInteger, Identity(always=False), primary_key=True)
    title: Mapped[str] = mapped_column(Text, nullable=False)
    body: Mapped[str] = mapped_column(Text, nullable=False)
    # Where the document came from (an import path, a URL); re-importing a source updates it.
    source: Mapped[str | None] = mapped_column(Text, unique=True)
    is_public: Mapped[bool] = mapped_column(Boolean, nullable=False, server_default=text("false"))
    created_at: Mapped[datetime] = _created_at()
    updated_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), nullable=False, server_default=func.now()
    )
    search_vector: Mapped[Any] = mapped_column(
        TSVECTOR,
        Computed(
            "setweight(to_tsvector('english', coalesce(title, '')), 'A') || "
            "setweight(to_tsvector('english', coalesce(body, '')), 'B')",
            persisted=True,
        ),
    )


class KnowledgeGrant(Base):
    __tablename__ = "kb_document_grants"
    __table_args__ = (Index("ix_kb_document_grants_user_id", "user_id"),)

    document_id: Mapped[int] = mapped_column(
        BigInteger, ForeignKey("kb_documents.id", ondelete="CASCADE"), primary_key=True
    )
    user_id: Mapped[int] = mapped_column(
        BigInteger, ForeignKey("users.id", ondelete="CASCADE"), primary_key=True
    )


class KnowledgeLink(Base):
    __tablename__ = "kb_document_links"
    __table_args__ = (Index("ix_kb_document_links_to_document_id", "to_document_id"),)

    from_document_id: Mapped[int] = mapped_column(
        BigInteger, ForeignKey("kb_documents.id", ondelete="CASCADE"), primary_key=True
    )
    to_document_id: Mapped[int] = mapped_column(
        BigInteger, ForeignKey("kb_documents.id", ondelete="CASCADE"), primary_key=True
    )


# --- engine tables (the seed) ----------------------------------------------------------------


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
    created_at: Mapped[datetime] = _created_at()
    updated_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), nullable=False, server_default=func.now()
    )
    # Set by deleteAgent while the agent's runs still count in a budget week (e0003).
    deleted_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # Why an admin paused it, shown to the owner; only while paused (a CHECK of e0005_operators).
    admin_pause_note: Mapped[str | None] = mapped_column(Text)


class AgentRun(Base):
    __tablename__ = "agent_runs"
    __table_args__ = (
        CheckConstraint(_in("trigger", RunTrigger), name="trigger"),
        CheckConstraint(_in("state", RunState), name="state"),
        CheckConstraint("reason IS NULL OR " + _in("reason", RunReason), name="reason"),
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
        # An agent's pace (issue 17): its newest runs that ran, with their tokens, index-only.
        Index(
            "ix_agent_runs_pace",
            "agent_id",
            text("id DESC"),
            postgresql_include=["tokens_used"],
            postgresql_where=text(_in("state", (RunState.SUCCEEDED, RunState.FAILED))),
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
    created_at: Mapped[datetime] = _created_at()
    # The model the run is queued for / ran on (set at the request, refreshed at the claim). Not a
    # foreign key: the journal outlives the model list.
    model_id: Mapped[int | None] = mapped_column(BigInteger)
    # When the reaper last re-sent the execute message (NULL: only the first send) (e0003).
    last_sent_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # --- the provider's token split (also added by the transcript issue, 16) ---
    prompt_tokens: Mapped[int] = mapped_column(BigInteger, nullable=False, server_default="0")
    completion_tokens: Mapped[int] = mapped_column(BigInteger, nullable=False, server_default="0")
    # --- spend (issue 17) ---
    # Fixed when the run finishes, from its model's prices then (trigger); NULL = not priced.
    cost: Mapped[Decimal | None] = mapped_column(Numeric)


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
    created_at: Mapped[datetime] = _created_at()


# --- operators (e0005_operators) ----------------------------------------------------------------


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


# --- transcript and delivery (DESIGN §10; revision e0004) ----------------------------------------


class AgentRunStep(Base):
    """One model call or tool call of a run, written as the loop goes (the run's transcript)."""

    __tablename__ = "agent_run_steps"
    __table_args__ = (CheckConstraint(_in("kind", RunStepKind), name="kind"),)

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


class DeliveryTarget(Base):
    """An admin-approved webhook; `secret_env` names the variable holding its whsec_ secret."""

    __tablename__ = "delivery_targets"

    id: Mapped[int] = mapped_column(BigInteger, Identity(always=False), primary_key=True)
    name: Mapped[str] = mapped_column(Text, nullable=False)
    url: Mapped[str] = mapped_column(Text, nullable=False)
    secret_env: Mapped[str] = mapped_column(Text, nullable=False)
    enabled: Mapped[bool] = mapped_column(Boolean, nullable=False, server_default=text("true"))
    created_at: Mapped[datetime] = _created_at()
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
    created_at: Mapped[datetime] = _created_at()


class RunDelivery(Base):
    """The outbox: one row per (terminal run, target), written in the run's finishing transaction
    by a trigger, then sent (and retried) by the delivery actors."""

    __tablename__ = "run_deliveries"
    __table_args__ = (
        CheckConstraint(_in("status", DeliveryStatus), name="status"),
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
    created_at: Mapped[datetime] = _created_at()


PLATFORM_TABLES = (
    "users",
    "agent_models",
    "tools",
    "platform_settings",
    "kb_documents",
    "kb_document_grants",
    "kb_document_links",
)
ENGINE_TABLES = (
    "agents",
    "agent_runs",
    "agent_tools",
    "budget_alerts",
    "audit_log",
    "engine_activity",
    "agent_run_steps",
    "delivery_targets",
    "agent_delivery_targets",
    "run_deliveries",
)
