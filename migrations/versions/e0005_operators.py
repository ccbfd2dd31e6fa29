"""Operators: the admin's pause note, the append-only audit log, the engine's activity counters.

Revision ID: e0005_operators
Revises: e0001_engine_tables
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "e0005_operators"
down_revision: str | None = "e0004_transcript_delivery"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# The log is evidence: nobody rewrites it, not even the engine. (Dropping the table in a
# downgrade, or a superuser disabling the trigger, remain possible -- on purpose and visibly.)
APPEND_ONLY_FUNCTION = """
CREATE FUNCTION audit_log_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'audit_log is append-only: % refused', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END $$
"""


def upgrade() -> None:
    op.add_column("agents", sa.Column("admin_pause_note", sa.Text(), nullable=True))
    op.create_check_constraint(
        op.f("ck_agents_admin_pause_note"),
        "agents",
        "admin_pause_note IS NULL OR (admin_paused AND char_length(admin_pause_note) <= 500)",
    )
    op.create_table(
        "audit_log",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column(
            "at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False
        ),
        sa.Column("actor_id", sa.BigInteger(), nullable=True),
        sa.Column("action", sa.Text(), nullable=False),
        sa.Column("agent_id", sa.BigInteger(), nullable=True),
        sa.Column("user_id", sa.BigInteger(), nullable=True),
        sa.Column("details", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_audit_log")),
    )
    op.create_index(
        "ix_audit_log_agent_id", "audit_log", ["agent_id", sa.literal_column("id DESC")]
    )
    op.create_index("ix_audit_log_user_id", "audit_log", ["user_id", sa.literal_column("id DESC")])
    op.create_index(
        "ix_audit_log_actor_id", "audit_log", ["actor_id", sa.literal_column("id DESC")]
    )
    op.execute(APPEND_ONLY_FUNCTION)
    op.execute(
        "CREATE TRIGGER audit_log_append_only BEFORE UPDATE OR DELETE ON audit_log"
        " FOR EACH ROW EXECUTE FUNCTION audit_log_append_only()"
    )
    op.execute(
        "CREATE TRIGGER audit_log_no_truncate BEFORE TRUNCATE ON audit_log"
        " FOR EACH STATEMENT EXECUTE FUNCTION audit_log_append_only()"
    )
    op.create_table(
        "engine_activity",
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("count", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("last_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_engine_activity")),
    )


def downgrade() -> None:
    op.drop_table("engine_activity")
    op.drop_table("audit_log")
    op.execute("DROP FUNCTION audit_log_append_only()")
    op.drop_constraint(op.f("ck_agents_admin_pause_note"), "agents", type_="check")
    op.drop_column("agents", "admin_pause_note")
