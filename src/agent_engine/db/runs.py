"""`agent_runs`, the run journal: the statements of a run's life, by the step that runs them.

Request (`runs/request.py`, `runs/journal.py`, `runs/scheduler.py`), claim and start, heartbeat
and finish (`runs/claim.py`, `runs/finish.py`), cancel (`runs/cancel.py`), reaper
(`runs/reaper.py`). Every write after the request is a compare-and-set on the run's state.

The row and the API's reads live in `db/run_reads.py` (re-exported here).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Row, text

from agent_engine.db.platform import STORED_PLATFORM
from agent_engine.db.run_reads import ACTIVE_RUNS as ACTIVE_RUNS
from agent_engine.db.run_reads import LAST_FINISHED_RUNS as LAST_FINISHED_RUNS
from agent_engine.db.run_reads import RETRIES_OF_RUNS as RETRIES_OF_RUNS
from agent_engine.db.run_reads import RUN_OWNER as RUN_OWNER
from agent_engine.db.run_reads import RUNS_BY_ID as RUNS_BY_ID
from agent_engine.db.run_reads import RunRow as RunRow
from agent_engine.db.run_reads import active_and_last_runs as active_and_last_runs
from agent_engine.db.run_reads import active_and_last_runs_sql as active_and_last_runs_sql
from agent_engine.db.run_reads import active_runs as active_runs
from agent_engine.db.run_reads import journal_page as journal_page
from agent_engine.db.run_reads import last_finished_runs as last_finished_runs
from agent_engine.db.run_reads import narrow_run_columns as narrow_run_columns
from agent_engine.db.run_reads import retries_of_runs as retries_of_runs
from agent_engine.db.run_reads import run_owner as run_owner
from agent_engine.db.run_reads import run_pages as run_pages
from agent_engine.db.run_reads import runs_by_id as runs_by_id
from agent_engine.db.run_reads import split_active_and_last as split_active_and_last
from agent_engine.db.run_steps import FINISH_STEP_CTE, FIRST_STEP_INSERT
from agent_engine.db.spend import agent_week_tokens, owner_week_tokens

# --- request ------------------------------------------------------------------------------------

# KEY SHARE (the lock the run's FK check takes anyway, now from the gate check on) holds the agent
# until the journal insert commits: a concurrent deleteAgent (FOR UPDATE) waits for this start,
# or this start waits for it and then finds no live agent. The scheduler's claim (NO KEY UPDATE)
# is not blocked by it.
AGENT_GATE = text(
    "SELECT id, user_id, enabled, admin_paused, model_id IS NOT NULL AS has_model,"
    " weekly_token_cap"
    " FROM agents WHERE id = :agent_id AND deleted_at IS NULL FOR KEY SHARE"
)

# ON CONFLICT names the partial index by its columns and predicate: the refused rows are simply
# not returned, with no exception and no aborted transaction.
# `model_id` records the model the run is queued for: a model's limit counts its runs, and its
# waiting runs are found oldest first by it (the claim refreshes it if the owner switched models).
INSERT_QUEUED = text(
    "INSERT INTO agent_runs (agent_id, model_id, trigger, state, tokens_used, created_at,"
    " retry_of)"
    " SELECT t.agent_id, a.model_id, :trigger, 'queued', 0,"
    " COALESCE(CAST(:now AS timestamptz), now()), CAST(:retry_of AS bigint)"
    " FROM unnest(CAST(:agent_ids AS bigint[])) AS t(agent_id)"
    " JOIN agents a ON a.id = t.agent_id"
    " ORDER BY t.agent_id"
    " ON CONFLICT (agent_id) WHERE state IN ('queued', 'running') DO NOTHING"
    " RETURNING *"
)


def _under_cap(owner: str) -> str:
    """SQL: the owner's week (`:start`/`:end`) is under `:cap` (always, without a cap); `owner`
    names the owner's id in the enclosing statement. The one-statement request and claim."""
    return (
        "CASE WHEN CAST(:cap AS bigint) IS NULL THEN true ELSE "
        + owner_week_tokens(owner)
        + " < CAST(:cap AS bigint) END"
    )


def _agent_under_cap(agent: str, cap: str) -> str:
    """SQL: the agent's own week (`:start`/`:end`) is under its cap `cap` (always, without one);
    `agent` and `cap` name the agent's id and `weekly_token_cap` in the enclosing statement."""
    return f"({cap} IS NULL OR " + agent_week_tokens(agent) + f" < {cap})"


# A manual request in one statement (autocommit, no BEGIN/COMMIT): the gate read with its KEY
# SHARE lock (as `AGENT_GATE`), and the queued row (as `INSERT_QUEUED`) when the gate is open, the
# platform settings are the ones the caller expects (`:platform`, from which it computed `:cap` and
# the budget week `:start`/`:end`) and the owner's week is under the cap. The gate and the stored
# settings come back either way, the run's columns NULL when nothing was inserted: the gate is
# closed (the caller refuses, nothing written), or the transaction (`AGENT_GATE` …) decides
# what to journal — budget spent, a run already unfinished, settings changed since.
REQUEST_AT_ONCE = text(
    "WITH g AS (SELECT id, user_id, enabled, admin_paused, model_id, weekly_token_cap FROM agents"
    " WHERE id = :agent_id AND deleted_at IS NULL FOR KEY SHARE),"
    " stored AS (SELECT " + STORED_PLATFORM + " AS platform),"
    " queued AS (INSERT INTO agent_runs (agent_id, model_id, trigger, state, tokens_used,"
    " created_at)"
    " SELECT g.id, g.model_id, :trigger, 'queued', 0, COALESCE(CAST(:now AS timestamptz), now())"
    " FROM g, stored WHERE g.enabled AND NOT g.admin_paused AND g.model_id IS NOT NULL"
    " AND stored.platform = CAST(:platform AS jsonb)"
    " AND "
    + _under_cap("g.user_id")
    + " AND "
    + _agent_under_cap("g.id", "g.weekly_token_cap")
    + " ON CONFLICT (agent_id) WHERE state IN ('queued', 'running') DO NOTHING RETURNING *)"
    # The gate as `AGENT_GATE` names it (no column of agent_runs has these names).
    " SELECT g.enabled, g.admin_paused, g.model_id IS NOT NULL AS has_model, stored.platform,"
    " queued.*"
    " FROM g CROSS JOIN stored LEFT JOIN queued ON true"
)

# Skipped rows are terminal at once: no loop ran (tokens 0, started_at NULL), and finished_at
# shows in the journal when the engine refused.
INSERT_SKIPPED = text(
    "INSERT INTO agent_runs"
    " (agent_id, trigger, state, reason, tokens_used, finished_at, created_at)"
    " SELECT t.agent_id, :trigger, 'skipped', t.reason, 0,"
    " COALESCE(CAST(:now AS timestamptz), now()), COALESCE(CAST(:now AS timestamptz), now())"
    " FROM unnest(CAST(:agent_ids AS bigint[]), CAST(:reasons AS text[])) AS t(agent_id, reason)"
    " RETURNING *"
)

# --- the schedule tick ----------------------------------------------------------------------------

# The gate is repeated here although the trigger keeps next_run_at NULL for closed agents: the
# claim must never start a locked agent, whatever wrote the row. NO KEY UPDATE (not UPDATE): the
# FK check of a concurrent manual start's INSERT takes KEY SHARE on the agent; FOR UPDATE would
# block it while it holds the unfinished-run index entry we wait for — a deadlock.
CLAIM_DUE_AGENTS = text(
    "SELECT a.id, a.user_id, a.next_run_at, CAST(a.schedule AS text) AS schedule,"
    " u.timezone AS owner_timezone"
    " FROM agents a JOIN users u ON u.id = a.user_id"
    " WHERE a.next_run_at <= :now"
    " AND a.enabled AND NOT a.admin_paused AND a.model_id IS NOT NULL"
    " ORDER BY a.next_run_at"
    " LIMIT :batch_size"
    " FOR NO KEY UPDATE OF a SKIP LOCKED"
)

ADVANCE_SLOTS = text(
    "UPDATE agents AS a SET next_run_at = t.next_run_at"
    " FROM unnest(CAST(:agent_ids AS bigint[]), CAST(:next_run_ats AS timestamptz[]))"
    " AS t(agent_id, next_run_at)"
    " WHERE a.id = t.agent_id"
)


@dataclass(frozen=True, slots=True)
class DueAgent:
    """An agent `CLAIM_DUE_AGENTS` claimed: its slot fired, its schedule as stored JSON."""

    agent_id: int
    owner_id: int
    fired_slot: datetime
    schedule_json: str | None
    owner_timezone: str | None

    @classmethod
    def from_row(cls, row: Row[Any]) -> DueAgent:
        return cls(
            agent_id=int(row.id),
            owner_id=int(row.user_id),
            fired_slot=row.next_run_at,
            schedule_json=row.schedule,
            owner_timezone=row.owner_timezone,
        )


# --- the run's context --------------------------------------------------------------------------

# Run → agent → owner, model, allowed tool selection and the platform settings, for
# `runtime.context.run_context_from_row`. The worker's claim selects the same columns in its own
# locking read (`CLAIM_READ`): no second statement.
CONTEXT_COLUMNS = (
    """
    r.id AS run_id, a.id AS agent_id, a.name AS agent_name, a.user_id AS owner_id, a.prompt,
    a.weekly_token_cap, a.max_tokens_per_run, r.retry_of,
    u.timezone AS owner_timezone,
    m.provider, m.model, m.base_url, m.api_key_env, m.name AS model_name,
    ARRAY(
        SELECT t.name FROM agent_tools at JOIN tools t ON t.id = at.tool_id
        WHERE at.agent_id = a.id AND t.agents_allowed
        ORDER BY t.name
    ) AS tool_names,
    (SELECT coalesce(jsonb_agg(jsonb_build_object(
        'id', t.id, 'name', t.name, 'description', t.description,
        'input_schema', t.input_schema, 'access', t.access, 'remote_name', t.remote_name,
        'source', s.name, 'url', s.url, 'auth_env', s.auth_env,
        'auth', s.auth, 'source_id', s.id,
        'auto_approved', at.auto_approved) ORDER BY t.name), '[]'::jsonb)
     FROM agent_tools at JOIN tools t ON t.id = at.tool_id
     JOIN tool_sources s ON s.id = t.source_id
     WHERE at.agent_id = a.id AND t.agents_allowed AND s.enabled) AS mcp_tools,
    """
    + STORED_PLATFORM
    + """ AS platform
"""
)
CONTEXT_FROM = """
    FROM agent_runs r
    JOIN agents a ON a.id = r.agent_id
    LEFT JOIN users u ON u.id = a.user_id
    LEFT JOIN agent_models m ON m.id = a.model_id
    WHERE r.id = :run_id
"""
LOAD_CONTEXT = text("SELECT" + CONTEXT_COLUMNS + CONTEXT_FROM)

# The `previous_output` tool: the agent's newest successful run other than this one.
PREVIOUS_OUTPUT = text(
    "SELECT output, finished_at FROM agent_runs"
    " WHERE agent_id = :agent_id AND state = 'succeeded' AND id <> :run_id"
    " ORDER BY id DESC LIMIT 1"
)

# --- claim and start ------------------------------------------------------------------------------

# With the platform settings and the run's whole context: the claim is one checkout and one read
# (round trips per run are most of the worker's cost against a fast model).
_CLAIM_SELECT = (
    "SELECT r.state, a.enabled, a.admin_paused, a.model_id IS NOT NULL AS has_model,"
    " a.model_id AS agent_model_id, r.model_id AS run_model_id, m.max_concurrent_runs,"
    + CONTEXT_COLUMNS
    + CONTEXT_FROM
    + " FOR UPDATE OF r"
)
CLAIM_READ = text(_CLAIM_SELECT)

# What a start writes besides the run's model (`model_id = …`): here and in `CLAIM_AT_ONCE`. With
# tracing on, `:trace_parent` is the run's span's (started before the claim, runs/run_trace.py):
# the start saves it, so tracing costs the run no statement of its own; NULL (off) changes nothing.
_STARTED = (
    "UPDATE agent_runs SET state = 'running', started_at = now(), heartbeat_at = now(),"
    " trace_parent = COALESCE(agent_runs.trace_parent, CAST(:trace_parent AS text)),"
)
# The start also writes the run's first step (every run opens with a model call), so a one-call
# run's transcript costs no statement of its own (see runs/steps.py).
START = text(
    "WITH started AS (" + _STARTED + " model_id = :model_id"
    " WHERE id = :run_id AND state = 'queued' RETURNING id, CAST(:model AS text) AS model) "
    + FIRST_STEP_INSERT
)

# The claim of the common case in one statement (autocommit, no BEGIN/COMMIT): queued → running
# with its first step, when the gate is open, the model has no concurrency limit, the platform
# settings are the ones the caller expects (`:platform`, from which it computed `:cap` and the
# budget week `:start`/`:end`) and the owner's week is under the cap. Otherwise nothing
# is written and the caller claims in a transaction (`CLAIM_READ` …), which settles every other
# case.
# The row comes back either way (`CLAIM_READ`'s), with `started` saying whether this statement
# started the run.
CLAIM_AT_ONCE = text(
    "WITH c AS (" + _CLAIM_SELECT + "),"
    " started AS (" + _STARTED + " model_id = c.agent_model_id FROM c"
    " WHERE agent_runs.id = :run_id AND agent_runs.state = 'queued'"
    " AND c.enabled AND NOT c.admin_paused AND c.has_model AND c.max_concurrent_runs IS NULL"
    " AND c.platform = CAST(:platform AS jsonb)"
    " AND "
    + _under_cap("c.owner_id")
    + " AND "
    + _agent_under_cap("c.agent_id", "c.weekly_token_cap")
    + " RETURNING agent_runs.id, c.model),"
    " first_step AS (" + FIRST_STEP_INSERT + ")"
    " SELECT c.*, EXISTS (SELECT 1 FROM started) AS started FROM c"
)

# A run left waiting joins its model's line (the owner may have switched models since the request).
REQUEUE_FOR_MODEL = text(
    "UPDATE agent_runs SET model_id = :model_id WHERE id = :run_id AND state = 'queued'"
)

SKIP_AT_CLAIM = text(
    "UPDATE agent_runs SET state = 'skipped', reason = :reason, tokens_used = 0,"
    " finished_at = :now"
    " WHERE id = :run_id AND state = 'queued'"
)

FAIL_AT_CLAIM = text(
    "UPDATE agent_runs SET state = 'failed', reason = :reason, error = :error, finished_at = :now"
    " WHERE id = :run_id AND state = 'queued'"
)

# --- heartbeat and finish -----------------------------------------------------------------------

HEARTBEAT = text(
    "UPDATE agent_runs SET heartbeat_at = now(), tokens_used = GREATEST(tokens_used, :tokens),"
    " prompt_tokens = GREATEST(prompt_tokens, :prompt_tokens),"
    " completion_tokens = GREATEST(completion_tokens, :completion_tokens)"
    " WHERE id = :run_id AND state = 'running'"
)


def _trigger_setting(name: str, type_: str) -> str:
    """SQL: a value a trigger of this statement left in its transaction's settings
    (`agent_engine.<name>`, set_config(…, true)), as `type_`; NULL when none did."""
    return f"CAST(NULLIF(current_setting('agent_engine.{name}', true), '') AS {type_})"


# The finish also fixes the run's cost (`agent_runs_cost_at_finish` prices its tokens at the
# model's prices now), writes the step end the transcript still holds (`FINISH_STEP_CTE`), and the
# delivery outbox rows (`agent_runs_on_finish`, delivery/outbox.py); `agent_runs_notify` tells the
# api. The triggers' current bodies are in schema/database.sql.
FINISH = text(
    FINISH_STEP_CTE
    + "UPDATE agent_runs SET state = :state, reason = :reason, output = :output, error = :error,"
    " tokens_used = GREATEST(tokens_used, :tokens),"
    " prompt_tokens = GREATEST(prompt_tokens, :prompt_tokens),"
    " completion_tokens = GREATEST(completion_tokens, :completion_tokens),"
    " finished_at = now(), heartbeat_at = now()"
    " WHERE id = :run_id AND state = 'running'"
    # What the budget-alert check after the finish needs (runs/alerts.py): no second read. The
    # owner's week with this run, as the `budget_weeks` trigger read it under the week row's lock
    # (NULL when the run counted nothing).
    " RETURNING (SELECT a.user_id FROM agents a WHERE a.id = agent_runs.agent_id) AS owner_id,"
    " " + STORED_PLATFORM + " AS platform,"
    " " + _trigger_setting("week_start", "timestamptz") + " AS week_start,"
    " " + _trigger_setting("week_tokens", "bigint") + " AS week_tokens"
)

# --- cancel -------------------------------------------------------------------------------------

# The tokens so far: the heartbeat's count or the recorded model calls', whichever is larger (the
# database's `agent_runs_token_split` trigger then splits them as the recorded calls did).
# The database's clock: a cancel is written as it happens, whatever clock its request carried.
CANCEL = text(
    "UPDATE agent_runs SET state = 'failed', reason = 'cancelled', error = :error,"
    " finished_at = now(), parked_at = NULL, tokens_used = GREATEST(tokens_used,"
    "   (SELECT COALESCE(sum(prompt_tokens + completion_tokens), 0) FROM agent_run_steps"
    "    WHERE run_id = :run_id))"
    " WHERE id = :run_id AND state IN ('queued', 'running')"
    " RETURNING *"
)
NOTIFY = text("SELECT pg_notify(:channel, :payload)")
STATE_OF = text("SELECT state FROM agent_runs WHERE id = :run_id")
# Of the runs `:ids`, those no longer running.
NOT_RUNNING = text(
    "SELECT id FROM agent_runs WHERE id = ANY(CAST(:ids AS bigint[])) AND state <> 'running'"
)

# --- the reaper -----------------------------------------------------------------------------------

REAP_RUNNING = text(
    "UPDATE agent_runs SET state = 'failed', reason = 'stale', finished_at = now(),"
    " error = :error"
    " WHERE state = 'running' AND parked_at IS NULL"
    " AND COALESCE(heartbeat_at, started_at, created_at)"
    " < now() - make_interval(secs => :stale_after_seconds)"
    " RETURNING id"
)

# Whether a queued run belongs to a model with a concurrency limit (it may be waiting for a slot).
_OF_LIMITED_MODEL = (
    "EXISTS (SELECT 1 FROM agent_models m"
    " WHERE m.id = agent_runs.model_id AND m.max_concurrent_runs IS NOT NULL)"
)

REAP_QUEUED = text(
    "UPDATE agent_runs SET state = 'failed', reason = 'stale', finished_at = :now,"
    " error = :error"
    " WHERE state = 'queued' AND created_at < :cutoff AND NOT "
    + _OF_LIMITED_MODEL
    + " RETURNING id"
)

REAP_WAITING = text(
    "UPDATE agent_runs SET state = 'failed', reason = 'stale', finished_at = :now,"
    " error = :error"
    " WHERE state = 'queued' AND created_at < :cutoff AND " + _OF_LIMITED_MODEL + " RETURNING id"
)

# Due for a re-send when the time since the last send is at least the longer of `resend_after`
# and how long the run had waited at that send (the back-off doubles). SKIP LOCKED: a run being
# claimed right now needs no message, and concurrent reapers take different runs. Runs of a
# limited model are handed their slot by `runs.model_slots` instead.
CLAIM_RESENDS = text(
    "UPDATE agent_runs SET last_sent_at = :now WHERE id IN ("
    " SELECT id FROM agent_runs WHERE state = 'queued'"
    " AND CAST(:now AS timestamptz) - COALESCE(last_sent_at, created_at) >= GREATEST("
    "   CAST(:resend_after AS interval), COALESCE(last_sent_at, created_at) - created_at)"
    " AND NOT " + _OF_LIMITED_MODEL + " ORDER BY id LIMIT :limit FOR UPDATE SKIP LOCKED)"
    " RETURNING id"
)
