"""Stand-ins for the neighbours' tables: users, the allowed models, tools, platform settings and
the Knowledge Store. Other services own them in the real platform; they live in their own Alembic
branch."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
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
    Numeric,
    Text,
    UniqueConstraint,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB, TSVECTOR
from sqlalchemy.orm import Mapped, mapped_column

from agent_engine.db.models.base import Base, created_at, in_list
from agent_engine.domain.providers import Provider


class User(Base):
    __tablename__ = "users"

    id: Mapped[int] = mapped_column(BigInteger, Identity(always=False), primary_key=True)
    email: Mapped[str | None] = mapped_column(Text)
    display_name: Mapped[str | None] = mapped_column(Text)
    timezone: Mapped[str | None] = mapped_column(Text)
    is_active: Mapped[bool] = mapped_column(Boolean, nullable=False, server_default=text("true"))
    created_at: Mapped[datetime] = created_at()


class AgentModel(Base):
    __tablename__ = "agent_models"
    __table_args__ = (
        CheckConstraint(in_list("provider", Provider), name="provider"),
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
        Index(
            "ix_agent_models_fallback_model_id",
            "fallback_model_id",
            postgresql_where=text("fallback_model_id IS NOT NULL"),
        ),
    )

    id: Mapped[int] = mapped_column(BigInteger, Identity(always=False), primary_key=True)
    name: Mapped[str] = mapped_column(Text, nullable=False)
    provider: Mapped[str] = mapped_column(Text, nullable=False)
    model: Mapped[str] = mapped_column(Text, nullable=False)
    base_url: Mapped[str | None] = mapped_column(Text)
    api_key_env: Mapped[str | None] = mapped_column(Text)
    is_default: Mapped[bool] = mapped_column(Boolean, nullable=False, server_default=text("false"))
    created_at: Mapped[datetime] = created_at()
    # At most this many runs of the model `running` at once across all workers; NULL = no limit.
    max_concurrent_runs: Mapped[int | None] = mapped_column(Integer)
    # Prices per million prompt / completion tokens in the platform currency; NULL = not priced.
    input_price_per_million: Mapped[Decimal | None] = mapped_column(Numeric)
    output_price_per_million: Mapped[Decimal | None] = mapped_column(Numeric)
    # Answers this model's calls while it is down; NULL = none. No cycles (a trigger,
    # p0005_model_fallback); removing the fallback model clears it.
    fallback_model_id: Mapped[int | None] = mapped_column(
        BigInteger, ForeignKey("agent_models.id", ondelete="SET NULL")
    )


class Tool(Base):
    __tablename__ = "tools"
    __table_args__ = (
        CheckConstraint("access IN ('read', 'write')", name="access"),
        # An MCP tool has both its source and the server's name for it; the engine's own neither.
        CheckConstraint("(source_id IS NULL) = (remote_name IS NULL)", name="source_remote_name"),
        UniqueConstraint("source_id", "remote_name"),
    )

    id: Mapped[int] = mapped_column(BigInteger, Identity(always=False), primary_key=True)
    name: Mapped[str] = mapped_column(Text, nullable=False, unique=True)
    description: Mapped[str] = mapped_column(Text, nullable=False, server_default="")
    agents_allowed: Mapped[bool] = mapped_column(
        Boolean, nullable=False, server_default=text("false")
    )
    created_at: Mapped[datetime] = created_at()
    # MCP tools (e0007_mcp_tools): the source (its removal takes its tools, and with them the
    # agents' selections), the server's own name, the arguments' JSON schema, READ or WRITE.
    source_id: Mapped[int | None] = mapped_column(
        BigInteger, ForeignKey("tool_sources.id", ondelete="CASCADE")
    )
    remote_name: Mapped[str | None] = mapped_column(Text)
    input_schema: Mapped[Any] = mapped_column(JSONB, nullable=True)
    access: Mapped[str] = mapped_column(Text, nullable=False, server_default="read")


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
    created_at: Mapped[datetime] = created_at()
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
