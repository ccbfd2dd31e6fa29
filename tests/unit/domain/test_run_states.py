"""The run journal's states, reasons and transitions."""

from __future__ import annotations

import itertools
from datetime import timedelta

import pytest

from agent_engine.domain.runs import (
    ALLOWED_TRANSITIONS,
    HEARTBEAT_INTERVAL,
    REASONS_BY_STATE,
    STALE_AFTER,
    TERMINAL_STATES,
    UNFINISHED_STATES,
    InvalidTransition,
    RunReason,
    RunState,
    RunTrigger,
    can_transition,
    check_transition,
    reason_fits,
)

Q, R, S, F, K = (
    RunState.QUEUED,
    RunState.RUNNING,
    RunState.SUCCEEDED,
    RunState.FAILED,
    RunState.SKIPPED,
)
EDGES = {(Q, R), (Q, K), (Q, F), (R, S), (R, F)}


def test_values_are_the_stored_lower_case_codes() -> None:
    assert [s.value for s in RunState] == ["queued", "running", "succeeded", "failed", "skipped"]
    assert [t.value for t in RunTrigger] == ["manual", "scheduled"]
    assert [r.value for r in RunReason] == [
        "budget_exceeded",
        "already_running",
        "iteration_cap",
        "error",
        "stale",
        "cancelled",
    ]


def test_unfinished_and_terminal_states_partition_all_states() -> None:
    assert {Q, R} == UNFINISHED_STATES
    assert {S, F, K} == TERMINAL_STATES
    assert set(RunState) == UNFINISHED_STATES | TERMINAL_STATES


def test_allowed_transitions_are_exactly_the_design_edges() -> None:
    assert ALLOWED_TRANSITIONS == EDGES


@pytest.mark.parametrize(("src", "dst"), list(itertools.product(RunState, RunState)))
def test_every_other_transition_is_refused(src: RunState, dst: RunState) -> None:
    assert can_transition(src, dst) is ((src, dst) in EDGES)
    if (src, dst) in EDGES:
        check_transition(src, dst)
    else:
        with pytest.raises(InvalidTransition, match=f"from {src} to {dst}") as caught:
            check_transition(src, dst)
        assert isinstance(caught.value, ValueError)
        assert (caught.value.src, caught.value.dst) == (src, dst)


def test_terminal_states_never_move() -> None:
    for src, dst in itertools.product(TERMINAL_STATES, RunState):
        assert not can_transition(src, dst)


@pytest.mark.parametrize(
    ("state", "fitting"),
    [
        (K, {RunReason.BUDGET_EXCEEDED, RunReason.ALREADY_RUNNING}),
        (F, {RunReason.ITERATION_CAP, RunReason.ERROR, RunReason.STALE, RunReason.CANCELLED}),
        (Q, set()),
        (R, set()),
        (S, set()),
    ],
)
def test_reasons_fit_their_state(state: RunState, fitting: set[RunReason]) -> None:
    assert REASONS_BY_STATE[state] == fitting
    for reason in RunReason:
        assert reason_fits(state, reason) is (reason in fitting)
    # Skipped and failed rows must say why (the CHECK refuses NULL); the others must not.
    assert reason_fits(state, None) is (not fitting)


def test_staleness_is_three_missed_heartbeats() -> None:
    assert timedelta(seconds=30) == HEARTBEAT_INTERVAL
    assert timedelta(seconds=90) == STALE_AFTER
    assert STALE_AFTER == 3 * HEARTBEAT_INTERVAL
