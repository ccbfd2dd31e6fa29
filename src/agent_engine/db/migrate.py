"""Alembic driven from code: `agent-engine migrate`, the all-in-one `run` and the test harness."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config

from agent_engine.settings import to_asyncpg_url

# A checkout (and an editable install) has the Alembic scripts beside `src/`; an installed package
# (the Docker image) finds them in the working directory's `migrations/` (the image's /app).
MIGRATIONS_DIR = Path(__file__).resolve().parents[3] / "migrations"


def migrations_dir() -> Path:
    for candidate in (MIGRATIONS_DIR, Path.cwd() / "migrations"):
        if (candidate / "env.py").is_file():
            return candidate
    raise RuntimeError(
        f"no Alembic migrations found in {MIGRATIONS_DIR} or ./migrations: run from a checkout, "
        "or from the directory holding the repository's migrations/ (the image's /app)"
    )


def alembic_config(database_url: str) -> Config:
    config = Config()
    config.set_main_option("script_location", str(migrations_dir()))
    # ConfigParser interpolation: a literal % in a password must be doubled.
    config.set_main_option("sqlalchemy.url", to_asyncpg_url(database_url).replace("%", "%%"))
    return config


def upgrade(database_url: str, revision: str = "heads") -> None:
    command.upgrade(alembic_config(database_url), revision)


def downgrade(database_url: str, revision: str = "base") -> None:
    command.downgrade(alembic_config(database_url), revision)
