"""Runs that wait for their owner's connection, and whose authority each tool step carried.

- `connection_waits`: one row per call of an OWNER_OAUTH tool that found its owner without a
  CONNECTED account. The run is parked on it (`agent_runs.parked_at`, like an approval) with the
  conversation in `checkpoint`; `status` pending -> connected | expired | cancelled once;
  `taken_at` is set when a worker takes the run back (so a newer park is never confused with it);
  `call_started_at` is the compare-and-set that makes the call happen at most once.
- `agent_run_steps.authority` ('none' | 'shared' | 'owner_oauth') and `account` (the owner's
  account at the server): whose authority an MCP tool step carried.

Revision ID: e0010_connection_waits
Revises: e0009_tool_connections
Create Date: 2026-12-06
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "e0010_connection_waits"
down_revision: str | None = "e0009_tool_connections"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("agent_run_steps", sa.Column("authority", sa.Text(), nullable=True))
    op.add_column("agent_run_steps", sa.Column("account", sa.Text(), nullable=True))
    op.create_check_constraint(
        op.f("ck_agent_run_steps_authority"),
        "agent_run_steps",
        "authority IS NULL OR authority IN ('none', 'shared', 'owner_oauth')",
    )
    op.create_table(
        "connection_waits",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("run_id", sa.BigInteger(), nullable=False),
        sa.Column("agent_id", sa.BigInteger(), nullable=False),
        sa.Column("owner_id", sa.BigInteger(), nullable=False),
        sa.Column("source_id", sa.BigInteger(), nullable=True),
        sa.Column("source_name", sa.Text(), nullable=False),
        sa.Column("step_index", sa.Integer(), nullable=False),
        sa.Column("tool_id", sa.BigInteger(), nullable=True),
        sa.Column("tool_name", sa.Text(), nullable=False),
        sa.Column("status", sa.Text(), server_default="pending", nullable=False),
        sa.Column(
            "requested_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("resolved_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("taken_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("checkpoint", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.Column("call_started_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint(
            "status IN ('pending', 'connected', 'expired', 'cancelled')",
            name=op.f("ck_connection_waits_status"),
        ),
        sa.ForeignKeyConstraint(
            ["run_id"],
            ["agent_runs.id"],
            name=op.f("fk_connection_waits_run_id_agent_runs"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["agent_id"],
            ["agents.id"],
            name=op.f("fk_connection_waits_agent_id_agents"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["owner_id"],
            ["users.id"],
            name=op.f("fk_connection_waits_owner_id_users"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["source_id"],
            ["tool_sources.id"],
            name=op.f("fk_connection_waits_source_id_tool_sources"),
            ondelete="SET NULL",
        ),
        sa.ForeignKeyConstraint(
            ["tool_id"],
            ["tools.id"],
            name=op.f("fk_connection_waits_tool_id_tools"),
            ondelete="SET NULL",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_connection_waits")),
    )
    op.create_index(op.f("ix_connection_waits_run_id"), "connection_waits", ["run_id"])
    op.create_index(
        "uq_connection_waits_open_run",
        "connection_waits",
        ["run_id"],
        unique=True,
        postgresql_where=sa.text("taken_at IS NULL AND status <> 'cancelled'"),
    )
    op.create_index(
        "ix_connection_waits_owner_source",
        "connection_waits",
        ["owner_id", "source_id"],
        postgresql_where=sa.text("status = 'pending'"),
    )
    op.create_index(
        "ix_connection_waits_expiry",
        "connection_waits",
        ["expires_at"],
        postgresql_where=sa.text("status = 'pending'"),
    )
    op.create_index(op.f("ix_connection_waits_source_id"), "connection_waits", ["source_id"])
    op.create_index(op.f("ix_connection_waits_tool_id"), "connection_waits", ["tool_id"])
    op.create_index(op.f("ix_connection_waits_agent_id"), "connection_waits", ["agent_id"])


def downgrade() -> None:
    op.drop_table("connection_waits")
    op.drop_constraint(op.f("ck_agent_run_steps_authority"), "agent_run_steps", type_="check")
    op.drop_column("agent_run_steps", "account")
    op.drop_column("agent_run_steps", "authority")
