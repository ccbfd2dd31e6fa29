"""Whose authority a tool call carries: a source says how it authenticates (`tool_sources.auth`),
and each owner's own account at an OWNER_OAUTH source (`tool_connections`), with the engine's
registration at the source's authorization server (`tool_source_oauth_clients`) and the pending
authorization requests (`oauth_states`).

- `tool_sources.auth`: 'none' | 'shared' | 'owner_oauth'. An existing source with `auth_env` becomes
  'shared', one without 'none'. 'owner_oauth' never has an `auth_env` (CHECK).
- `tool_connections`: one row per (owner, source); tokens only as AES-GCM ciphertext
  (`*_enc`, see agent_engine.oauth.keys); removing the source or the user removes the row.
- `oauth_states`: only a SHA-256 of the `state` is stored; a row is single-use (`used_at`) and
  expires (`expires_at`, 10 minutes). The PKCE verifier is stored encrypted.
- `tool_source_oauth_clients`: the client id (and encrypted secret) the engine registered (RFC 7591)
  or was given, for one redirect URI; the authorization server's endpoints as discovered.

Revision ID: e0009_tool_connections
Revises: e0008_budget_weeks
Create Date: 2026-12-06
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "e0009_tool_connections"
down_revision: str | None = "e0008_budget_weeks"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "tool_sources", sa.Column("auth", sa.Text(), nullable=False, server_default="none")
    )
    op.execute("UPDATE tool_sources SET auth = 'shared' WHERE auth_env IS NOT NULL")
    op.add_column("tool_sources", sa.Column("oauth_scopes", postgresql.ARRAY(sa.Text())))
    op.add_column("tool_sources", sa.Column("oauth_client_id_env", sa.Text()))
    op.add_column("tool_sources", sa.Column("oauth_client_secret_env", sa.Text()))
    op.create_check_constraint(
        op.f("ck_tool_sources_auth"), "tool_sources", "auth IN ('none', 'shared', 'owner_oauth')"
    )
    op.create_check_constraint(
        op.f("ck_tool_sources_owner_oauth_no_auth_env"),
        "tool_sources",
        "auth <> 'owner_oauth' OR auth_env IS NULL",
    )

    op.create_table(
        "tool_connections",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("owner_id", sa.BigInteger(), nullable=False),
        sa.Column("source_id", sa.BigInteger(), nullable=False),
        sa.Column("status", sa.Text(), nullable=False, server_default="connected"),
        sa.Column("account", sa.Text()),
        sa.Column(
            "scopes",
            postgresql.ARRAY(sa.Text()),
            nullable=False,
            server_default=sa.text("'{}'::text[]"),
        ),
        sa.Column("access_token_enc", postgresql.BYTEA(), nullable=False),
        sa.Column("refresh_token_enc", postgresql.BYTEA()),
        sa.Column("expires_at", sa.DateTime(timezone=True)),
        sa.Column(
            "connected_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
        sa.Column("last_used_at", sa.DateTime(timezone=True)),
        sa.Column("refreshed_at", sa.DateTime(timezone=True)),
        sa.Column(
            "updated_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
        sa.CheckConstraint(
            "status IN ('connected', 'expired')", name=op.f("ck_tool_connections_status")
        ),
        sa.ForeignKeyConstraint(
            ["owner_id"],
            ["users.id"],
            name=op.f("fk_tool_connections_owner_id_users"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["source_id"],
            ["tool_sources.id"],
            name=op.f("fk_tool_connections_source_id_tool_sources"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_tool_connections")),
        sa.UniqueConstraint(
            "owner_id", "source_id", name=op.f("uq_tool_connections_owner_id_source_id")
        ),
    )
    op.create_index(op.f("ix_tool_connections_source_id"), "tool_connections", ["source_id"])

    op.create_table(
        "oauth_states",
        sa.Column("state_hash", postgresql.BYTEA(), nullable=False),
        sa.Column("owner_id", sa.BigInteger(), nullable=False),
        sa.Column("source_id", sa.BigInteger(), nullable=False),
        sa.Column("verifier_enc", postgresql.BYTEA(), nullable=False),
        sa.Column("redirect_uri", sa.Text(), nullable=False),
        sa.Column("issuer", sa.Text(), nullable=False),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("used_at", sa.DateTime(timezone=True)),
        sa.ForeignKeyConstraint(
            ["owner_id"],
            ["users.id"],
            name=op.f("fk_oauth_states_owner_id_users"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["source_id"],
            ["tool_sources.id"],
            name=op.f("fk_oauth_states_source_id_tool_sources"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("state_hash", name=op.f("pk_oauth_states")),
    )
    op.create_index(op.f("ix_oauth_states_expires_at"), "oauth_states", ["expires_at"])
    op.create_index(op.f("ix_oauth_states_owner_id"), "oauth_states", ["owner_id"])
    op.create_index(op.f("ix_oauth_states_source_id"), "oauth_states", ["source_id"])

    op.create_table(
        "tool_source_oauth_clients",
        sa.Column("source_id", sa.BigInteger(), nullable=False),
        sa.Column("redirect_uri", sa.Text(), nullable=False),
        sa.Column("issuer", sa.Text(), nullable=False),
        sa.Column("client_id", sa.Text(), nullable=False),
        sa.Column("client_secret_enc", postgresql.BYTEA()),
        sa.Column("server_metadata", postgresql.JSONB(), nullable=False),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
        sa.ForeignKeyConstraint(
            ["source_id"],
            ["tool_sources.id"],
            name=op.f("fk_tool_source_oauth_clients_source_id_tool_sources"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("source_id", name=op.f("pk_tool_source_oauth_clients")),
    )


def downgrade() -> None:
    op.drop_table("tool_source_oauth_clients")
    op.drop_table("oauth_states")
    op.drop_table("tool_connections")
    op.drop_constraint(
        op.f("ck_tool_sources_owner_oauth_no_auth_env"), "tool_sources", type_="check"
    )
    op.drop_constraint(op.f("ck_tool_sources_auth"), "tool_sources", type_="check")
    for column in ("oauth_client_secret_env", "oauth_client_id_env", "oauth_scopes", "auth"):
        op.drop_column("tool_sources", column)
