"""Spend: a run's cost fixed at its finish, and the owners' budget alerts.

- `agent_runs.cost` (NUMERIC, NULL = the model was not priced) is set by a trigger when a run
  leaves queued/running for succeeded/failed, from the prices of the model it ran on (`agent_runs.model_id`) at that moment: every
  path that finishes a run (the worker, the reaper, a cancel) prices it, and a later price change
  never rewrites history (the trigger fires only on that transition).
- `budget_alerts`: one row per owner, budget week and threshold (UNIQUE), written when a finishing
  run takes the owner's week across `budgetAlertPercents` of the cap; a NOTIFY on
  `budget_alert_events` feeds the `budgetAlerts` subscription.
- `ix_agent_runs_pace`: each agent's newest succeeded/failed runs with their tokens, index-only,
  for the forecast and `expectedTokensPerRun` (the median of the last 10).
- `agent_runs.prompt_tokens` / `completion_tokens` (the provider's split of `tokens_used`) are
  added IF NOT EXISTS: the transcript revision adds the same columns, and whichever runs second
  changes nothing.

Revision ID: e0006_cost_alerts
Revises: e0001_engine_tables
Create Date: 2026-12-07
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "e0006_cost_alerts"
down_revision: str | None = "e0005_operators"
branch_labels: str | Sequence[str] | None = None
# The cost trigger reads the model prices.
depends_on: str | Sequence[str] | None = "p0004_model_prices"

# Tokens the provider did not split (an estimate, an old row) are priced as prompt tokens.
COST_FUNCTION = """
CREATE FUNCTION agent_runs_cost_at_finish() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    SELECT (NEW.prompt_tokens * m.input_price_per_million
            + NEW.completion_tokens * m.output_price_per_million
            + GREATEST(NEW.tokens_used - NEW.prompt_tokens - NEW.completion_tokens, 0)
              * m.input_price_per_million) * 0.000001
      INTO NEW.cost
      FROM agent_models m
     WHERE m.id = COALESCE(NEW.model_id, (SELECT a.model_id FROM agents a WHERE a.id = NEW.agent_id))
       AND m.input_price_per_million IS NOT NULL
       AND m.output_price_per_million IS NOT NULL;
    IF NOT FOUND THEN
        NEW.cost := NULL;
    END IF;
    RETURN NEW;
END $$
"""

ALERT_NOTIFY_FUNCTION = """
CREATE FUNCTION budget_alerts_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('budget_alert_events', json_build_object(
        'id', NEW.id,
        'owner_id', NEW.owner_id,
        'window_start', NEW.window_start,
        'percent', NEW.percent,
        'used_tokens', NEW.used_tokens,
        'cap_tokens', NEW.cap_tokens,
        'crossed_at', NEW.crossed_at
    )::text);
    RETURN NULL;
END $$
"""


def upgrade() -> None:
    op.execute(
        "ALTER TABLE agent_runs"
        " ADD COLUMN IF NOT EXISTS prompt_tokens BIGINT NOT NULL DEFAULT 0,"
        " ADD COLUMN IF NOT EXISTS completion_tokens BIGINT NOT NULL DEFAULT 0"
    )
    op.add_column("agent_runs", sa.Column("cost", sa.Numeric(), nullable=True))
    # An agent's pace (the forecast, expectedTokensPerRun): its newest runs that ran, index-only.
    op.create_index(
        "ix_agent_runs_pace",
        "agent_runs",
        ["agent_id", sa.literal_column("id DESC")],
        unique=False,
        postgresql_include=["tokens_used"],
        postgresql_where=sa.text("state IN ('succeeded', 'failed')"),
    )
    op.create_table(
        "budget_alerts",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("owner_id", sa.BigInteger(), nullable=False),
        sa.Column("window_start", sa.DateTime(timezone=True), nullable=False),
        sa.Column("percent", sa.Integer(), nullable=False),
        sa.Column("used_tokens", sa.BigInteger(), nullable=False),
        sa.Column("cap_tokens", sa.BigInteger(), nullable=False),
        sa.Column(
            "crossed_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.CheckConstraint(
            "percent >= 1 AND percent <= 100", name=op.f("ck_budget_alerts_percent_range")
        ),
        sa.ForeignKeyConstraint(
            ["owner_id"],
            ["users.id"],
            name=op.f("fk_budget_alerts_owner_id_users"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_budget_alerts")),
        sa.UniqueConstraint(
            "owner_id",
            "window_start",
            "percent",
            name=op.f("uq_budget_alerts_owner_id_window_start_percent"),
        ),
    )
    op.execute(COST_FUNCTION)
    op.execute(
        "CREATE TRIGGER agent_runs_cost_at_finish BEFORE UPDATE OF state ON agent_runs"
        " FOR EACH ROW WHEN (OLD.state IN ('queued', 'running')"
        " AND NEW.state IN ('succeeded', 'failed'))"
        " EXECUTE FUNCTION agent_runs_cost_at_finish()"
    )
    op.execute(ALERT_NOTIFY_FUNCTION)
    op.execute(
        "CREATE TRIGGER budget_alerts_notify AFTER INSERT ON budget_alerts"
        " FOR EACH ROW EXECUTE FUNCTION budget_alerts_notify()"
    )


def downgrade() -> None:
    op.execute("DROP TRIGGER budget_alerts_notify ON budget_alerts")
    op.execute("DROP FUNCTION budget_alerts_notify()")
    op.execute("DROP TRIGGER agent_runs_cost_at_finish ON agent_runs")
    op.execute("DROP FUNCTION agent_runs_cost_at_finish()")
    op.drop_table("budget_alerts")
    op.drop_index(
        "ix_agent_runs_pace",
        table_name="agent_runs",
        postgresql_include=["tokens_used"],
        postgresql_where=sa.text("state IN ('succeeded', 'failed')"),
    )
    op.drop_column("agent_runs", "cost")
    # prompt_tokens / completion_tokens stay: the transcript revision owns them too.
