"""Run transcript, cancel and delivery (docs/architecture.md §10.4 to §10.6): agent_run_steps,
the token split on agent_runs, `failed` may carry `cancelled`, delivery targets and the delivery
outbox.

Runs journaled before this revision have no recorded split: their tokens are counted as prompt
tokens (prompt_tokens = tokens_used), so promptTokens + completionTokens = tokensUsed holds for
every row.

Revision ID: e0004_transcript_delivery
Revises: e0001_engine_tables
Create Date: 2026-12-07
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "e0004_transcript_delivery"
down_revision: str | None = "e0003_hardening"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

OLD_REASONS = "('budget_exceeded', 'already_running', 'iteration_cap', 'error', 'stale')"
NEW_REASONS = (
    "('budget_exceeded', 'already_running', 'iteration_cap', 'error', 'stale', 'cancelled')"
)
OLD_FITS = (
    "CASE state WHEN 'skipped' THEN COALESCE(reason IN ('budget_exceeded', 'already_running'),"
    " false) WHEN 'failed' THEN COALESCE(reason IN ('iteration_cap', 'error', 'stale'), false)"
    " ELSE reason IS NULL END"
)
NEW_FITS = (
    "CASE state WHEN 'skipped' THEN COALESCE(reason IN ('budget_exceeded', 'already_running'),"
    " false) WHEN 'failed' THEN COALESCE(reason IN ('iteration_cap', 'error', 'stale',"
    " 'cancelled'), false) ELSE reason IS NULL END"
)

# Ids only, like agent_run_events: a listener (runSteps) reads the rows it is allowed to see.
STEP_NOTIFY_FUNCTION = """
CREATE FUNCTION agent_run_steps_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('agent_run_steps', json_build_object(
        'run_id', NEW.run_id, 'index', NEW.index)::text);
    RETURN NULL;
END $$
"""

# Whichever path ends a run (the worker's finish, a skip, the reaper, cancelRun), in the same
# transaction: steps still open are closed (a failed run shows where it stopped), and the outbox
# gets one delivery per enabled target attached to the agent, its body fixed now so that every
# attempt sends the same bytes under the same webhook-id.
FINISH_FUNCTION = """
CREATE FUNCTION agent_runs_on_finish() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    finished timestamptz := COALESCE(NEW.finished_at, now());
    stamp text := to_char(finished AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"+00:00"');
BEGIN
    IF TG_OP = 'UPDATE' THEN
        UPDATE agent_run_steps SET finished_at = finished,
            error = COALESCE(error, 'the run ended (' || NEW.state
                                    || COALESCE('/' || NEW.reason, '') || ') during this step')
        WHERE run_id = NEW.id AND finished_at IS NULL;
    END IF;
    INSERT INTO run_deliveries (run_id, target_id, webhook_id, event_type, payload,
                                next_attempt_at)
    SELECT NEW.id, t.id, 'msg_' || replace(gen_random_uuid()::text, '-', ''),
           'run.' || NEW.state,
           jsonb_build_object(
               'type', 'run.' || NEW.state,
               'timestamp', stamp,
               'data', jsonb_build_object(
                   'runId', NEW.id::text,
                   'agentId', NEW.agent_id::text,
                   'agentName', a.name,
                   'ownerId', a.user_id::text,
                   'trigger', NEW.trigger,
                   'state', NEW.state,
                   'reason', NEW.reason,
                   'output', NEW.output,
                   'tokensUsed', NEW.tokens_used,
                   'cost', to_jsonb(NEW) ->> 'cost',
                   'finishedAt', stamp)),
           now()
    FROM agent_delivery_targets adt
    JOIN delivery_targets t ON t.id = adt.target_id AND t.enabled
    JOIN agents a ON a.id = adt.agent_id
    WHERE adt.agent_id = NEW.agent_id;
    RETURN NULL;
END $$
"""

# A run finished by a path that does not know the split (the reaper fails a stale run with the
# tokens of its last heartbeat): the split is taken from the recorded model calls, and tokens the
# transcript does not account for count as completion tokens. The worker's own finish and
# cancelRun write a split that adds up, so this does not fire for them.
TOKEN_SPLIT_FUNCTION = """
CREATE FUNCTION agent_runs_token_split() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    steps_prompt bigint;
    steps_completion bigint;
BEGIN
    SELECT COALESCE(sum(prompt_tokens), 0), COALESCE(sum(completion_tokens), 0)
    INTO steps_prompt, steps_completion
    FROM agent_run_steps WHERE run_id = NEW.id;
    NEW.tokens_used := GREATEST(NEW.tokens_used, steps_prompt + steps_completion);
    NEW.prompt_tokens := LEAST(steps_prompt, NEW.tokens_used);
    NEW.completion_tokens := NEW.tokens_used - NEW.prompt_tokens;
    RETURN NEW;
END $$
"""

TERMINAL = "('succeeded', 'failed', 'skipped')"


def upgrade() -> None:
    op.add_column(
        "agent_runs",
        sa.Column("prompt_tokens", sa.BigInteger(), server_default="0", nullable=False),
    )
    op.add_column(
        "agent_runs",
        sa.Column("completion_tokens", sa.BigInteger(), server_default="0", nullable=False),
    )
    op.execute("UPDATE agent_runs SET prompt_tokens = tokens_used WHERE tokens_used > 0")
    op.drop_constraint(op.f("ck_agent_runs_reason"), "agent_runs", type_="check")
    op.drop_constraint(op.f("ck_agent_runs_reason_fits_state"), "agent_runs", type_="check")
    op.create_check_constraint(
        op.f("ck_agent_runs_reason"), "agent_runs", f"reason IS NULL OR reason IN {NEW_REASONS}"
    )
    op.create_check_constraint(op.f("ck_agent_runs_reason_fits_state"), "agent_runs", NEW_FITS)

    op.create_table(
        "agent_run_steps",
        sa.Column("run_id", sa.BigInteger(), nullable=False),
        sa.Column("index", sa.Integer(), nullable=False),
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("input", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.Column("output", sa.Text(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("prompt_tokens", sa.BigInteger(), nullable=True),
        sa.Column("completion_tokens", sa.BigInteger(), nullable=True),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint(
            "kind IN ('model_call', 'tool_call')", name=op.f("ck_agent_run_steps_kind")
        ),
        sa.ForeignKeyConstraint(
            ["run_id"],
            ["agent_runs.id"],
            name=op.f("fk_agent_run_steps_run_id_agent_runs"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("run_id", "index", name=op.f("pk_agent_run_steps")),
    )
    op.create_table(
        "delivery_targets",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("url", sa.Text(), nullable=False),
        sa.Column("secret_env", sa.Text(), nullable=False),
        sa.Column("enabled", sa.Boolean(), server_default=sa.text("true"), nullable=False),
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
        sa.PrimaryKeyConstraint("id", name=op.f("pk_delivery_targets")),
    )
    op.create_table(
        "agent_delivery_targets",
        sa.Column("agent_id", sa.BigInteger(), nullable=False),
        sa.Column("target_id", sa.BigInteger(), nullable=False),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.ForeignKeyConstraint(
            ["agent_id"],
            ["agents.id"],
            name=op.f("fk_agent_delivery_targets_agent_id_agents"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["target_id"],
            ["delivery_targets.id"],
            name=op.f("fk_agent_delivery_targets_target_id_delivery_targets"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("agent_id", "target_id", name=op.f("pk_agent_delivery_targets")),
    )
    op.create_index(
        op.f("ix_agent_delivery_targets_target_id"),
        "agent_delivery_targets",
        ["target_id"],
        unique=False,
    )
    op.create_table(
        "run_deliveries",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("run_id", sa.BigInteger(), nullable=False),
        sa.Column("target_id", sa.BigInteger(), nullable=False),
        sa.Column("webhook_id", sa.Text(), nullable=False),
        sa.Column("event_type", sa.Text(), nullable=False),
        sa.Column("payload", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("status", sa.Text(), server_default="pending", nullable=False),
        sa.Column("attempts", sa.Integer(), server_default="0", nullable=False),
        sa.Column("next_attempt_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("lease_token", sa.Text(), nullable=True),
        sa.Column("leased_until", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_status_code", sa.Integer(), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("delivered_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.CheckConstraint(
            "status IN ('pending', 'delivered', 'failed')", name=op.f("ck_run_deliveries_status")
        ),
        sa.ForeignKeyConstraint(
            ["run_id"],
            ["agent_runs.id"],
            name=op.f("fk_run_deliveries_run_id_agent_runs"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["target_id"],
            ["delivery_targets.id"],
            name=op.f("fk_run_deliveries_target_id_delivery_targets"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_run_deliveries")),
        sa.UniqueConstraint("run_id", "target_id", name=op.f("uq_run_deliveries_run_id_target_id")),
        sa.UniqueConstraint("webhook_id", name=op.f("uq_run_deliveries_webhook_id")),
    )
    op.create_index(
        "ix_run_deliveries_due",
        "run_deliveries",
        ["next_attempt_at"],
        unique=False,
        postgresql_where=sa.text("status = 'pending'"),
    )
    op.create_index(
        "ix_run_deliveries_finished_at",
        "run_deliveries",
        ["finished_at"],
        unique=False,
        postgresql_where=sa.text("finished_at IS NOT NULL"),
    )
    op.create_index(
        op.f("ix_run_deliveries_target_id"), "run_deliveries", ["target_id"], unique=False
    )

    op.execute(STEP_NOTIFY_FUNCTION)
    op.execute(
        "CREATE TRIGGER agent_run_steps_notify AFTER INSERT OR UPDATE ON agent_run_steps"
        " FOR EACH ROW EXECUTE FUNCTION agent_run_steps_notify()"
    )
    op.execute(TOKEN_SPLIT_FUNCTION)
    op.execute(
        "CREATE TRIGGER agent_runs_token_split BEFORE UPDATE ON agent_runs FOR EACH ROW"
        " WHEN (NEW.prompt_tokens + NEW.completion_tokens <> NEW.tokens_used"
        f" AND NEW.state IN {TERMINAL})"
        " EXECUTE FUNCTION agent_runs_token_split()"
    )
    op.execute(FINISH_FUNCTION)
    op.execute(
        "CREATE TRIGGER agent_runs_finish_insert AFTER INSERT ON agent_runs"
        f" FOR EACH ROW WHEN (NEW.state IN {TERMINAL})"
        " EXECUTE FUNCTION agent_runs_on_finish()"
    )
    op.execute(
        "CREATE TRIGGER agent_runs_finish_state AFTER UPDATE OF state ON agent_runs"
        f" FOR EACH ROW WHEN (OLD.state IS DISTINCT FROM NEW.state AND NEW.state IN {TERMINAL})"
        " EXECUTE FUNCTION agent_runs_on_finish()"
    )


def downgrade() -> None:
    op.execute("DROP TRIGGER agent_runs_finish_state ON agent_runs")
    op.execute("DROP TRIGGER agent_runs_finish_insert ON agent_runs")
    op.execute("DROP FUNCTION agent_runs_on_finish()")
    op.execute("DROP TRIGGER agent_runs_token_split ON agent_runs")
    op.execute("DROP FUNCTION agent_runs_token_split()")
    op.drop_index(op.f("ix_run_deliveries_target_id"), table_name="run_deliveries")
    op.drop_index(
        "ix_run_deliveries_finished_at",
        table_name="run_deliveries",
        postgresql_where=sa.text("finished_at IS NOT NULL"),
    )
    op.drop_index(
        "ix_run_deliveries_due",
        table_name="run_deliveries",
        postgresql_where=sa.text("status = 'pending'"),
    )
    op.drop_table("run_deliveries")
    op.drop_index(op.f("ix_agent_delivery_targets_target_id"), table_name="agent_delivery_targets")
    op.drop_table("agent_delivery_targets")
    op.drop_table("delivery_targets")
    op.drop_table("agent_run_steps")
    op.execute("DROP FUNCTION agent_run_steps_notify()")
    # The old CHECK has no `cancelled`: those runs read as failed/error.
    op.execute("UPDATE agent_runs SET reason = 'error' WHERE reason = 'cancelled'")
    op.drop_constraint(op.f("ck_agent_runs_reason_fits_state"), "agent_runs", type_="check")
    op.drop_constraint(op.f("ck_agent_runs_reason"), "agent_runs", type_="check")
    op.create_check_constraint(
        op.f("ck_agent_runs_reason"), "agent_runs", f"reason IS NULL OR reason IN {OLD_REASONS}"
    )
    op.create_check_constraint(op.f("ck_agent_runs_reason_fits_state"), "agent_runs", OLD_FITS)
    op.drop_column("agent_runs", "completion_tokens")
    op.drop_column("agent_runs", "prompt_tokens")
