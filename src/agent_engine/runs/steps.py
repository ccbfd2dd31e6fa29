"""Recording a run's transcript in `agent_run_steps` as the loop goes (DESIGN §10).

A step's row is inserted when it starts; its end (output, error, tokens) is written with the next
statement the run makes anyway -- the next step's insert or the run's finish. The opening model
call's row is inserted by the run's start statement itself, so a run with one model call costs no
statement more than a run without a transcript. Nothing slow happens
between a step's end and that next statement (the loop goes straight on), so a crash loses at most
the step in progress; a step still open when the run ends some other way (reaper, cancel) is closed
by the database's finish trigger.

Every write applies only while the run is `running`: the insert takes a share lock on the run
row, so it either lands before a concurrent cancel (which then closes it) or sees the run ended and
writes nothing; an end never overwrites a step the cancel already closed.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from datetime import datetime
from typing import Any

import asyncpg
from sqlalchemy.ext.asyncio import AsyncEngine

from agent_engine.runtime.transcript import StepEnd, StepKind

log = logging.getLogger(__name__)

NowFn = Callable[[], datetime]

# The end of the step before, if one is waiting; then the new step. One statement in autocommit,
# sent on the pooled connection's asyncpg driver directly: this is the one statement a run pays
# for its transcript, and SQLAlchemy's execution layer cost as much CPU as the round trip.
_START_SQL = (
    "WITH run AS (SELECT id FROM agent_runs WHERE id = $1 AND state = 'running' FOR SHARE),"
    " ended AS (UPDATE agent_run_steps SET output = $2, error = $3,"
    "   prompt_tokens = $4, completion_tokens = $5, finished_at = $6"
    "   WHERE run_id = (SELECT id FROM run) AND index = $7 AND finished_at IS NULL)"
    " INSERT INTO agent_run_steps (run_id, index, kind, name, input, started_at)"
    " SELECT id, $8, $9, $10, $11::jsonb, $12 FROM run"
)
# A dead pooled connection (database restart) is dropped from the pool rather than handed out
# again (the engine has no pre-ping).
_CONNECTION_ERRORS = (OSError, asyncpg.PostgresConnectionError, asyncpg.InterfaceError)

# For the run's finish statement (runs/execute.py): the step end still waiting, if any, written
# in the same statement as the finish and only if that finish applies (the run was running).
FINISH_STEP_CTE = (
    "WITH ended AS (UPDATE agent_run_steps SET output = :p_output, error = :p_error,"
    " prompt_tokens = :p_prompt, completion_tokens = :p_completion, finished_at = :p_finished"
    " WHERE run_id = :run_id AND index = :p_index AND finished_at IS NULL"
    " AND EXISTS (SELECT 1 FROM agent_runs WHERE id = :run_id AND state = 'running')) "
)

# For the run's start statement (runs/execute.py), after a CTE `started` that returns the run's
# id when it went running: the first step, the opening model call, in the same statement.
FIRST_STEP_INSERT = (
    "INSERT INTO agent_run_steps (run_id, index, kind, name, started_at)"
    " SELECT id, 0, 'model_call', COALESCE(:model, ''), :now FROM started"
)

NO_PENDING: dict[str, Any] = {
    "p_index": -1,
    "p_output": None,
    "p_error": None,
    "p_prompt": None,
    "p_completion": None,
    "p_finished": None,
}


class StepRecorder:
    """The `Transcript` of one run, written to `agent_run_steps`."""

    def __init__(
        self, engine: AsyncEngine, run_id: int, *, now_fn: NowFn, first_step_written: bool = False
    ) -> None:
        """`first_step_written`: the run's start already inserted step 0, its opening model
        call (`FIRST_STEP_INSERT`)."""
        self._engine = engine
        self._run_id = run_id
        self._now_fn = now_fn
        self._next_index = 0
        self._pending: dict[str, Any] | None = None
        self._first_step_written = first_step_written

    async def step_started(self, kind: StepKind, name: str, input: Any | None = None) -> int:
        index, self._next_index = self._next_index, self._next_index + 1
        if index == 0 and self._first_step_written and kind is StepKind.MODEL_CALL:
            return index
        ended = self.take_pending()
        try:
            async with self._engine.connect() as conn:
                raw = await conn.get_raw_connection()
                driver: asyncpg.Connection = raw.driver_connection
                try:
                    await driver.execute(
                        _START_SQL,
                        self._run_id,
                        ended["p_output"],
                        ended["p_error"],
                        ended["p_prompt"],
                        ended["p_completion"],
                        ended["p_finished"],
                        ended["p_index"],
                        index,
                        str(kind),
                        name,
                        None if input is None else json.dumps(input),
                        self._now_fn(),
                    )
                except _CONNECTION_ERRORS:
                    await conn.invalidate()
                    raise
        except Exception:
            # The transcript must not fail the run: a lost step shows as a gap in the indexes.
            log.warning("run %s: could not record step %d", self._run_id, index, exc_info=True)
        return index

    async def step_finished(self, index: int, end: StepEnd) -> None:
        self._pending = {
            "p_index": index,
            "p_output": end.output,
            "p_error": end.error,
            "p_prompt": end.prompt_tokens,
            "p_completion": end.completion_tokens,
            "p_finished": self._now_fn(),
        }

    def take_pending(self) -> dict[str, Any]:
        """The parameters of the step end still to write (`NO_PENDING` when there is none)."""
        pending, self._pending = self._pending, None
        return pending if pending is not None else dict(NO_PENDING)
