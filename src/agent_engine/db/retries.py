"""A failed run's retry: the failed run read under its lock, whether it was retried already, which
of its WRITE calls were made, and its steps copied into the retry as reused steps. The rules that
use them live in `runs/retry.py`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Row, text
from sqlalchemy.ext.asyncio import AsyncConnection

# Locked: retries of one run wait for each other, so the later one sees the earlier one's retry
# (read by `RETRIED` after the lock, in a fresh snapshot) and is a CONFLICT rather than a skip.
# NO KEY UPDATE: the retry's own foreign key to it (KEY SHARE) does not wait for it.
FAILED_RUN = text(
    "SELECT id, agent_id, state, reason FROM agent_runs WHERE id = :id FOR NO KEY UPDATE"
)
RETRIED = text("SELECT EXISTS (SELECT 1 FROM agent_runs WHERE retry_of = :id)")
# The approvals of the failed run's WRITE calls: whether each call was ever made (or may have been).
CALLS_MADE = text(
    "SELECT step_index, call_started_at IS NOT NULL AS started FROM tool_approvals"
    " WHERE run_id = :run_id"
)
# The failed run's step (`:source`) as the retry's step `:index`, with the output and error the
# retry carries (an unknown outcome's), its fallback flag and answering model kept.
COPY_STEP = text(
    "INSERT INTO agent_run_steps (run_id, index, kind, name, input, output, error,"
    " prompt_tokens, completion_tokens, started_at, finished_at, fallback, model_id, reused)"
    " SELECT :run_id, :index, s.kind, s.name, s.input, :output, :error,"
    " s.prompt_tokens, s.completion_tokens, s.started_at, COALESCE(s.finished_at, s.started_at),"
    " s.fallback, s.model_id, true"
    " FROM agent_run_steps s WHERE s.run_id = :failed_id AND s.index = :source"
)


async def lock_failed_run(conn: AsyncConnection, run_id: int) -> Row[Any] | None:
    """The run's id, agent_id, state and reason, locked (`FAILED_RUN`); None when it is gone."""
    return (await conn.execute(FAILED_RUN, {"id": run_id})).one_or_none()


async def was_retried(conn: AsyncConnection, run_id: int) -> bool:
    """Whether the run has a retry already."""
    return bool((await conn.execute(RETRIED, {"id": run_id})).scalar_one())


async def calls_made(conn: AsyncConnection, run_id: int) -> dict[int, bool]:
    """Step index → whether the approved WRITE call of that step was started."""
    return {
        int(r.step_index): bool(r.started)
        for r in await conn.execute(CALLS_MADE, {"run_id": run_id})
    }


async def copy_steps(conn: AsyncConnection, steps: Sequence[dict[str, Any]]) -> None:
    """Copy the failed run's steps into the retry (`COPY_STEP`'s parameters, one per step)."""
    if steps:
        await conn.execute(COPY_STEP, list(steps))
