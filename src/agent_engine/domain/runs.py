"""The run journal's state machine (docs/architecture.md §4), as stored in `agent_runs`.

    queued -> running -> succeeded | failed
    queued -> skipped            (budget spent when a worker claims the run)
    queued -> failed (stale)     (nobody picked it up)
    queued | running -> failed (cancelled)   (cancelRun)

`skipped` rows may also be inserted directly (runtime gate closed at request time). The
transitions exist only as compare-and-sets in the database (`db/runs.py`: each UPDATE names the
state it moves from), so no Python copy of them is kept; tests drive those statements. The enums
and `REASONS_BY_STATE` are the single source the CHECK constraints are generated from
(`db/models/runs.py`).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from enum import StrEnum
from types import MappingProxyType


class RunState(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    SKIPPED = "skipped"


class RunTrigger(StrEnum):
    MANUAL = "manual"
    SCHEDULED = "scheduled"
    RETRY = "retry"


class RunReason(StrEnum):
    BUDGET_EXCEEDED = "budget_exceeded"
    ALREADY_RUNNING = "already_running"
    ITERATION_CAP = "iteration_cap"
    ERROR = "error"
    STALE = "stale"
    CANCELLED = "cancelled"
    TOKEN_CAP = "token_cap"
    AGENT_BUDGET_EXCEEDED = "agent_budget_exceeded"


class RunStepKind(StrEnum):
    """What one step of a run's transcript was."""

    MODEL_CALL = "model_call"
    TOOL_CALL = "tool_call"


# The states covered by the one-unfinished-run-per-agent partial unique index.
UNFINISHED_STATES: frozenset[RunState] = frozenset({RunState.QUEUED, RunState.RUNNING})
TERMINAL_STATES: frozenset[RunState] = frozenset(
    {RunState.SUCCEEDED, RunState.FAILED, RunState.SKIPPED}
)

# Mirrors the `reason_fits_state` CHECK: skipped and failed need one of their reasons, the other
# states none.
REASONS_BY_STATE: Mapping[RunState, frozenset[RunReason]] = MappingProxyType(
    {
        RunState.QUEUED: frozenset(),
        RunState.RUNNING: frozenset(),
        RunState.SUCCEEDED: frozenset(),
        RunState.SKIPPED: frozenset(
            {RunReason.BUDGET_EXCEEDED, RunReason.ALREADY_RUNNING, RunReason.AGENT_BUDGET_EXCEEDED}
        ),
        RunState.FAILED: frozenset(
            {
                RunReason.ITERATION_CAP,
                RunReason.ERROR,
                RunReason.STALE,
                RunReason.CANCELLED,
                RunReason.TOKEN_CAP,
            }
        ),
    }
)


# The executing worker bumps heartbeat_at this often; the reaper fails a run silent for
# STALE_AFTER (three missed beats). Settings may override both for tests and operators.
HEARTBEAT_INTERVAL = dt.timedelta(seconds=30)
STALE_AFTER = dt.timedelta(seconds=90)
