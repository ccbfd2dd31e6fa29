"""Hardening: hidden (deleted) agents keep the week's spend; the reaper tracks its re-sends.

- `agents.deleted_at`: `deleteAgent` hides an agent whose runs still count in a budget week
  instead of deleting it (the FK cascade would take the spend with it). A hidden agent is switched
  off (CHECK: `deleted_at IS NULL OR NOT enabled`, so the gate trigger keeps `next_run_at` NULL),
  vanishes from every view, and is purged once none of its runs can count any more.
- The NOTIFY trigger of `agent_runs` is silent for runs of hidden agents: a run that finishes
  after its agent was deleted does not show up in subscriptions.
- `agent_runs.last_sent_at`: when the reaper last re-sent the execute message of a queued run
  (NULL: only the first send, right after `created_at`).

Revision ID: e0003_hardening
Revises: e0001_engine_tables
Create Date: 2026-12-14
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "e0003_hardening"
down_revision: str | None = "e0002_run_scale"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# As e0001's, plus: nothing for runs of a hidden agent.
NOTIFY_FUNCTION = """
CREATE OR REPLACE FUNCTION agent_runs_notify() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    previous text := NULL;
    owner bigint;
    hidden boolean;
BEGIN
    SELECT user_id, deleted_at IS NOT NULL INTO owner, hidden FROM agents WHERE id = NEW.agent_id;
    IF hidden THEN
        RETURN NULL;
    END IF;
    IF TG_OP = 'UPDATE' THEN
        previous := OLD.state;
    END IF;
    PERFORM pg_notify('agent_run_events', json_build_object(
        'run_id', NEW.id,
        'agent_id', NEW.agent_id,
        'owner_id', owner,
        'state', NEW.state,
        'previous_state', previous
    )::text);
    RETURN NULL;
END $$
"""

E0001_NOTIFY_FUNCTION = """
CREATE OR REPLACE FUNCTION agent_runs_notify() RETURNS trigger LANGUAGE plpgsql AS $$
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
    op.add_column("agents", sa.Column("deleted_at", sa.DateTime(timezone=True), nullable=True))
    op.create_check_constraint(
        op.f("ck_agents_hidden_is_switched_off"), "agents", "deleted_at IS NULL OR NOT enabled"
    )
    op.create_index(
        "ix_agents_deleted_at",
        "agents",
        ["deleted_at"],
        unique=False,
        postgresql_where=sa.text("deleted_at IS NOT NULL"),
    )
    op.add_column(
        "agent_runs", sa.Column("last_sent_at", sa.DateTime(timezone=True), nullable=True)
    )
    op.execute(NOTIFY_FUNCTION)


def downgrade() -> None:
    op.execute(E0001_NOTIFY_FUNCTION)
    op.drop_column("agent_runs", "last_sent_at")
    op.drop_index(
        "ix_agents_deleted_at",
        table_name="agents",
        postgresql_where=sa.text("deleted_at IS NOT NULL"),
    )
    op.drop_constraint(op.f("ck_agents_hidden_is_switched_off"), "agents", type_="check")
    op.drop_column("agents", "deleted_at")
