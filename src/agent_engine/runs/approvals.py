"""Write tools that wait for the owner: parking a run, the owner's decision, expiry, resuming.

A parked run stays `running` (it is still the agent's one unfinished run) but no worker holds it:
no in-flight place, no heartbeat, no slot of its model; the reaper and the wall-clock limit leave
it alone. The decision (or expiry, swept by the clock's reap tick) re-enqueues it; any worker
resumes it from the checkpoint — once its model has a free slot (`runs/model_slots.py`). Every
step is a compare-and-set in `db/approvals.py`.
"""

from __future__ import annotations

import logging

from sqlalchemy.ext.asyncio import AsyncEngine

from agent_engine.db import approvals as approvals_db
from agent_engine.db.approvals import ApprovalRow
from agent_engine.domain.mcp import ApprovalStatus
from agent_engine.runs import resume_gate
from agent_engine.runs.request import Enqueue
from agent_engine.runs.steps import StepRecorder
from agent_engine.runtime.loop import RunOutcome

log = logging.getLogger(__name__)

DEFAULT_APPROVAL_TIMEOUT_SECONDS = 24 * 3600.0
SWEEP_BATCH = 500
NOTE_MAX_CHARS = 1_000


class ApprovalMissing(Exception):
    pass


class ApprovalClosed(Exception):
    """The approval is no longer pending (decided, expired or cancelled)."""

    def __init__(self, status: str) -> None:
        super().__init__(f"the approval is already {status}")
        self.status = status


async def park_run(
    engine: AsyncEngine,
    run_id: int,
    outcome: RunOutcome,
    *,
    transcript: StepRecorder,
    timeout_seconds: float,
) -> ApprovalRow | None:
    """Checkpoint the run and create its approval (one transaction); None when the run was no
    longer running (cancelled meanwhile) or its agent may no longer run (the run ends here,
    `resume_gate.refuse_park`)."""
    parked = outcome.parked
    if parked is None:
        raise ValueError("not a parked outcome")
    step_end = transcript.take_pending()
    async with engine.begin() as conn:
        # An agent paused (or switched off, deleted...) while the run went on asks nobody.
        stop = await resume_gate.refuse_park(
            conn, run_id, step_end=step_end, step_index=parked.step_index
        )
        if stop is not None:
            return None
        approval = await approvals_db.park(
            conn,
            run_id,
            tokens=outcome.tokens_used,
            prompt_tokens=outcome.prompt_tokens,
            completion_tokens=outcome.completion_tokens,
            step_end=step_end,
            tool_id=parked.tool_id,
            tool_name=parked.tool_name,
            input=parked.input,
            step_index=parked.step_index,
            checkpoint=parked.checkpoint,
            timeout_seconds=timeout_seconds,
        )
    if approval is not None:
        log.info("run %s parked on approval %s (%s)", run_id, approval.id, parked.tool_name)
    return approval


async def decide(
    engine: AsyncEngine,
    approval_id: int,
    *,
    actor_id: int,
    approve: bool,
    note: str | None,
    enqueue: Enqueue,
) -> ApprovalRow:
    """PENDING -> APPROVED/DECLINED once; the parked run is sent to the workers at commit."""
    status = ApprovalStatus.APPROVED if approve else ApprovalStatus.DECLINED
    async with engine.begin() as conn:
        decided = await approvals_db.decide(
            conn, approval_id, status=str(status), actor_id=actor_id, note=note
        )
        if decided is None:
            current = await approvals_db.fetch(conn, approval_id)
            if current is None:
                raise ApprovalMissing(str(approval_id))
            raise ApprovalClosed(current.status)
        await approvals_db.notify(conn, decided)
    enqueue(decided.run_id)
    return decided


async def sweep(engine: AsyncEngine, *, enqueue: Enqueue, resend_after_seconds: float) -> int:
    """Expire overdue approvals and send their runs on (the model hears a decline); re-send the
    runs whose decision's message was lost — except a limited model's, which may wait for a slot
    on purpose: the reaper's slot pass sends those when there is one. Returns how many runs were
    sent."""
    async with engine.begin() as conn:
        expired = await approvals_db.expire_due(conn, limit=SWEEP_BATCH)
        for approval in expired:
            await approvals_db.notify(conn, approval)
    sent = {approval.run_id for approval in expired}
    async with engine.connect() as conn:
        stuck = await approvals_db.unresumed_runs(
            conn, after_seconds=resend_after_seconds, limit=SWEEP_BATCH
        )
    sent.update(stuck)
    for run_id in sorted(sent):
        enqueue(run_id)
    if expired:
        log.info("approvals: %d expired", len(expired))
    return len(sent)
