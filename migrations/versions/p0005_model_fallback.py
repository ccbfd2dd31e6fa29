"""agent_models.fallback_model_id: the model that answers this model's calls while it is down.

NULL = no fallback. The foreign key's ON DELETE SET NULL clears the references to a model removed
from the allowed list. A chain never comes back to where it started: the trigger
`agent_models_fallback_acyclic` walks the chain of every row whose fallback is set and refuses a
cycle (SQLSTATE 23514, constraint `ck_agent_models_fallback_acyclic`, which the API reports as
BAD_USER_INPUT naming `fallbackModelId`). Two admins closing a loop from both ends at once are
settled by the database: the trigger takes one transaction-level advisory lock before it walks,
so the second writer waits for the first to commit and then walks the chain as it now is.

Revision ID: p0005_model_fallback
Revises: p0004_model_prices
Create Date: 2026-12-21
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "p0005_model_fallback"
down_revision: str | None = "p0004_model_prices"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# The advisory lock every change of a fallback takes (a constant key: such changes are rare).
ACYCLIC_FUNCTION = """
CREATE FUNCTION agent_models_fallback_acyclic() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    cursor_id bigint := NEW.fallback_model_id;
    hops integer := 0;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext('agent_models.fallback_model_id'));
    WHILE cursor_id IS NOT NULL LOOP
        IF cursor_id = NEW.id THEN
            RAISE EXCEPTION 'the fallback chain of model % comes back to it', NEW.id
                USING ERRCODE = 'check_violation',
                      CONSTRAINT = 'ck_agent_models_fallback_acyclic';
        END IF;
        hops := hops + 1;
        EXIT WHEN hops > 10000;
        SELECT fallback_model_id INTO cursor_id FROM agent_models WHERE id = cursor_id;
    END LOOP;
    RETURN NEW;
END $$
"""


def upgrade() -> None:
    op.add_column("agent_models", sa.Column("fallback_model_id", sa.BigInteger(), nullable=True))
    op.create_foreign_key(
        op.f("fk_agent_models_fallback_model_id_agent_models"),
        "agent_models",
        "agent_models",
        ["fallback_model_id"],
        ["id"],
        ondelete="SET NULL",
    )
    # The SET NULL of a removal finds the rows pointing at the removed model by this index.
    op.create_index(
        op.f("ix_agent_models_fallback_model_id"),
        "agent_models",
        ["fallback_model_id"],
        postgresql_where=sa.text("fallback_model_id IS NOT NULL"),
    )
    op.execute(ACYCLIC_FUNCTION)
    op.execute(
        "CREATE TRIGGER agent_models_fallback_acyclic"
        " BEFORE INSERT OR UPDATE OF fallback_model_id ON agent_models"
        " FOR EACH ROW WHEN (NEW.fallback_model_id IS NOT NULL)"
        " EXECUTE FUNCTION agent_models_fallback_acyclic()"
    )


def downgrade() -> None:
    op.execute("DROP TRIGGER agent_models_fallback_acyclic ON agent_models")
    op.execute("DROP FUNCTION agent_models_fallback_acyclic()")
    op.drop_index(op.f("ix_agent_models_fallback_model_id"), table_name="agent_models")
    op.drop_constraint(
        op.f("fk_agent_models_fallback_model_id_agent_models"), "agent_models", type_="foreignkey"
    )
    op.drop_column("agent_models", "fallback_model_id")
