"""Recording a run's transcript in `agent_run_steps` as the loop goes.

A step's row is inserted when it starts; its end (output, error, tokens) is written with the next
statement the run makes anyway -- the next step's insert or the run's finish. The opening model
call's row is inserted by the run's start statement itself, so a run with one model call costs no
statement more than a run without a transcript. Nothing slow happens
between a step's end and that next statement (the loop goes straight on), so a crash loses at most
the step in progress; a step still open when the run ends some other way (reaper, cancel) is closed
by the database's finish trigger. The statements are `db/run_steps.py`'s.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime
from typing import Any

import asyncpg
from sqlalchemy.ext.asyncio import AsyncEngine

from agent_engine.db.activity import fallback_name
from agent_engine.db.run_steps import FALLBACK_STEP_END, NO_PENDING, START_STEP
from agent_engine.domain.storable import storable_json_dumps, storable_optional, storable_text
from agent_engine.runtime.transcript import StepEnd, StepKind

log = logging.getLogger(__name__)

NowFn = Callable[[], datetime]

# A dead pooled connection (database restart) is dropped from the pool rather than handed out
# again (the engine has no pre-ping).
_CONNECTION_ERRORS = (OSError, asyncpg.PostgresConnectionError, asyncpg.InterfaceError)


class StepRecorder:
    """The `Transcript` of one run, written to `agent_run_steps`."""

    def __init__(
        self,
        engine: AsyncEngine,
        run_id: int,
        *,
        now_fn: NowFn,
        first_step_written: bool = False,
        next_index: int = 0,
    ) -> None:
        """`first_step_written`: the run's start already inserted step 0, its opening model
        call (`db.run_steps.FIRST_STEP_INSERT`). `next_index`: a resumed run goes on after the
        steps it wrote before it was parked."""
        self._engine = engine
        self._run_id = run_id
        self._now_fn = now_fn
        self._next_index = next_index
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
                        START_STEP,
                        self._run_id,
                        ended["p_output"],
                        ended["p_error"],
                        ended["p_prompt"],
                        ended["p_completion"],
                        ended["p_finished"],
                        ended["p_index"],
                        index,
                        str(kind),
                        storable_text(name),
                        None if input is None else storable_json_dumps(input),
                        self._now_fn(),
                        ended["p_authority"],
                        ended["p_account"],
                    )
                except _CONNECTION_ERRORS:
                    await conn.invalidate()
                    raise
        except Exception:
            # The transcript must not fail the run: a lost step shows as a gap in the indexes.
            log.warning("run %s: could not record step %d", self._run_id, index, exc_info=True)
        return index

    async def step_finished(self, index: int, end: StepEnd) -> None:
        if end.fallback is not None:
            await self._fallback_finished(index, end)
            return
        self._pending = {
            "p_index": index,
            # What a model or tool sent; a NUL in it would lose the step (`domain/storable.py`).
            "p_output": storable_optional(end.output),
            "p_error": storable_optional(end.error),
            "p_prompt": end.prompt_tokens,
            "p_completion": end.completion_tokens,
            "p_finished": self._now_fn(),
            "p_authority": end.authority,
            "p_account": None if end.account is None else storable_text(end.account),
        }

    async def _fallback_finished(self, index: int, end: StepEnd) -> None:
        """A model call a fallback answered: written now, not with the next statement, so the
        finish's cost trigger prices it at its own model (`db.run_steps.FALLBACK_STEP_END`)."""
        answer = end.fallback
        assert answer is not None
        hops = [fallback_name(hop.model, hop.fallback, hop.cause) for hop in answer.hops]
        try:
            async with self._engine.connect() as conn:
                raw = await conn.get_raw_connection()
                driver: asyncpg.Connection = raw.driver_connection
                try:
                    await driver.execute(
                        FALLBACK_STEP_END,
                        self._run_id,
                        storable_optional(end.output),
                        storable_optional(end.error),
                        end.prompt_tokens,
                        end.completion_tokens,
                        self._now_fn(),
                        storable_text(answer.name),
                        answer.model_id,
                        index,
                        hops,
                    )
                except _CONNECTION_ERRORS:
                    await conn.invalidate()
                    raise
        except Exception:
            log.warning("run %s: could not record step %d", self._run_id, index, exc_info=True)

    def take_pending(self) -> dict[str, Any]:
        """The parameters of the step end still to write (`NO_PENDING` when there is none)."""
        pending, self._pending = self._pending, None
        return pending if pending is not None else dict(NO_PENDING)
