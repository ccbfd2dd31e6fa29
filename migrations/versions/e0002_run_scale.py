"""agent_runs.model_id: the model a run is queued for and runs on, for per-model limits.

Set from the agent when the run is journaled and again when a worker claims it (the owner may
have picked another model meanwhile). Not a foreign key: the journal outlives the model list, and
removing a model must not rewrite its history. The partial index serves the claim's count of a
model's `running` runs and the oldest `queued` runs waiting for one of its slots.

Revision ID: e0002_run_scale
Revises: e0001_engine_tables
Create Date: 2026-12-14
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "e0002_run_scale"
down_revision: str | None = "e0001_engine_tables"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("agent_runs", sa.Column("model_id", sa.BigInteger(), nullable=True))
    # Unfinished runs only: finished history keeps NULL ("before the column existed").
    op.execute(
        "UPDATE agent_runs r SET model_id = a.model_id FROM agents a"
        " WHERE a.id = r.agent_id AND r.state IN ('queued', 'running')"
    )
    op.create_index(
        "ix_agent_runs_model_unfinished",
        "agent_runs",
        ["model_id", "state", "id"],
        unique=False,
        postgresql_where=sa.text("state IN ('queued', 'running')"),
    )


def downgrade() -> None:
    op.drop_index(
        "ix_agent_runs_model_unfinished",
        table_name="agent_runs",
        postgresql_where=sa.text("state IN ('queued', 'running')"),
    )
    op.drop_column("agent_runs", "model_id")
