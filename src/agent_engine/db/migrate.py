"""Alembic driven from code: `agent-engine migrate`, the all-in-one `run` and the test harness."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config

from agent_engine.settings import to_asyncpg_url

MIGRATIONS_DIR = Path(__file__).resolve().parents[3] / "migrations"


def alembic_config(database_url: str) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    # ConfigParser interpolation: a literal % in a password must be doubled.
    config.set_main_option("sqlalchemy.url", to_asyncpg_url(database_url).replace("%", "%%"))
    return config


def upgrade(database_url: str, revision: str = "heads") -> None:
    command.upgrade(alembic_config(database_url), revision)


def downgrade(database_url: str, revision: str = "base") -> None:
    command.downgrade(alembic_config(database_url), revision)
