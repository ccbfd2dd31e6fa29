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
    UniqueConstraint,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, BYTEA, JSONB
from sqlalchemy.orm import Mapped, mapped_column

from agent_engine.db.models.base import Base, created_at, in_list
from agent_engine.domain.mcp import ApprovalStatus


class ToolSource(Base):
    __tablename__ = "tool_sources"
    __table_args__ = (
        CheckConstraint("name ~ '^[a-z][a-z0-9_]{0,31}$'", name="name"),
        CheckConstraint("auth IN ('none', 'shared', 'owner_oauth')", name="auth"),
        CheckConstraint(
            "auth <> 'owner_oauth' OR auth_env IS NULL", name="owner_oauth_no_auth_env"
        ),
    )

    id: Mapped[int] = mapped_column(BigInteger, Identity(always=False), primary_key=True)
    name: Mapped[str] = mapped_column(Text, nullable=False, unique=True)
    url: Mapped[str] = mapped_column(Text, nullable=False)
    # The variable holding the bearer credential (never the credential).
    auth_env: Mapped[str | None] = mapped_column(Text)
    # How the engine authenticates (e0009): 'none', 'shared' (auth_env), 'owner_oauth'.
    auth: Mapped[str] = mapped_column(Text, nullable=False, server_default="none")
    oauth_scopes: Mapped[list[str] | None] = mapped_column(ARRAY(Text))
    oauth_client_id_env: Mapped[str | None] = mapped_column(Text)
    oauth_client_secret_env: Mapped[str | None] = mapped_column(Text)
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


class ToolConnection(Base):
    """An owner's own account at an OWNER_OAUTH source (e0009). Tokens only as AES-GCM ciphertext
    (agent_engine.oauth.keys); never read by the API."""

    __tablename__ = "tool_connections"
    __table_args__ = (
        CheckConstraint("status IN ('connected', 'expired')", name="status"),
        UniqueConstraint("owner_id", "source_id"),
    )

    id: Mapped[int] = mapped_column(BigInteger, Identity(always=False), primary_key=True)
    owner_id: Mapped[int] = mapped_column(
        BigInteger, ForeignKey("users.id", ondelete="CASCADE"), nullable=False
    )
    source_id: Mapped[int] = mapped_column(
        BigInteger, ForeignKey("tool_sources.id", ondelete="CASCADE"), nullable=False, index=True
    )
    status: Mapped[str] = mapped_column(Text, nullable=False, server_default="connected")
    account: Mapped[str | None] = mapped_column(Text)
    scopes: Mapped[list[str]] = mapped_column(
        ARRAY(Text), nullable=False, server_default=text("'{}'::text[]")
    )
    access_token_enc: Mapped[bytes] = mapped_column(BYTEA, nullable=False)
    refresh_token_enc: Mapped[bytes | None] = mapped_column(BYTEA)
    expires_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    connected_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), nullable=False, server_default=func.now()
    )
    last_used_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    refreshed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    updated_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), nullable=False, server_default=func.now()
    )


class OAuthState(Base):
    """A pending authorization request: the SHA-256 of its `state` (never the state), single-use,
    10 minutes."""

    __tablename__ = "oauth_states"

    state_hash: Mapped[bytes] = mapped_column(BYTEA, primary_key=True)
    owner_id: Mapped[int] = mapped_column(
        BigInteger, ForeignKey("users.id", ondelete="CASCADE"), nullable=False, index=True
    )
    source_id: Mapped[int] = mapped_column(
        BigInteger, ForeignKey("tool_sources.id", ondelete="CASCADE"), nullable=False, index=True
    )
    verifier_enc: Mapped[bytes] = mapped_column(BYTEA, nullable=False)
    redirect_uri: Mapped[str] = mapped_column(Text, nullable=False)
    issuer: Mapped[str] = mapped_column(Text, nullable=False)
    created_at: Mapped[datetime] = created_at()
    expires_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), nullable=False, index=True
    )
    used_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class ToolSourceOAuthClient(Base):
    """The engine's client at a source's authorization server (registered, RFC 7591, or
    configured) for one redirect URI, and the server's endpoints as discovered."""

    __tablename__ = "tool_source_oauth_clients"

    source_id: Mapped[int] = mapped_column(
        BigInteger, ForeignKey("tool_sources.id", ondelete="CASCADE"), primary_key=True
    )
    redirect_uri: Mapped[str] = mapped_column(Text, nullable=False)
    issuer: Mapped[str] = mapped_column(Text, nullable=False)
    client_id: Mapped[str] = mapped_column(Text, nullable=False)
    client_secret_enc: Mapped[bytes | None] = mapped_column(BYTEA)
    server_metadata: Mapped[Any] = mapped_column(JSONB, nullable=False)
    created_at: Mapped[datetime] = created_at()
