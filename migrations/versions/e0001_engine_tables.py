"""Engine tables of the seed: agents, agent_runs, agent_tools, and their database-held rules.

Revision ID: e0001_engine_tables
Revises:
Create Date: 2026-11-30
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "e0001_engine_tables"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = ("engine",)
depends_on: str | Sequence[str] | None = "p0001_platform_standins"


# next_run_at is NULL whenever the agent cannot start, whichever path changed the row -- including
# the FK's ON DELETE SET NULL on model_id, which runs as an UPDATE and so fires this trigger.
GATE_FUNCTION = """
CREATE FUNCTION agents_clear_next_run_at() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NOT (NEW.enabled AND NOT NEW.admin_paused AND NEW.model_id IS NOT NULL
            AND NEW.schedule IS NOT NULL) THEN
        NEW.next_run_at := NULL;
    END IF;
    RETURN NEW;
END $$
"""

# updated_at follows edits of the definition (prompt, schedule, locks, model), not the scheduler's
# own bookkeeping of next_run_at.
UPDATED_AT_FUNCTION = """
CREATE FUNCTION agents_touch_updated_at() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF ROW(NEW.user_id, NEW.name, NEW.description, NEW.prompt, NEW.schedule, NEW.model_id,
           NEW.enabled, NEW.admin_paused, NEW.meta)
       IS DISTINCT FROM
       ROW(OLD.user_id, OLD.name, OLD.description, OLD.prompt, OLD.schedule, OLD.model_id,
           OLD.enabled, OLD.admin_paused, OLD.meta) THEN
        NEW.updated_at := now();
    END IF;
    RETURN NEW;
END $$
"""

# Ids and states only; listeners load the row. A heartbeat (no state change) does not notify.
NOTIFY_FUNCTION = """
CREATE FUNCTION agent_runs_notify() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    previous text := NULL;
BEGIN
    IF TG_OP = 'UPDATE' THEN
        previous := OLD.state;
    END IF;
    PERFORM pg_notify('agent_run_events', json_build_object(
        'run_id', NEW.id,
        'agent_id', NEW.agent_id,
        'owner_id', (SELECT user_id FROM agents WHERE id = NEW.agent_id),
        'state', NEW.state,
        'previous_state', previous
    )::text);
    RETURN NULL;
END $$
"""


def upgrade() -> None:
    op.create_table(
        "agents",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("user_id", sa.BigInteger(), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("description", sa.Text(), nullable=True),
        sa.Column("prompt", sa.Text(), nullable=False),
        sa.Column("schedule", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.Column("model_id", sa.BigInteger(), nullable=True),
        sa.Column("enabled", sa.Boolean(), server_default=sa.text("true"), nullable=False),
        sa.Column("admin_paused", sa.Boolean(), server_default=sa.text("false"), nullable=False),
        sa.Column("next_run_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("meta", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
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
        sa.ForeignKeyConstraint(
            ["model_id"],
            ["agent_models.id"],
            name=op.f("fk_agents_model_id_agent_models"),
            ondelete="SET NULL",
        ),
        sa.ForeignKeyConstraint(
            ["user_id"], ["users.id"], name=op.f("fk_agents_user_id_users"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_agents")),
    )
    op.create_index(op.f("ix_agents_model_id"), "agents", ["model_id"], unique=False)
    op.create_index(
        "ix_agents_next_run_at",
        "agents",
        ["next_run_at"],
        unique=False,
        postgresql_where=sa.text("next_run_at IS NOT NULL"),
    )
    op.create_index(op.f("ix_agents_user_id"), "agents", ["user_id"], unique=False)
    op.create_table(
        "agent_runs",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("agent_id", sa.BigInteger(), nullable=False),
        sa.Column("trigger", sa.Text(), nullable=False),
        sa.Column("state", sa.Text(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("output", sa.Text(), nullable=True),
        sa.Column("tokens_used", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.CheckConstraint(
            "CASE state WHEN 'skipped' THEN COALESCE(reason IN ('budget_exceeded', 'already_running'), false) WHEN 'failed' THEN COALESCE(reason IN ('iteration_cap', 'error', 'stale'), false) ELSE reason IS NULL END",
            name=op.f("ck_agent_runs_reason_fits_state"),
        ),
        sa.CheckConstraint(
            "reason IS NULL OR reason IN ('budget_exceeded', 'already_running', 'iteration_cap', 'error', 'stale')",
            name=op.f("ck_agent_runs_reason"),
        ),
        sa.CheckConstraint(
            "state IN ('queued', 'running', 'succeeded', 'failed', 'skipped')",
            name=op.f("ck_agent_runs_state"),
        ),
        sa.CheckConstraint(
            "trigger IN ('manual', 'scheduled')", name=op.f("ck_agent_runs_trigger")
        ),
        sa.CheckConstraint("tokens_used >= 0", name=op.f("ck_agent_runs_tokens_used_non_negative")),
        sa.ForeignKeyConstraint(
            ["agent_id"],
            ["agents.id"],
            name=op.f("fk_agent_runs_agent_id_agents"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_agent_runs")),
    )
    op.create_index(op.f("ix_agent_runs_agent_id"), "agent_runs", ["agent_id"], unique=False)
    op.create_index(
        "ix_agent_runs_budget",
        "agent_runs",
        ["agent_id", "finished_at"],
        unique=False,
        postgresql_include=["tokens_used"],
    )
    op.create_index(op.f("ix_agent_runs_finished_at"), "agent_runs", ["finished_at"], unique=False)
    op.create_index(
        "ix_agent_runs_journal",
        "agent_runs",
        ["agent_id", sa.literal_column("id DESC")],
        unique=False,
    )
    op.create_index(
        "ix_agent_runs_unfinished",
        "agent_runs",
        ["state", "heartbeat_at"],
        unique=False,
        postgresql_where=sa.text("state IN ('queued', 'running')"),
    )
    op.create_index(
        "uq_agent_runs_one_unfinished",
        "agent_runs",
        ["agent_id"],
        unique=True,
        postgresql_where=sa.text("state IN ('queued', 'running')"),
    )
    op.create_table(
        "agent_tools",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("agent_id", sa.BigInteger(), nullable=False),
        sa.Column("tool_id", sa.BigInteger(), nullable=False),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.ForeignKeyConstraint(
            ["agent_id"],
            ["agents.id"],
            name=op.f("fk_agent_tools_agent_id_agents"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["tool_id"], ["tools.id"], name=op.f("fk_agent_tools_tool_id_tools"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_agent_tools")),
        sa.UniqueConstraint("agent_id", "tool_id", name=op.f("uq_agent_tools_agent_id_tool_id")),
    )
    op.create_index(op.f("ix_agent_tools_agent_id"), "agent_tools", ["agent_id"], unique=False)
    op.create_index(op.f("ix_agent_tools_tool_id"), "agent_tools", ["tool_id"], unique=False)
    op.execute(GATE_FUNCTION)
    op.execute(
        "CREATE TRIGGER agents_gate_clears_next_run_at BEFORE INSERT OR UPDATE ON agents"
        " FOR EACH ROW EXECUTE FUNCTION agents_clear_next_run_at()"
    )
    op.execute(UPDATED_AT_FUNCTION)
    op.execute(
        "CREATE TRIGGER agents_updated_at BEFORE UPDATE ON agents"
        " FOR EACH ROW EXECUTE FUNCTION agents_touch_updated_at()"
    )
    op.execute(NOTIFY_FUNCTION)
    op.execute(
        "CREATE TRIGGER agent_runs_notify_insert AFTER INSERT ON agent_runs"
        " FOR EACH ROW EXECUTE FUNCTION agent_runs_notify()"
    )
    op.execute(
        "CREATE TRIGGER agent_runs_notify_state AFTER UPDATE OF state ON agent_runs"
        " FOR EACH ROW WHEN (OLD.state IS DISTINCT FROM NEW.state)"
        " EXECUTE FUNCTION agent_runs_notify()"
    )


def downgrade() -> None:
    op.drop_index(op.f("ix_agent_tools_tool_id"), table_name="agent_tools")
    op.drop_index(op.f("ix_agent_tools_agent_id"), table_name="agent_tools")
    op.drop_table("agent_tools")
    op.drop_index(
        "uq_agent_runs_one_unfinished",
        table_name="agent_runs",
        postgresql_where=sa.text("state IN ('queued', 'running')"),
    )
    op.drop_index(
        "ix_agent_runs_unfinished",
        table_name="agent_runs",
        postgresql_where=sa.text("state IN ('queued', 'running')"),
    )
    op.drop_index("ix_agent_runs_journal", table_name="agent_runs")
    op.drop_index(op.f("ix_agent_runs_finished_at"), table_name="agent_runs")
    op.drop_index(
        "ix_agent_runs_budget", table_name="agent_runs", postgresql_include=["tokens_used"]
    )
    op.drop_index(op.f("ix_agent_runs_agent_id"), table_name="agent_runs")
    op.drop_table("agent_runs")
    op.drop_index(op.f("ix_agents_user_id"), table_name="agents")
    op.drop_index(
        "ix_agents_next_run_at",
        table_name="agents",
        postgresql_where=sa.text("next_run_at IS NOT NULL"),
    )
    op.drop_index(op.f("ix_agents_model_id"), table_name="agents")
    op.drop_table("agents")
    op.execute("DROP FUNCTION agent_runs_notify()")
    op.execute("DROP FUNCTION agents_touch_updated_at()")
    op.execute("DROP FUNCTION agents_clear_next_run_at()")
