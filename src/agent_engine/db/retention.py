"""Run retention's statements: one pruning batch, and the session advisory lock that keeps one
pass at a time across the cluster (`runs/retention.py` says which runs go and which stay).
"""

from __future__ import annotations

from sqlalchemy import text

# The candidates finished before :cutoff after the cursor (:after_at, :after_id), in
# (finished_at, id) order; of those, the runs their agent does not keep (its newest finished run,
# its newest successful run) are deleted. Returns the counts and the cursor for the next batch.
PRUNE_BATCH = text(
    """
    WITH candidates AS (
        SELECT id, agent_id, state, finished_at FROM agent_runs
        WHERE finished_at < :cutoff
          AND finished_at >= :after_at AND (finished_at, id) > (:after_at, :after_id)
          AND state IN ('succeeded', 'failed', 'skipped')
        ORDER BY finished_at, id
        LIMIT :batch
    ), doomed AS (
        SELECT c.id FROM candidates c
        WHERE EXISTS (
                SELECT 1 FROM agent_runs n
                WHERE n.agent_id = c.agent_id AND n.id > c.id
                  AND n.state IN ('succeeded', 'failed', 'skipped'))
          AND (c.state <> 'succeeded' OR EXISTS (
                SELECT 1 FROM agent_runs n
                WHERE n.agent_id = c.agent_id AND n.id > c.id AND n.state = 'succeeded'))
    ), deleted AS (
        DELETE FROM agent_runs r USING doomed d WHERE r.id = d.id RETURNING r.id
    ), last AS (
        SELECT finished_at, id FROM candidates ORDER BY finished_at DESC, id DESC LIMIT 1
    )
    SELECT (SELECT count(*) FROM candidates) AS scanned,
           (SELECT count(*) FROM deleted) AS deleted,
           (SELECT finished_at FROM last) AS last_at,
           (SELECT id FROM last) AS last_id
    """
)

TRY_LOCK = text("SELECT pg_try_advisory_lock(:key)")
UNLOCK = text("SELECT pg_advisory_unlock(:key)")
