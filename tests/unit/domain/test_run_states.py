"""The run journal's states and the reasons each state admits."""

from __future__ import annotations

from datetime import timedelta

import pytest

from agent_engine.domain.runs import (
    HEARTBEAT_INTERVAL,
    REASONS_BY_STATE,
    STALE_AFTER,
    TERMINAL_STATES,
    UNFINISHED_STATES,
    RunReason,
    RunState,
    RunTrigger,
)

Q, R, S, F, K = (
    RunState.QUEUED,
    RunState.RUNNING,
    RunState.SUCCEEDED,
    RunState.FAILED,
    RunState.SKIPPED,
)


def test_values_are_the_stored_lower_case_codes() -> None:
    assert [s.value for s in RunState] == ["queued", "running", "succeeded", "failed", "skipped"]
    assert [t.value for t in RunTrigger] == ["manual", "scheduled", "retry"]
    assert [r.value for r in RunReason] == [
        "budget_exceeded",
        "already_running",
        "iteration_cap",
        "error",
        "stale",
        "cancelled",
        "token_cap",
        "agent_budget_exceeded",
    ]


def test_unfinished_and_terminal_states_partition_all_states() -> None:
    assert {Q, R} == UNFINISHED_STATES
    assert {S, F, K} == TERMINAL_STATES
    assert set(RunState) == UNFINISHED_STATES | TERMINAL_STATES


@pytest.mark.parametrize(
    ("state", "fitting"),
    [
        (
            K,
            {
                RunReason.BUDGET_EXCEEDED,
                RunReason.ALREADY_RUNNING,
                RunReason.AGENT_BUDGET_EXCEEDED,
            },
        ),
        (
            F,
            {
                RunReason.ITERATION_CAP,
                RunReason.ERROR,
                RunReason.STALE,
                RunReason.CANCELLED,
                RunReason.TOKEN_CAP,
            },
        ),
        (Q, set()),
        (R, set()),
        (S, set()),
    ],
)
def test_reasons_fit_their_state(state: RunState, fitting: set[RunReason]) -> None:
    # The CHECK `reason_fits_state` is generated from this table; the database's refusals are
    # tested in tests/integration/db/test_invariants.py.
    assert REASONS_BY_STATE[state] == fitting


def test_staleness_is_three_missed_heartbeats() -> None:
    assert timedelta(seconds=30) == HEARTBEAT_INTERVAL
    assert timedelta(seconds=90) == STALE_AFTER
    assert STALE_AFTER == 3 * HEARTBEAT_INTERVAL
