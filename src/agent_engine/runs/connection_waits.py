"""Runs that wait for their owner's account at an OWNER_OAUTH tool source (DESIGN §12).

A call of an OWNER_OAUTH tool whose owner has no CONNECTED account parks the run exactly like an
approval (`runs/approvals.py`): it stays `running`, no worker holds it, no slot of its model, the
conversation is checkpointed in a `connection_waits` row. The owner connecting (`on_connected`,
called by the OAuth callback) or the wait's expiry after AGENT_ENGINE_APPROVAL_TIMEOUT_SECONDS
(`sweep`, on the clock's reap tick) re-enqueues it; any worker resumes it from the checkpoint:
connected -> the call is made once, with the owner's token; expired -> the model hears that the
account is not connected. Cancelling the run, or its agent's gate closing, ends the wait
(`runs/cancel.py`, `runs/resume_gate.py`). Every step is a compare-and-set in
`db/connection_waits.py`.
"""

from __future__ import annotations

import logging

from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from agent_engine.db import connection_waits as waits_db
from agent_engine.db.connection_waits import WaitRow
from agent_engine.runs import resume_gate
from agent_engine.runs.request import Enqueue
from agent_engine.runs.steps import StepRecorder
from agent_engine.runtime.loop import RunOutcome

log = logging.getLogger(__name__)

SWEEP_BATCH = 500


# How `on_connected` sends a run to the workers when its caller passes no `enqueue` (the OAuth
# callback): the process's broker, registered by `workers.broker.configure_broker`.
_sender: Enqueue | None = None


def use_sender(enqueue: Enqueue | None) -> None:
    global _sender
    _sender = enqueue


async def park_run(
    engine: AsyncEngine,
    run_id: int,
    outcome: RunOutcome,
    *,
    transcript: StepRecorder,
    timeout_seconds: float,
) -> WaitRow | None:
    """Checkpoint the run and create its connection wait (one transaction); None when the run
    was no longer running (cancelled meanwhile) or its agent may no longer run (the run ends
    here, `resume_gate.refuse_park`)."""
    parked = outcome.parked
    if parked is None or parked.source_id is None:
        raise ValueError("not a connection park")
    step_end = transcript.take_pending()
    async with engine.begin() as conn:
        stop = await resume_gate.refuse_park(
            conn, run_id, step_end=step_end, step_index=parked.step_index
        )
        if stop is not None:
            return None
        wait = await waits_db.park(
            conn,
            run_id,
            tokens=outcome.tokens_used,
            prompt_tokens=outcome.prompt_tokens,
            completion_tokens=outcome.completion_tokens,
            step_end=step_end,
            source_id=parked.source_id,
            source_name=parked.source or str(parked.source_id),
            tool_id=parked.tool_id,
            tool_name=parked.tool_name,
            step_index=parked.step_index,
            checkpoint=parked.checkpoint,
            timeout_seconds=timeout_seconds,
        )
    if wait is not None:
        log.info(
            "run %s parked on connection wait %s (%s at %s)",
            run_id,
            wait.id,
            parked.tool_name,
            wait.source_name,
        )
    return wait


async def on_connected(
    engine_or_conn: AsyncEngine | AsyncConnection,
    owner_id: int,
    source_id: int,
    *,
    enqueue: Enqueue | None = None,
) -> list[int]:
    """The owner connected their account at the source: every run of theirs parked on it goes
    on, sent to the workers once committed (given a connection: in its transaction, sent when
    it commits). `enqueue`: the process's broker by default (`use_sender`); without one the
    clock's sweep re-sends them. Returns the runs."""
    send = enqueue or _sender or _left_to_the_sweep
    if isinstance(engine_or_conn, AsyncEngine):
        async with engine_or_conn.begin() as conn:
            waits = await waits_db.connect(conn, owner_id=owner_id, source_id=source_id)
        run_ids = sorted({wait.run_id for wait in waits})
        for run_id in run_ids:
            send(run_id)
    else:
        waits = await waits_db.connect(engine_or_conn, owner_id=owner_id, source_id=source_id)
        run_ids = sorted({wait.run_id for wait in waits})
        if run_ids:
            # Sent once the caller's transaction commits (a worker must find the wait resolved).
            def sent_at_commit(_: object) -> None:
                for run_id in run_ids:
                    send(run_id)

            sync = engine_or_conn.sync_connection
            if sync is not None:
                event.listen(sync, "commit", sent_at_commit, once=True)
    if run_ids:
        log.info("owner %s connected source %s: resuming runs %s", owner_id, source_id, run_ids)
    return run_ids


def _left_to_the_sweep(run_id: int) -> None:
    log.warning("run %s resumes at the clock's sweep: this process has no broker", run_id)


async def sweep(engine: AsyncEngine, *, enqueue: Enqueue, resend_after_seconds: float) -> int:
    """Expire overdue waits and send their runs on (the model hears the account is not
    connected); re-send the runs whose resume message was lost. Returns how many runs were
    sent."""
    async with engine.begin() as conn:
        expired = await waits_db.expire_due(conn, limit=SWEEP_BATCH)
    sent = {wait.run_id for wait in expired}
    async with engine.connect() as conn:
        stuck = await waits_db.unresumed_runs(
            conn, after_seconds=resend_after_seconds, limit=SWEEP_BATCH
        )
    sent.update(stuck)
    for run_id in sorted(sent):
        enqueue(run_id)
    if expired:
        log.info("connection waits: %d expired", len(expired))
    return len(sent)
