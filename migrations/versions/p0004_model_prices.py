"""Model prices: per million prompt (input) and completion (output) tokens, in the platform
currency. NULL = not priced. NUMERIC, never a float: money is exact.

Revision ID: p0004_model_prices
Revises: p0001_platform_standins
Create Date: 2026-12-07
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "p0004_model_prices"
down_revision: str | None = "p0002_model_concurrency"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

PRICE_COLUMNS = ("input_price_per_million", "output_price_per_million")


def upgrade() -> None:
    for column in PRICE_COLUMNS:
        op.add_column("agent_models", sa.Column(column, sa.Numeric(), nullable=True))
        op.create_check_constraint(
            op.f(f"ck_agent_models_{column}_range"),
            "agent_models",
            f"{column} IS NULL OR ({column} >= 0 AND {column} <= 10000)",
        )


def downgrade() -> None:
    for column in PRICE_COLUMNS:
        op.drop_constraint(op.f(f"ck_agent_models_{column}_range"), "agent_models", type_="check")
        op.drop_column("agent_models", column)
