"""MCP tool sources and write tools that wait for the owner's approval (contract version 3).

- `tool_sources`: an admin's MCP servers (Streamable HTTP); `authEnv` names the variable holding
  the bearer credential, never the credential.
- `tools` (the neighbours' catalog stand-in) gains `source_id` (CASCADE: removing a source takes
  its tools, and the agents' selections of them), `remote_name` (the server's name for the tool),
  `input_schema` and `access` (read | write; the engine's own tools are read).
- `agent_tools.auto_approved`: a WRITE tool the owner lets run without asking.
- `tool_approvals`: one row per WRITE call waiting for the owner, with the run's checkpoint and the
  compare-and-set column (`call_started_at`) that makes the call happen at most once.
- `agent_runs.parked_at`: set while the run waits on an approval (no worker holds it).

Revision ID: e0007_mcp_tools
Revises: e0006_cost_alerts
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "e0007_mcp_tools"
down_revision: str | None = "e0006_cost_alerts"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "tool_sources",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("url", sa.Text(), nullable=False),
        sa.Column("auth_env", sa.Text(), nullable=True),
        sa.Column("enabled", sa.Boolean(), server_default=sa.text("true"), nullable=False),
        sa.Column("last_synced_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column(
            "updated_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.CheckConstraint("name ~ '^[a-z][a-z0-9_]{0,31}$'", name=op.f("ck_tool_sources_name")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_tool_sources")),
        sa.UniqueConstraint("name", name=op.f("uq_tool_sources_name")),
    )
    op.add_column("tools", sa.Column("source_id", sa.BigInteger(), nullable=True))
    op.add_column("tools", sa.Column("remote_name", sa.Text(), nullable=True))
    op.add_column(
        "tools",
        sa.Column("input_schema", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
    )
    op.add_column("tools", sa.Column("access", sa.Text(), server_default="read", nullable=False))
    op.create_foreign_key(
        op.f("fk_tools_source_id_tool_sources"),
        "tools",
        "tool_sources",
        ["source_id"],
        ["id"],
        ondelete="CASCADE",
    )
    op.create_check_constraint(op.f("ck_tools_access"), "tools", "access IN ('read', 'write')")
    op.create_check_constraint(
        op.f("ck_tools_source_remote_name"),
        "tools",
        "(source_id IS NULL) = (remote_name IS NULL)",
    )
    op.create_unique_constraint(
        op.f("uq_tools_source_id_remote_name"), "tools", ["source_id", "remote_name"]
    )
    op.add_column(
        "agent_tools",
        sa.Column("auto_approved", sa.Boolean(), server_default=sa.text("false"), nullable=False),
    )
    op.add_column("agent_runs", sa.Column("parked_at", sa.DateTime(timezone=True), nullable=True))
    op.create_table(
        "tool_approvals",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("run_id", sa.BigInteger(), nullable=False),
        sa.Column("agent_id", sa.BigInteger(), nullable=False),
        sa.Column("owner_id", sa.BigInteger(), nullable=False),
        sa.Column("step_index", sa.Integer(), nullable=False),
        sa.Column("tool_id", sa.BigInteger(), nullable=True),
        sa.Column("tool_name", sa.Text(), nullable=False),
        sa.Column("input", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.Column("status", sa.Text(), server_default="pending", nullable=False),
        sa.Column(
            "requested_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("decided_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("decided_by", sa.BigInteger(), nullable=True),
        sa.Column("note", sa.Text(), nullable=True),
        sa.Column("checkpoint", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.Column("call_started_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint(
            "status IN ('pending', 'approved', 'declined', 'expired', 'cancelled')",
            name=op.f("ck_tool_approvals_status"),
        ),
        sa.ForeignKeyConstraint(
            ["run_id"],
            ["agent_runs.id"],
            name=op.f("fk_tool_approvals_run_id_agent_runs"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["agent_id"],
            ["agents.id"],
            name=op.f("fk_tool_approvals_agent_id_agents"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["owner_id"],
            ["users.id"],
            name=op.f("fk_tool_approvals_owner_id_users"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["tool_id"],
            ["tools.id"],
            name=op.f("fk_tool_approvals_tool_id_tools"),
            ondelete="SET NULL",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_tool_approvals")),
    )
    op.create_index(op.f("ix_tool_approvals_run_id"), "tool_approvals", ["run_id"])
    op.create_index(op.f("ix_tool_approvals_tool_id"), "tool_approvals", ["tool_id"])
    op.create_index(
        "uq_tool_approvals_pending_run",
        "tool_approvals",
        ["run_id"],
        unique=True,
        postgresql_where=sa.text("status = 'pending'"),
    )
    op.create_index(
        "ix_tool_approvals_owner", "tool_approvals", ["owner_id", sa.literal_column("id DESC")]
    )
    op.create_index(
        "ix_tool_approvals_expiry",
        "tool_approvals",
        ["expires_at"],
        postgresql_where=sa.text("status = 'pending'"),
    )


def downgrade() -> None:
    op.drop_table("tool_approvals")
    op.drop_column("agent_runs", "parked_at")
    op.drop_column("agent_tools", "auto_approved")
    op.drop_constraint(op.f("uq_tools_source_id_remote_name"), "tools", type_="unique")
    op.drop_constraint(op.f("ck_tools_source_remote_name"), "tools", type_="check")
    op.drop_constraint(op.f("ck_tools_access"), "tools", type_="check")
    op.drop_constraint(op.f("fk_tools_source_id_tool_sources"), "tools", type_="foreignkey")
    for column in ("access", "input_schema", "remote_name", "source_id"):
        op.drop_column("tools", column)
    op.drop_table("tool_sources")
