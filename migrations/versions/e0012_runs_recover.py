"""Runs that recover: retries of failed runs, and token caps per agent and per run.

- `agents.weekly_token_cap`: the owner's cap on this agent's tokens per budget week (NULL: none);
  its starts are journaled `skipped` / `agent_budget_exceeded` once the agent's week reaches it.
- `agents.max_tokens_per_run`: a run whose tokens pass it stops `failed` / `token_cap`.
- `agent_runs.retry_of`: the failed run a `retry` run continues. UNIQUE: a run is retried at most
  once, whatever races (two `retryRun`s meet on the index; the later one is a CONFLICT). A retried
  run deleted by retention leaves its retry standing (SET NULL).
- `agent_run_steps.reused`: a step a `retry` run carried over from the failed run (not made
  again). Its tokens stay on the step for the transcript but count nowhere: the token split
  (`agent_runs_token_split`) and the cost of fallback steps (`agent_runs_cost_at_finish`) sum only
  the run's own steps, so neither the run's `tokens_used` nor its owner's budget week (which adds
  the run's `tokens_used`) counts them again.
- The trigger `retry` and the reasons `token_cap` (failed) and `agent_budget_exceeded` (skipped)
  in the journal's CHECKs.

Revision ID: e0012_runs_recover
Revises: e0011_model_fallback
Create Date: 2026-12-06
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "e0012_runs_recover"
down_revision: str | None = "e0011_model_fallback"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

OLD_TRIGGERS = "('manual', 'scheduled')"
NEW_TRIGGERS = "('manual', 'scheduled', 'retry')"
OLD_REASONS = (
    "('budget_exceeded', 'already_running', 'iteration_cap', 'error', 'stale', 'cancelled')"
)
NEW_REASONS = (
    "('budget_exceeded', 'already_running', 'iteration_cap', 'error', 'stale', 'cancelled',"
    " 'token_cap', 'agent_budget_exceeded')"
)
OLD_FITS = (
    "CASE state WHEN 'skipped' THEN COALESCE(reason IN ('budget_exceeded', 'already_running'),"
    " false) WHEN 'failed' THEN COALESCE(reason IN ('iteration_cap', 'error', 'stale',"
    " 'cancelled'), false) ELSE reason IS NULL END"
)
NEW_FITS = (
    "CASE state WHEN 'skipped' THEN COALESCE(reason IN ('budget_exceeded', 'already_running',"
    " 'agent_budget_exceeded'), false) WHEN 'failed' THEN COALESCE(reason IN ('iteration_cap',"
    " 'error', 'stale', 'cancelled', 'token_cap'), false) ELSE reason IS NULL END"
)


def _token_split(own_steps: str) -> str:
    return f"""
CREATE OR REPLACE FUNCTION agent_runs_token_split() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    steps_prompt bigint;
    steps_completion bigint;
BEGIN
    SELECT COALESCE(sum(prompt_tokens), 0), COALESCE(sum(completion_tokens), 0)
    INTO steps_prompt, steps_completion
    FROM agent_run_steps WHERE run_id = NEW.id{own_steps};
    NEW.tokens_used := GREATEST(NEW.tokens_used, steps_prompt + steps_completion);
    NEW.prompt_tokens := LEAST(steps_prompt, NEW.tokens_used);
    NEW.completion_tokens := NEW.tokens_used - NEW.prompt_tokens;
    RETURN NEW;
END $$
"""


# The fallback steps the cost function prices (e0011_model_fallback): the run's own only.
_FALLBACK_STEPS = "WHERE s.run_id = NEW.id AND s.fallback"


def _edit_cost_function(old: str, new: str) -> str:
    """Rewrite `agent_runs_cost_at_finish` in place (its text is e0011's); refuse to go on when
    the text to change is not there, rather than leave reused steps priced again."""
    return f"""
DO $$
DECLARE
    body text := pg_get_functiondef('agent_runs_cost_at_finish()'::regprocedure);
BEGIN
    IF position({old!r} IN body) = 0 THEN
        RAISE EXCEPTION 'agent_runs_cost_at_finish does not read %', {old!r};
    END IF;
    EXECUTE replace(body, {old!r}, {new!r});
END $$
"""


def upgrade() -> None:
    op.add_column("agents", sa.Column("weekly_token_cap", sa.BigInteger(), nullable=True))
    op.add_column("agents", sa.Column("max_tokens_per_run", sa.BigInteger(), nullable=True))
    op.create_check_constraint(
        op.f("ck_agents_weekly_token_cap_positive"),
        "agents",
        "weekly_token_cap IS NULL OR weekly_token_cap > 0",
    )
    op.create_check_constraint(
        op.f("ck_agents_max_tokens_per_run_positive"),
        "agents",
        "max_tokens_per_run IS NULL OR max_tokens_per_run > 0",
    )
    op.add_column("agent_runs", sa.Column("retry_of", sa.BigInteger(), nullable=True))
    op.create_foreign_key(
        op.f("fk_agent_runs_retry_of_agent_runs"),
        "agent_runs",
        "agent_runs",
        ["retry_of"],
        ["id"],
        ondelete="SET NULL",
    )
    op.create_unique_constraint(op.f("uq_agent_runs_retry_of"), "agent_runs", ["retry_of"])
    op.add_column(
        "agent_run_steps",
        sa.Column("reused", sa.Boolean(), server_default=sa.text("false"), nullable=False),
    )
    op.drop_constraint(op.f("ck_agent_runs_trigger"), "agent_runs", type_="check")
    op.create_check_constraint(
        op.f("ck_agent_runs_trigger"), "agent_runs", f"trigger IN {NEW_TRIGGERS}"
    )
    op.drop_constraint(op.f("ck_agent_runs_reason"), "agent_runs", type_="check")
    op.drop_constraint(op.f("ck_agent_runs_reason_fits_state"), "agent_runs", type_="check")
    op.create_check_constraint(
        op.f("ck_agent_runs_reason"), "agent_runs", f"reason IS NULL OR reason IN {NEW_REASONS}"
    )
    op.create_check_constraint(op.f("ck_agent_runs_reason_fits_state"), "agent_runs", NEW_FITS)
    op.execute(_token_split(" AND NOT reused"))
    op.execute(_edit_cost_function(_FALLBACK_STEPS, _FALLBACK_STEPS + " AND NOT s.reused"))


def downgrade() -> None:
    op.execute(_edit_cost_function(_FALLBACK_STEPS + " AND NOT s.reused", _FALLBACK_STEPS))
    op.execute(_token_split(""))
    # The older journal's nearest words: a retry was a manual start, the caps' ends the seed's.
    op.execute("UPDATE agent_runs SET trigger = 'manual' WHERE trigger = 'retry'")
    op.execute("UPDATE agent_runs SET reason = 'error' WHERE reason = 'token_cap'")
    op.execute(
        "UPDATE agent_runs SET reason = 'budget_exceeded' WHERE reason = 'agent_budget_exceeded'"
    )
    op.drop_constraint(op.f("ck_agent_runs_reason_fits_state"), "agent_runs", type_="check")
    op.drop_constraint(op.f("ck_agent_runs_reason"), "agent_runs", type_="check")
    op.create_check_constraint(
        op.f("ck_agent_runs_reason"), "agent_runs", f"reason IS NULL OR reason IN {OLD_REASONS}"
    )
    op.create_check_constraint(op.f("ck_agent_runs_reason_fits_state"), "agent_runs", OLD_FITS)
    op.drop_constraint(op.f("ck_agent_runs_trigger"), "agent_runs", type_="check")
    op.create_check_constraint(
        op.f("ck_agent_runs_trigger"), "agent_runs", f"trigger IN {OLD_TRIGGERS}"
    )
    op.drop_column("agent_run_steps", "reused")
    op.drop_constraint(op.f("uq_agent_runs_retry_of"), "agent_runs", type_="unique")
    op.drop_constraint(op.f("fk_agent_runs_retry_of_agent_runs"), "agent_runs", type_="foreignkey")
    op.drop_column("agent_runs", "retry_of")
    op.drop_constraint(op.f("ck_agents_max_tokens_per_run_positive"), "agents", type_="check")
    op.drop_constraint(op.f("ck_agents_weekly_token_cap_positive"), "agents", type_="check")
    op.drop_column("agents", "max_tokens_per_run")
    op.drop_column("agents", "weekly_token_cap")
