"""Neighbours' stand-ins: users, agent_models, tools, platform_settings, Knowledge Store.

These tables belong to other services in the real platform (Auth, Admin, Knowledge Store).
They live in their own branch (label `platform`) so a deployment inside the platform can
leave it out and point the engine branch at the real tables.

Revision ID: p0001_platform_standins
Revises:
Create Date: 2026-11-30
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "p0001_platform_standins"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = ("platform",)
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "agent_models",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("provider", sa.Text(), nullable=False),
        sa.Column("model", sa.Text(), nullable=False),
        sa.Column("base_url", sa.Text(), nullable=True),
        sa.Column("api_key_env", sa.Text(), nullable=True),
        sa.Column("is_default", sa.Boolean(), server_default=sa.text("false"), nullable=False),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.CheckConstraint(
            "provider IN ('openai', 'builtin')", name=op.f("ck_agent_models_provider")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_agent_models")),
    )
    op.create_index(
        "uq_agent_models_one_default",
        "agent_models",
        ["is_default"],
        unique=True,
        postgresql_where=sa.text("is_default"),
    )
    op.create_table(
        "kb_documents",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("title", sa.Text(), nullable=False),
        sa.Column("body", sa.Text(), nullable=False),
        sa.Column("source", sa.Text(), nullable=True),
        sa.Column("is_public", sa.Boolean(), server_default=sa.text("false"), nullable=False),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column(
            "updated_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column(
            "search_vector",
            postgresql.TSVECTOR(),
            sa.Computed(
                "setweight(to_tsvector('english', coalesce(title, '')), 'A') || setweight(to_tsvector('english', coalesce(body, '')), 'B')",
                persisted=True,
            ),
            nullable=False,
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_kb_documents")),
        sa.UniqueConstraint("source", name=op.f("uq_kb_documents_source")),
    )
    op.create_index(
        "ix_kb_documents_search",
        "kb_documents",
        ["search_vector"],
        unique=False,
        postgresql_using="gin",
    )
    op.create_table(
        "platform_settings",
        sa.Column("key", sa.Text(), nullable=False),
        sa.Column("value", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.Column(
            "updated_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.PrimaryKeyConstraint("key", name=op.f("pk_platform_settings")),
    )
    op.create_table(
        "tools",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("description", sa.Text(), server_default="", nullable=False),
        sa.Column("agents_allowed", sa.Boolean(), server_default=sa.text("false"), nullable=False),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_tools")),
        sa.UniqueConstraint("name", name=op.f("uq_tools_name")),
    )
    op.create_table(
        "users",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("email", sa.Text(), nullable=True),
        sa.Column("display_name", sa.Text(), nullable=True),
        sa.Column("timezone", sa.Text(), nullable=True),
        sa.Column("is_active", sa.Boolean(), server_default=sa.text("true"), nullable=False),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_users")),
    )
    op.create_table(
        "kb_document_grants",
        sa.Column("document_id", sa.BigInteger(), nullable=False),
        sa.Column("user_id", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["document_id"],
            ["kb_documents.id"],
            name=op.f("fk_kb_document_grants_document_id_kb_documents"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["user_id"],
            ["users.id"],
            name=op.f("fk_kb_document_grants_user_id_users"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("document_id", "user_id", name=op.f("pk_kb_document_grants")),
    )
    op.create_index(
        "ix_kb_document_grants_user_id", "kb_document_grants", ["user_id"], unique=False
    )
    op.create_table(
        "kb_document_links",
        sa.Column("from_document_id", sa.BigInteger(), nullable=False),
        sa.Column("to_document_id", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["from_document_id"],
            ["kb_documents.id"],
            name=op.f("fk_kb_document_links_from_document_id_kb_documents"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["to_document_id"],
            ["kb_documents.id"],
            name=op.f("fk_kb_document_links_to_document_id_kb_documents"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint(
            "from_document_id", "to_document_id", name=op.f("pk_kb_document_links")
        ),
    )
    op.create_index(
        "ix_kb_document_links_to_document_id", "kb_document_links", ["to_document_id"], unique=False
    )


def downgrade() -> None:
    op.drop_index("ix_kb_document_links_to_document_id", table_name="kb_document_links")
    op.drop_table("kb_document_links")
    op.drop_index("ix_kb_document_grants_user_id", table_name="kb_document_grants")
    op.drop_table("kb_document_grants")
    op.drop_table("users")
    op.drop_table("tools")
    op.drop_table("platform_settings")
    op.drop_index("ix_kb_documents_search", table_name="kb_documents", postgresql_using="gin")
    op.drop_table("kb_documents")
    op.drop_index(
        "uq_agent_models_one_default",
        table_name="agent_models",
        postgresql_where=sa.text("is_default"),
    )
    op.drop_table("agent_models")
