"""SQLAlchemy 2 models, one module per aggregate; `Base.metadata` holds them all once this package
is imported (Alembic's env and the migration test read it).

Database-held behaviour (triggers) is created by the migrations; the current body of every
trigger function is in schema/database.sql.
"""

from __future__ import annotations

from agent_engine.db.models import (
    agents,
    budget,
    connection_waits,
    delivery,
    neighbours,
    operators,
    runs,
    tool_sources,
)
from agent_engine.db.models.base import Base

# Table names by Alembic branch: the neighbours' stand-ins, and the engine's own.
PLATFORM_TABLES = (
    "users",
    "agent_models",
    "tools",
    "platform_settings",
    "kb_documents",
    "kb_document_grants",
    "kb_document_links",
)
ENGINE_TABLES = (
    "agents",
    "agent_runs",
    "agent_tools",
    "budget_alerts",
    "budget_weeks",
    "audit_log",
    "engine_activity",
    "agent_run_steps",
    "delivery_targets",
    "agent_delivery_targets",
    "run_deliveries",
    "tool_sources",
    "tool_approvals",
    "connection_waits",
    "tool_connections",
    "oauth_states",
    "tool_source_oauth_clients",
)

__all__ = [
    "ENGINE_TABLES",
    "PLATFORM_TABLES",
    "Base",
    "agents",
    "budget",
    "connection_waits",
    "delivery",
    "neighbours",
    "operators",
    "runs",
    "tool_sources",
]
