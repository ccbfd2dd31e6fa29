"""`agent_run_steps`: the statements that write a run's transcript, and its row type.

Every write applies only while the run is `running`: the insert takes a share lock on the run
row, so it either lands before a concurrent cancel (which then closes it) or sees the run ended
and writes nothing; an end never overwrites a step the cancel already closed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from agent_engine.db.rows import AnyRow, columns

# The end of the step before, if one is waiting; then the new step. Sent on the pooled
# connection's asyncpg driver directly (asyncpg placeholders): it is the one statement a run pays
# for its transcript, and SQLAlchemy's execution layer cost as much CPU as the round trip.
START_STEP = (
    "WITH run AS (SELECT id FROM agent_runs WHERE id = $1 AND state = 'running' FOR SHARE),"
    " ended AS (UPDATE agent_run_steps SET output = $2, error = $3,"
    "   prompt_tokens = $4, completion_tokens = $5, finished_at = $6,"
    "   authority = COALESCE($13, authority), account = COALESCE($14, account)"
    "   WHERE run_id = (SELECT id FROM run) AND index = $7 AND finished_at IS NULL)"
    " INSERT INTO agent_run_steps (run_id, index, kind, name, input, started_at)"
    " SELECT id, $8, $9, $10, $11::jsonb, $12 FROM run"
)

# A model call a fallback model answered: its end, its answering model (the step's new name and
# the model its tokens are priced at) and the fallback counters (`db/activity.fallback_name`,
# one per hop) in one statement, written at once rather than with the next statement, so the
# run's finish (whose cost trigger prices fallback steps apart) sees it. Asyncpg placeholders.
FALLBACK_STEP_END = (
    "WITH run AS (SELECT id FROM agent_runs WHERE id = $1 AND state = 'running' FOR SHARE),"
    " ended AS (UPDATE agent_run_steps SET output = $2, error = $3,"
    "   prompt_tokens = $4, completion_tokens = $5, finished_at = $6,"
    "   name = $7, fallback = true, model_id = $8"
    "   WHERE run_id = (SELECT id FROM run) AND index = $9 AND finished_at IS NULL)"
    " INSERT INTO engine_activity (name, count, last_at)"
    " SELECT hop, count(*), now() FROM unnest($10::text[]) AS hop GROUP BY hop"
    " ON CONFLICT (name) DO UPDATE"
    " SET count = engine_activity.count + EXCLUDED.count, last_at = EXCLUDED.last_at"
)

# The step end still waiting (`StepRecorder.take_pending()`'s parameters), written once.
END_PENDING_STEP = (
    "UPDATE agent_run_steps SET output = :p_output, error = :p_error,"
    " prompt_tokens = :p_prompt, completion_tokens = :p_completion, finished_at = :p_finished,"
    " authority = COALESCE(CAST(:p_authority AS text), authority),"
    " account = COALESCE(CAST(:p_account AS text), account)"
    " WHERE run_id = :run_id AND index = :p_index AND finished_at IS NULL"
)

# Opens the run's finish statement (`db.runs.FINISH`): the step end still waiting, if any,
# written in the same statement as the finish and only if that finish applies (the run was
# running).
FINISH_STEP_CTE = (
    f"WITH ended AS ({END_PENDING_STEP}"
    " AND EXISTS (SELECT 1 FROM agent_runs WHERE id = :run_id AND state = 'running')) "
)

# Closes the run's start statement (`db.runs.START`, `db.runs.CLAIM_AT_ONCE`), after a CTE
# `started` that returns the run's `id` and its `model` when it went running: the first step, the
# opening model call, in the same statement.
FIRST_STEP_INSERT = (
    "INSERT INTO agent_run_steps (run_id, index, kind, name, started_at)"
    " SELECT id, 0, 'model_call', COALESCE(model, ''), :now FROM started"
    # A retry's carried-over steps start at 0: its worker writes its first step after them.
    " ON CONFLICT (run_id, index) DO NOTHING"
)

# `FINISH_STEP_CTE`'s parameters when no step end is waiting (index -1 matches no step).
NO_PENDING: dict[str, Any] = {
    "p_index": -1,
    "p_output": None,
    "p_error": None,
    "p_prompt": None,
    "p_completion": None,
    "p_finished": None,
    "p_authority": None,
    "p_account": None,
}


@dataclass(frozen=True, slots=True)
class StepRow:
    run_id: int
    index: int
    kind: str
    name: str
    input: Any
    output: str | None
    error: str | None
    prompt_tokens: int | None
    completion_tokens: int | None
    started_at: datetime
    finished_at: datetime | None
    # A model call a fallback model answered (e0011_model_fallback).
    fallback: bool = False
    # Carried over from the failed run a retry continues (e0012_runs_recover).
    reused: bool = False
    # An MCP tool step: "none" | "shared" | "owner_oauth", and the owner's account (e0010).
    authority: str | None = None
    account: str | None = None

    @classmethod
    def from_row(cls, row: AnyRow) -> StepRow:
        m = columns(row)
        return cls(
            run_id=int(m["run_id"]),
            index=int(m["index"]),
            kind=m["kind"],
            name=m["name"],
            input=m["input"],
            output=m["output"],
            error=m["error"],
            prompt_tokens=m["prompt_tokens"],
            completion_tokens=m["completion_tokens"],
            started_at=m["started_at"],
            finished_at=m["finished_at"],
            fallback=bool(m.get("fallback", False)),
            reused=bool(m.get("reused", False)),
            authority=m.get("authority"),
            account=m.get("account"),
        )


STEPS_OF_RUNS = text(
    "SELECT * FROM agent_run_steps WHERE run_id = ANY(CAST(:ids AS bigint[]))"
    " ORDER BY run_id, index"
)


async def steps_of_runs(conn: AsyncConnection, run_ids: Sequence[int]) -> list[StepRow]:
    """The runs' transcripts, each in order."""
    rows = await conn.execute(STEPS_OF_RUNS, {"ids": list(run_ids)})
    return [StepRow.from_row(row) for row in rows.mappings()]
