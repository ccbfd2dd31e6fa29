"""A run's fallback chain: its agent's model, then that model's fallback, and so on.

Read by the worker (`runtime/fallback.py`) when a model call needs it, at most once per model
and `CHAIN_TTL_SECONDS`; the database keeps chains free of cycles (p0005_model_fallback), and
the walk stops at `MAX_CHAIN` models anyway.
"""

from __future__ import annotations

from sqlalchemy import text

MAX_CHAIN = 8

CHAIN_OF_RUN = text(
    "WITH RECURSIVE chain AS ("
    " SELECT m.*, 0 AS depth FROM agent_runs r JOIN agents a ON a.id = r.agent_id"
    "   JOIN agent_models m ON m.id = a.model_id WHERE r.id = :run_id"
    " UNION ALL"
    " SELECT m.*, chain.depth + 1 FROM chain JOIN agent_models m ON m.id = chain.fallback_model_id"
    "   WHERE chain.depth + 1 < :max_chain"
    ") SELECT id, name, provider, model, base_url, api_key_env FROM chain ORDER BY depth"
)
