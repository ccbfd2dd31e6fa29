"""The run's trace context (`agent_runs.trace_parent`): the W3C traceparent of the run's
`invoke_agent` span, written when a worker starts the run with tracing on.

A parked run's resume continues the run's trace from it (a new span, never one held open across
the wait), its deliveries join that trace, and `Run.traceId` serves its trace id. NULL while
tracing is off, and for runs that never reached a worker.

Revision ID: e0013_run_trace
Revises: e0012_runs_recover
Create Date: 2026-12-06
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "e0013_run_trace"
down_revision: str | None = "e0012_runs_recover"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Nullable, no default: PostgreSQL adds the column without rewriting the table.
    op.add_column("agent_runs", sa.Column("trace_parent", sa.Text(), nullable=True))


def downgrade() -> None:
    op.drop_column("agent_runs", "trace_parent")
