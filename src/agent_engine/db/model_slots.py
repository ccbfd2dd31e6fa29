"""A model's concurrency slots (`agent_models.max_concurrent_runs`) over the run journal: the
model's row lock that serialises its claims, its occupancy, its runs waiting for a slot.

Two kinds of run wait for a slot: a `queued` run, and a parked run whose approval is decided (it
stays `running` with `parked_at` set until a claim admits its resume). The resumes go first: they
were admitted once already, before they parked.
"""

from __future__ import annotations

from sqlalchemy import text

# A separate statement from the count: in READ COMMITTED the count must run after the lock is
# held, with a new snapshot that sees the claims committed by the previous holder.
LOCK_MODEL = text(
    "SELECT max_concurrent_runs FROM agent_models WHERE id = :model_id FOR NO KEY UPDATE"
)
# The resume's lock: a model without a limit is neither locked nor counted (its resumes never
# wait for each other). The run's own model, not the agent's, so the claim's read cannot tell.
LOCK_LIMITED_MODEL = text(
    "SELECT max_concurrent_runs FROM agent_models"
    " WHERE id = :model_id AND max_concurrent_runs IS NOT NULL FOR NO KEY UPDATE"
)

# The runs holding a slot of model {model}: running, not parked.
_BUSY = (
    "SELECT count(*) FROM agent_runs"
    " WHERE model_id = {model} AND state = 'running' AND parked_at IS NULL"
)
# Parked runs of model {model} whose newest approval is decided (or whose connection wait ended,
# `db/connection_waits.py`): each waits for a slot to resume
# (`db.approvals.TAKE_PARKED`), ahead of the queued runs; the earliest decision first.
_DECIDED_PARKED = (
    "SELECT dp.id, dp.decided_at FROM ("
    " SELECT r.id, decision.decided_at FROM agent_runs r"
    " CROSS JOIN LATERAL (SELECT ap.status, ap.decided_at FROM tool_approvals ap"
    "   WHERE ap.run_id = r.id ORDER BY ap.id DESC LIMIT 1) AS decision"
    " WHERE r.model_id = {model} AND r.state = 'running' AND r.parked_at IS NOT NULL"
    " AND decision.status IN ('approved', 'declined', 'expired')"
    " AND NOT EXISTS (SELECT 1 FROM connection_waits w WHERE w.run_id = r.id"
    "   AND w.taken_at IS NULL AND w.status <> 'cancelled')"
    # Parked on the owner's connection, which came (or the wait expired): the same.
    " UNION ALL SELECT r.id, w.resolved_at FROM agent_runs r"
    " JOIN connection_waits w ON w.run_id = r.id AND w.taken_at IS NULL"
    " WHERE r.model_id = {model} AND r.state = 'running' AND r.parked_at IS NOT NULL"
    " AND w.status IN ('connected', 'expired')"
    ") AS dp WHERE TRUE"
)


def _waiting(model: str, *, limit: str | None, cutoff: str | None = None) -> str:
    """The runs of model `model` waiting for a slot, in the order they get one: the decided
    parked runs, then the queued runs oldest first; at most `limit` of them (None: all). With
    `cutoff`, only those waiting since before it (a newer one's own message is on the way)."""
    decided = _DECIDED_PARKED.format(model=model)
    queued = f"SELECT r.id FROM agent_runs r WHERE r.model_id = {model} AND r.state = 'queued'"
    if cutoff is not None:
        decided += f" AND dp.decided_at < {cutoff}"
        queued += f" AND r.created_at < {cutoff}"
    # Each branch is cut to `limit` first, so a long queue is read no further than the slots.
    bound = "" if limit is None else f" LIMIT {limit}"
    return (
        "SELECT waiting.id FROM ("
        f" (SELECT d.id, 0 AS line, d.decided_at AS since FROM ({decided}) AS d"
        f"   ORDER BY d.decided_at, d.id{bound})"
        " UNION ALL"
        f" (SELECT q.id, 1, CAST(NULL AS timestamptz) FROM ({queued} ORDER BY r.id{bound}) AS q)"
        f") AS waiting ORDER BY waiting.line, waiting.since, waiting.id{bound}"
    )


# Counted after LOCK_LIMITED_MODEL: may a decided parked run resume? Only the running runs count.
RUNNING = text(f"SELECT ({_BUSY.format(model=':model_id')}) AS running")

# Both counts read the small partial index on unfinished runs. `ahead` (the queued runs older than
# this one and the decided parked runs, which resume first) stops at the limit.
OCCUPANCY = text(
    "SELECT"
    f" ({_BUSY.format(model=':model_id')}) AS running,"
    " (SELECT count(*) FROM ("
    "   (SELECT 1 FROM agent_runs"
    "     WHERE model_id = :model_id AND state = 'queued' AND id < :run_id"
    "     ORDER BY id LIMIT :limit)"
    "   UNION ALL"
    f"  (SELECT 1 FROM ({_DECIDED_PARKED.format(model=':model_id')}) AS d LIMIT :limit)"
    " ) AS older) AS ahead"
)

# The model's waiting runs (decided parked runs first, then the oldest queued), as many as it has
# free slots; none for a model without a limit (its runs never wait for a slot, their own
# messages are on the way).
NEXT_WAITING = text(
    "WITH free AS (SELECT GREATEST(COALESCE("
    "   (SELECT max_concurrent_runs FROM agent_models WHERE id = :model_id)"
    f"  - ({_BUSY.format(model=':model_id')}),"
    "   0), 0) AS n) " + _waiting(":model_id", limit="(SELECT n FROM free)")
)

# A lifted limit: every waiting run of the model may start (or resume).
ALL_WAITING = text(_waiting(":model_id", limit=None))

# The reaper's pass over every limited model: its runs waiting since before :cutoff, up to each
# model's free slots (decided parked runs first).
WAITING_WITH_FREE_SLOTS = text(
    "SELECT w.id FROM agent_models m"
    f" CROSS JOIN LATERAL ({_BUSY.format(model='m.id')}) AS busy (n)"
    " CROSS JOIN LATERAL ("
    + _waiting("m.id", limit="GREATEST(m.max_concurrent_runs - busy.n, 0)", cutoff=":cutoff")
    + ") AS w"
    " WHERE m.max_concurrent_runs IS NOT NULL"
    " ORDER BY w.id"
)
