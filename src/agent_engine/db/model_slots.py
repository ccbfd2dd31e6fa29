"""A model's concurrency slots (`agent_models.max_concurrent_runs`) over the run journal: the
model's row lock that serialises its claims, its occupancy, its runs waiting for a slot.
"""

from __future__ import annotations

from sqlalchemy import text

# A separate statement from the count: in READ COMMITTED the count must run after the lock is
# held, with a new snapshot that sees the claims committed by the previous holder.
LOCK_MODEL = text(
    "SELECT max_concurrent_runs FROM agent_models WHERE id = :model_id FOR NO KEY UPDATE"
)

# Both counts read the small partial index on unfinished runs. `ahead` stops at the limit.
OCCUPANCY = text(
    "SELECT"
    " (SELECT count(*) FROM agent_runs WHERE model_id = :model_id AND state = 'running'"
    "  AND parked_at IS NULL)"
    " AS running,"
    " (SELECT count(*) FROM (SELECT 1 FROM agent_runs"
    "   WHERE model_id = :model_id AND state = 'queued' AND id < :run_id"
    "   ORDER BY id LIMIT :limit) AS older) AS ahead"
)

# The oldest queued runs of the model, as many as it has free slots; none for a model without a
# limit (its runs never wait for a slot, their own messages are on the way).
NEXT_WAITING = text(
    "SELECT id FROM agent_runs"
    " WHERE model_id = :model_id AND state = 'queued'"
    " ORDER BY id"
    " LIMIT GREATEST(COALESCE("
    "   (SELECT max_concurrent_runs FROM agent_models WHERE id = :model_id)"
    "   - (SELECT count(*) FROM agent_runs WHERE model_id = :model_id AND state = 'running'"
    "      AND parked_at IS NULL),"
    "   0), 0)"
)

# A lifted limit: every queued run of the model may start.
ALL_WAITING = text(
    "SELECT id FROM agent_runs WHERE model_id = :model_id AND state = 'queued' ORDER BY id"
)

# The reaper's pass over every limited model: the oldest queued runs older than :cutoff, up to
# each model's free slots.
WAITING_WITH_FREE_SLOTS = text(
    "SELECT w.id FROM agent_models m"
    " CROSS JOIN LATERAL (SELECT count(*) AS n FROM agent_runs r"
    "   WHERE r.model_id = m.id AND r.state = 'running' AND parked_at IS NULL) AS busy"
    " CROSS JOIN LATERAL (SELECT r.id FROM agent_runs r"
    "   WHERE r.model_id = m.id AND r.state = 'queued' AND r.created_at < :cutoff"
    "   ORDER BY r.id LIMIT GREATEST(m.max_concurrent_runs - busy.n, 0)) AS w"
    " WHERE m.max_concurrent_runs IS NOT NULL"
    " ORDER BY w.id"
)
