"""What `agent-engine export-schema` (`cli.py`) writes and where: the GraphQL SDL or, with
`--database`, the database schema of record dumped from DATABASE_URL or from a throwaway
embedded PostgreSQL migrated to head.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:
    from collections.abc import Callable


def write_export(text: str, output: Path) -> None:
    """To stdout for '-', else to the file (its folder created)."""
    if str(output) == "-":
        sys.stdout.write(text)
        return
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(text)
    typer.echo(f"wrote {output}")


def database_schema() -> str:
    from agent_engine.db.schema_file import SchemaExportError, dump_schema

    database_url = os.environ.get("DATABASE_URL")
    try:
        return dump_schema(database_url) if database_url else dump_from_embedded(dump_schema)
    except SchemaExportError as exc:
        typer.echo(f"export-schema --database: {exc}", err=True)
        raise typer.Exit(2) from exc


def dump_from_embedded(dump: Callable[[str], str]) -> str:
    """A throwaway embedded PostgreSQL, migrated to head, dumped and removed."""
    import tempfile

    from agent_engine.db.migrate import upgrade
    from agent_engine.embedded import EmbeddedPostgres

    with tempfile.TemporaryDirectory(prefix="agent-engine-schema-") as tmp:
        server = EmbeddedPostgres(Path(tmp) / "pg", ephemeral=True)
        url = server.start()
        try:
            upgrade(url)
            return dump(url)
        finally:
            server.stop()
