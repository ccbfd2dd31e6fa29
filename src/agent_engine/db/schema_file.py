"""The database's current schema of record: `schema/database.sql`.

Migrations say how the schema got here; this file says what it is now — every table, constraint,
index and trigger function's current body — in one place, the way `schema/schema.graphql` does for
the API. It is `pg_dump --schema-only` of a database migrated to head, normalised so it is stable
across runs and server versions (no dump banner, no `SET`s, no random `\\restrict` keys). The
test suite regenerates it and fails naming each object that differs (`objects()`).
"""

from __future__ import annotations

import asyncio
import re
import shutil
import subprocess
from pathlib import Path

import asyncpg
from alembic.script import ScriptDirectory

from agent_engine.db.migrate import alembic_config
from agent_engine.embedded import embedded_pg_binary
from agent_engine.settings import to_libpq_url

SCHEMA_FILE = Path(__file__).resolve().parents[3] / "schema" / "database.sql"
HEADER = (
    "-- The current database schema of record, generated from a database migrated to head by\n"
    "-- `agent-engine export-schema --database` (or `make schema`). Do not edit: write a\n"
    "-- migration, then regenerate. tests/integration/db/test_schema_file.py checks it.\n"
)
# pg_dump's object banner: "-- Name: agents; Type: TABLE; Schema: public; Owner: -"
_BANNER = re.compile(r"^-- Name: (?P<name>.+?); Type: (?P<type>[^;]+);")
_DROPPED_PREFIXES = ("SET ", "SELECT pg_catalog.set_config", "\\restrict", "\\unrestrict")
# Some Debian servers carry a per-column attribute option no migration wrote; it is not schema.
_SERVER_NOISE = re.compile(r"^ALTER TABLE ONLY \S+ ALTER COLUMN \S+ SET \(pg_attver=\d+\);$")
_DUMP_TIMEOUT_SECONDS = 120


class SchemaExportError(RuntimeError):
    """The schema cannot be exported (no pg_dump, or the database is not at head)."""


def pg_dump_binary() -> str:
    """The embedded PostgreSQL's pg_dump when that extra is installed, else pg_dump on PATH."""
    found = embedded_pg_binary("pg_dump") or shutil.which("pg_dump")
    if found is None:
        raise SchemaExportError(
            "pg_dump not found: install PostgreSQL's client tools, or agent-engine[embedded]"
        )
    return str(found)


def revision_gap(database_url: str) -> tuple[set[str], set[str]]:
    """(the database's current revisions, the migrations' heads it has not reached)."""
    script = ScriptDirectory.from_config(alembic_config(database_url))
    heads = set(script.get_heads())
    current = asyncio.run(_current_revisions(to_libpq_url(database_url)))
    # A head reached through another branch's `depends_on` is applied without its own row.
    applied = {rev.revision for rev in script.iterate_revisions(tuple(current), "base")}
    return current, heads - applied


async def _current_revisions(url: str) -> set[str]:
    try:
        conn = await asyncpg.connect(url)
    except (OSError, asyncpg.PostgresError) as exc:
        raise SchemaExportError(
            f"cannot connect to DATABASE_URL ({type(exc).__name__}: {exc})"
        ) from exc
    try:
        if await conn.fetchval("SELECT to_regclass('public.alembic_version')") is None:
            return set()
        return {row[0] for row in await conn.fetch("SELECT version_num FROM alembic_version")}
    finally:
        await conn.close()


def check_at_head(database_url: str) -> None:
    current, missing = revision_gap(database_url)
    if missing:
        have = ", ".join(sorted(current)) or "none (an empty database)"
        raise SchemaExportError(
            f"the database is not at the latest migration (it has {have}; it lacks "
            f"{', '.join(sorted(missing))}): run `agent-engine migrate` first"
        )


def normalise(dump: str) -> str:
    """Drop what changes between runs and server versions; keep each object's banner."""
    kept: list[str] = []
    for line in dump.splitlines():
        if line.startswith(_DROPPED_PREFIXES) or _SERVER_NOISE.match(line):
            continue
        if line.startswith("--") and not _BANNER.match(line):
            continue
        kept.append(line.rstrip())
    text = "\n".join(kept)
    text = re.sub(r"\n{3,}", "\n\n", text).strip()
    return HEADER + "\n" + text + "\n"


def dump_schema(database_url: str) -> str:
    """The normalised schema of the database at `database_url` (which must be at head)."""
    check_at_head(database_url)
    result = subprocess.run(
        [
            pg_dump_binary(),
            "--schema-only",
            "--no-owner",
            "--no-privileges",
            "--exclude-table=public.alembic_version",
            "--dbname",
            to_libpq_url(database_url),
        ],
        capture_output=True,
        text=True,
        timeout=_DUMP_TIMEOUT_SECONDS,
        check=False,
    )
    if result.returncode != 0:
        raise SchemaExportError(f"pg_dump failed: {result.stderr.strip()}")
    return normalise(result.stdout)


def objects(schema: str) -> dict[str, str]:
    """Each object of a normalised schema by "<type> <name>", with its statements."""
    found: dict[str, str] = {}
    current: str | None = None
    lines: list[str] = []
    for line in schema.splitlines():
        banner = _BANNER.match(line)
        if banner:
            if current is not None:
                found[current] = "\n".join(lines).strip()
            current = f"{banner['type']} {banner['name']}"
            lines = []
        elif current is not None:
            lines.append(line)
    if current is not None:
        found[current] = "\n".join(lines).strip()
    return found


def differences(expected: str, actual: str) -> list[str]:
    """The objects that differ between two normalised schemas, each named with how."""
    old, new = objects(expected), objects(actual)
    out = [f"{name}: missing from the database" for name in sorted(old.keys() - new.keys())]
    out += [f"{name}: not in schema/database.sql" for name in sorted(new.keys() - old.keys())]
    both = sorted(old.keys() & new.keys())
    out += [f"{name}: differs" for name in both if old[name] != new[name]]
    return out
