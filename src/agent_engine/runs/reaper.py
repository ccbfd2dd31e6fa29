"""The reaper: releases runs nobody is working on, re-sends messages nobody received.

- `running` with no heartbeat for `stale_after` → `failed`/`stale` (the worker died; the lock on
  the agent is released and its tokens so far count). Measured on the database's clock, the one
  the heartbeats are written with.
- `queued` and unclaimed → the execute message is sent again (Redis lost it, or the API could
  not send it), at most once per back-off window: `resend_after` after the first send, then each
  wait as long as the run had waited when it was last sent (R, 2R, 4R, … after `created_at`). A
  queue that is merely busy therefore gets a handful of duplicates per run, not one per tick, and
  `last_sent_at` is claimed by a compare-and-set, so several reapers send each once between them.
  Duplicates are harmless anyway: the claim is a compare-and-set.
- `queued` older than `fail_after` → `failed`/`stale`: nobody will run it any more.
- hidden (deleted) agents none of whose runs can count in a budget week any more are purged.

Runs of a model with a concurrency limit may be queued because they wait for a slot, with no
message in flight on purpose (`model_slots`): they are not re-sent blindly — the oldest of them
get a message when their model has free slots — and they wait up to `slot_wait`, not
`fail_after`, before they are failed as stale. The same pass sends the parked runs of such a
model whose approval was decided `resend_after` ago and that wait for a slot to resume (first,
within the free slots); they are never failed for waiting.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlalchemy.ext.asyncio import AsyncEngine

from agent_engine.agents.deletion import purge_hidden_agents
from agent_engine.db import runs as runs_sql
from agent_engine.domain.runs import STALE_AFTER
from agent_engine.runs import model_slots
from agent_engine.runs.request import Enqueue, send_after_commit

QUEUED_RESEND_AFTER = timedelta(seconds=60)
QUEUED_FAIL_AFTER = timedelta(hours=1)
# How long a queued run of a model with maxConcurrentRuns may wait for a slot.
MODEL_SLOT_WAIT = timedelta(hours=24)

# The most re-sends one tick makes (oldest first); the rest go out on the next ticks.
RESEND_LIMIT_PER_TICK = 1000


@dataclass(frozen=True)
class ReapResult:
    failed_running: list[int] = field(default_factory=list)
    failed_queued: list[int] = field(default_factory=list)
    resent: list[int] = field(default_factory=list)
    purged_agents: list[int] = field(default_factory=list)


async def reap_stale_runs(
    engine: AsyncEngine,
    *,
    now: datetime,
    stale_after: timedelta = STALE_AFTER,
    resend_after: timedelta = QUEUED_RESEND_AFTER,
    fail_after: timedelta = QUEUED_FAIL_AFTER,
    slot_wait: timedelta = MODEL_SLOT_WAIT,
    enqueue: Enqueue,
) -> ReapResult:
    async with engine.begin() as conn:
        running = await conn.execute(
            runs_sql.REAP_RUNNING,
            {
                "stale_after_seconds": stale_after.total_seconds(),
                "error": f"no heartbeat for {stale_after.total_seconds():g} s: the worker is gone",
            },
        )
        failed_running = sorted(int(r.id) for r in running)
        queued = await conn.execute(
            runs_sql.REAP_QUEUED,
            {
                "now": now,
                "cutoff": now - fail_after,
                "error": f"no worker claimed the run within {fail_after.total_seconds():g} s",
            },
        )
        waited = await conn.execute(
            runs_sql.REAP_WAITING,
            {
                "now": now,
                "cutoff": now - slot_wait,
                "error": f"the run waited {slot_wait.total_seconds():g} s for a slot of its model"
                " (its maxConcurrentRuns)",
            },
        )
        failed_queued = sorted([int(r.id) for r in queued] + [int(r.id) for r in waited])
        claimed = await conn.execute(
            runs_sql.CLAIM_RESENDS,
            {"now": now, "resend_after": resend_after, "limit": RESEND_LIMIT_PER_TICK},
        )
        resent = sorted(int(r.id) for r in claimed)
        # The slots of limited models that nobody handed on (a worker died between a finish and
        # the hand-on, or before the claim of a run others waited behind).
        resent += await model_slots.waiting_with_free_slots(conn, cutoff=now - resend_after)
        purged = await purge_hidden_agents(conn, now=now)
    await send_after_commit(enqueue, resent)
    return ReapResult(
        failed_running=failed_running,
        failed_queued=failed_queued,
        resent=resent,
        purged_agents=purged,
    )
