"""Fallback steps: agent_run_steps.fallback and .model_id; a run's cost prices each step at the
model that answered it.

`fallback` is true for a model call a fallback model answered (the step's `name` is then that
model's); `model_id` is the answering model of such a step (no foreign key: a model removed later
leaves the id, and the run's cost was fixed at its finish). `agent_runs_cost_at_finish` now prices
the fallback steps' tokens at their models' prices and the rest of the run's tokens at the run's
model, as before; a run with a fallback step on an unpriced model has no cost (NULL), as a run
of an unpriced model has none. A run without fallback steps is priced exactly as before.

Revision ID: e0011_model_fallback
Revises: e0010_connection_waits
Create Date: 2026-12-21
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "e0011_model_fallback"
down_revision: str | None = "e0010_connection_waits"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = "p0005_model_fallback"

# Tokens the provider did not split (an estimate, an old row) are priced as prompt tokens of the
# run's model. Fallback steps are written before the finish (runs/steps.py), so they are seen here.
COST_FUNCTION = """
CREATE OR REPLACE FUNCTION agent_runs_cost_at_finish() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    fb_prompt bigint;
    fb_completion bigint;
    fb_cost numeric;
    fb_unpriced boolean;
    own_prompt bigint;
    own_completion bigint;
    own_unsplit bigint;
BEGIN
    SELECT COALESCE(sum(COALESCE(s.prompt_tokens, 0)), 0),
           COALESCE(sum(COALESCE(s.completion_tokens, 0)), 0),
           sum(COALESCE(s.prompt_tokens, 0) * m.input_price_per_million
               + COALESCE(s.completion_tokens, 0) * m.output_price_per_million),
           COALESCE(bool_or(m.input_price_per_million IS NULL
                            OR m.output_price_per_million IS NULL), false)
      INTO fb_prompt, fb_completion, fb_cost, fb_unpriced
      FROM agent_run_steps s LEFT JOIN agent_models m ON m.id = s.model_id
     WHERE s.run_id = NEW.id AND s.fallback;
    IF fb_unpriced THEN
        NEW.cost := NULL;
        RETURN NEW;
    END IF;
    own_prompt := GREATEST(NEW.prompt_tokens - fb_prompt, 0);
    own_completion := GREATEST(NEW.completion_tokens - fb_completion, 0);
    own_unsplit := GREATEST(NEW.tokens_used - NEW.prompt_tokens - NEW.completion_tokens, 0);
    SELECT (own_prompt * m.input_price_per_million
            + own_completion * m.output_price_per_million
            + own_unsplit * m.input_price_per_million
            + COALESCE(fb_cost, 0)) * 0.000001
      INTO NEW.cost
      FROM agent_models m
     WHERE m.id = COALESCE(NEW.model_id, (SELECT a.model_id FROM agents a WHERE a.id = NEW.agent_id))
       AND m.input_price_per_million IS NOT NULL
       AND m.output_price_per_million IS NOT NULL;
    IF NOT FOUND THEN
        -- The run's own model is not priced: a run answered by fallbacks alone is still priced.
        IF fb_cost IS NOT NULL AND own_prompt + own_completion + own_unsplit = 0 THEN
            NEW.cost := fb_cost * 0.000001;
        ELSE
            NEW.cost := NULL;
        END IF;
    END IF;
    RETURN NEW;
END $$
"""

PREVIOUS_COST_FUNCTION = """
CREATE OR REPLACE FUNCTION agent_runs_cost_at_finish() RETURNS trigger LANGUAGE plpgsql AS $$
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


def upgrade() -> None:
    op.add_column(
        "agent_run_steps",
        sa.Column("fallback", sa.Boolean(), server_default=sa.text("false"), nullable=False),
    )
    op.add_column("agent_run_steps", sa.Column("model_id", sa.BigInteger(), nullable=True))
    op.execute(COST_FUNCTION)


def downgrade() -> None:
    op.execute(PREVIOUS_COST_FUNCTION)
    op.drop_column("agent_run_steps", "model_id")
    op.drop_column("agent_run_steps", "fallback")
