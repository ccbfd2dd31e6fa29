"""A page of agents' relations in one statement: their models, their tools, and each agent's
active and last finished run.

`catalog.models_by_id`, `catalog.tools_of_agents` and `runs.active_and_last_runs` read the same
rows in three statements: three round trips one after another on the page's critical path. Here
each kind comes back as an array of composite values in one row — table rows as their table's
type, which asyncpg decodes with the connection's own codecs (JSON included), and the tool
selections and narrow runs as anonymous records of plain columns (asyncpg cannot decode a
table's type inside an anonymous record). The typed rows are those the three statements read (a
test holds them equal, whole and narrow). A table's type that a migration changed while the api
runs is learned again and the read sent again, once.
"""

from __future__ import annotations

import functools
from collections.abc import Collection, Sequence
from typing import Any, NamedTuple, TypeVar

from asyncpg.exceptions import OutdatedSchemaCacheError
from sqlalchemy import TextClause, text
from sqlalchemy.ext.asyncio import AsyncConnection

from agent_engine.db import direct
from agent_engine.db import runs as runs_db
from agent_engine.db.catalog import AgentModelRow, ToolRow
from agent_engine.db.rows import read_rows
from agent_engine.db.runs import RunRow

R = TypeVar("R")


class Relations(NamedTuple):
    models: list[AgentModelRow]
    tools: list[tuple[int, ToolRow]]  # (agent id, tool), by tool name
    active_runs: list[RunRow]
    last_runs: list[RunRow]


@functools.lru_cache(maxsize=64)
def _statement(run_columns: tuple[str, ...] | None) -> TextClause:
    if run_columns is None:
        # Whole runs as their table's type: those the union picks, by id.
        picked = runs_db.active_and_last_runs_sql(("id",))
        runs = f"ARRAY(SELECT r FROM agent_runs r WHERE r.id IN (SELECT id FROM ({picked}) s))"
    else:
        listed = ", ".join(f"x.{column}" for column in run_columns)
        runs = (
            f"ARRAY(SELECT ROW({listed}) FROM ({runs_db.active_and_last_runs_sql(run_columns)}) x)"
        )
    return text(
        "SELECT"
        " ARRAY(SELECT m FROM agent_models m"
        "   WHERE m.id = ANY(CAST(:model_ids AS bigint[]))) AS models,"
        " ARRAY(SELECT t FROM tools t WHERE t.id IN"
        "   (SELECT tool_id FROM agent_tools WHERE agent_id = ANY(CAST(:ids AS bigint[])))"
        "   ORDER BY t.name) AS tools,"
        " ARRAY(SELECT ROW(at.agent_id, at.tool_id) FROM agent_tools at"
        "   WHERE at.agent_id = ANY(CAST(:ids AS bigint[]))) AS selected,"
        f" {runs} AS runs"
    )


async def page_relations(
    conn: AsyncConnection,
    agent_ids: Sequence[int],
    model_ids: Sequence[int],
    run_columns: Collection[str] | None = None,
) -> Relations:
    """The models of `model_ids`, the tools each agent of `agent_ids` selected and each one's
    active and last finished run (narrow rows of `run_columns` when given, as
    `runs.active_and_last_runs` reads them)."""
    chosen = runs_db.narrow_run_columns(run_columns)
    params = {"ids": list(agent_ids), "model_ids": list(model_ids)}
    try:
        ((models, tools, selected, runs),) = await direct.fetch(conn, _statement(chosen), params)
    except Exception as error:
        if not _outdated_types(error):
            raise
        # A migration changed a table's type since this connection learned it: asyncpg has
        # learned it again (`OutdatedSchemaCacheError`), and a read is safe to send again.
        ((models, tools, selected, runs),) = await direct.fetch(conn, _statement(chosen), params)
    selected_by: dict[int, list[int]] = {}
    for agent_id, tool_id in selected:
        selected_by.setdefault(tool_id, []).append(agent_id)
    pairs = [
        (agent_id, tool)
        for tool in _typed(tools, ToolRow)
        for agent_id in selected_by.get(tool.id, ())
    ]
    if chosen is None:
        run_rows = _typed(runs, RunRow)
    else:
        run_rows = read_rows(direct.Fetched(chosen, runs), RunRow, partial=True)
    active, last = runs_db.split_active_and_last(run_rows)
    return Relations(_typed(models, AgentModelRow), pairs, active, last)


def _typed(records: Sequence[Any], cls: type[R]) -> list[R]:
    """Composite values of a table's type (records named by its columns) as typed rows."""
    if not records:
        return []
    return read_rows(direct.Fetched(tuple(records[0].keys()), records), cls)


def _outdated_types(error: BaseException) -> bool:
    """Whether `error` is (or wraps, as SQLAlchemy's adapter does) asyncpg's word that a
    composite type it decoded has changed."""
    seen: BaseException | None = error
    for _ in range(8):  # a chain, not a cycle
        if seen is None:
            break
        if isinstance(seen, OutdatedSchemaCacheError):
            return True
        seen = seen.__cause__ or getattr(seen, "orig", None)
    return False
