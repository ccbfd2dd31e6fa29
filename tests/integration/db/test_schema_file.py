"""schema/database.sql is the schema a database migrated to head has, object for object."""

from __future__ import annotations

import asyncio

import pytest

from agent_engine.db.migrate import upgrade
from agent_engine.db.schema_file import (
    SCHEMA_FILE,
    SchemaExportError,
    differences,
    dump_schema,
    objects,
)
from tests.conftest import Servers
from tests.integration.db.support import empty_database


def test_schema_file_matches_a_database_migrated_to_head(servers: Servers) -> None:
    actual = dump_schema(servers.database_url(servers.template))
    drift = differences(SCHEMA_FILE.read_text(), actual)
    assert not drift, (
        "schema/database.sql is stale; run `make schema` (agent-engine export-schema --database)"
        " and commit it:\n" + "\n".join(drift)
    )


def test_every_trigger_function_has_its_current_body_in_the_file() -> None:
    found = objects(SCHEMA_FILE.read_text())
    for name in (
        "agent_runs_on_finish",
        "agent_runs_cost_at_finish",
        "agent_runs_token_split",
        "agent_runs_notify",
        "agent_run_steps_notify",
        "budget_alerts_notify",
        "audit_log_append_only",
        "agents_clear_next_run_at",
        "agents_touch_updated_at",
    ):
        body = found[f"FUNCTION {name}()"]
        assert f"CREATE FUNCTION public.{name}()" in body


def test_a_drift_names_the_object_that_differs() -> None:
    current = SCHEMA_FILE.read_text()
    edited = current.replace("RETURN NULL;", "RETURN NEW;", 1)
    first = next(name for name, body in objects(current).items() if "RETURN NULL;" in body)
    assert differences(current, edited) == [f"{first}: differs"]


def test_export_refuses_a_database_behind_the_latest_migration(servers: Servers) -> None:
    url = asyncio.run(empty_database(servers, f"{servers.prefix}_behind"))
    with pytest.raises(SchemaExportError, match="run `agent-engine migrate` first"):
        dump_schema(url)
    upgrade(url, "e0005_operators")
    with pytest.raises(SchemaExportError, match=r"it has e0005_operators; it lacks e00\d\d_"):
        dump_schema(url)


def test_export_names_an_unreachable_database() -> None:
    with pytest.raises(SchemaExportError, match="cannot connect to DATABASE_URL"):
        dump_schema("postgresql://nobody@127.0.0.1:1/none")
