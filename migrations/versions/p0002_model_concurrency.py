"""agent_models.max_concurrent_runs: at most this many runs of the model `running` at once.

NULL = no limit. The engine's claim holds the limit across all workers (docs/architecture.md
§10.1); the API accepts 1 to 10,000, the database refuses anything below 1.

Revision ID: p0002_model_concurrency
Revises: p0001_platform_standins
Create Date: 2026-12-14
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "p0002_model_concurrency"
down_revision: str | None = "p0001_platform_standins"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("agent_models", sa.Column("max_concurrent_runs", sa.Integer(), nullable=True))
    op.create_check_constraint(
        op.f("ck_agent_models_max_concurrent_runs_positive"),
        "agent_models",
        "max_concurrent_runs IS NULL OR max_concurrent_runs >= 1",
    )


def downgrade() -> None:
    op.drop_constraint(
        op.f("ck_agent_models_max_concurrent_runs_positive"), "agent_models", type_="check"
    )
    op.drop_column("agent_models", "max_concurrent_runs")
