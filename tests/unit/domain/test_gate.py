"""The start gate and the derived agent status."""

from __future__ import annotations

import itertools

import pytest

from agent_engine.domain.gate import (
    LOCK_MESSAGES,
    RESUME_STOP_MESSAGES,
    AgentStatus,
    Lock,
    ResumeStop,
    agent_status,
    closed_lock,
    gate_open,
    resume_stop,
)

FLAGS = list(itertools.product([True, False], repeat=3))


def test_open_gate_needs_enabled_unpaused_and_a_model() -> None:
    assert gate_open(enabled=True, admin_paused=False, has_model=True)
    assert closed_lock(enabled=True, admin_paused=False, has_model=True) is None


@pytest.mark.parametrize(("enabled", "admin_paused", "has_model"), FLAGS)
def test_gate_is_open_exactly_when_no_lock_is_closed(
    enabled: bool, admin_paused: bool, has_model: bool
) -> None:
    expected = enabled and not admin_paused and has_model
    assert gate_open(enabled=enabled, admin_paused=admin_paused, has_model=has_model) is expected
    lock = closed_lock(enabled=enabled, admin_paused=admin_paused, has_model=has_model)
    assert (lock is None) is expected


@pytest.mark.parametrize(
    ("enabled", "admin_paused", "has_model", "lock"),
    [
        (False, True, False, Lock.ADMIN_PAUSED),  # the admin's lock wins over everything
        (True, True, True, Lock.ADMIN_PAUSED),
        (False, False, False, Lock.DISABLED),  # the owner's switch before the missing model
        (False, False, True, Lock.DISABLED),
        (True, False, False, Lock.NO_MODEL),
    ],
)
def test_lock_precedence(enabled: bool, admin_paused: bool, has_model: bool, lock: Lock) -> None:
    assert closed_lock(enabled=enabled, admin_paused=admin_paused, has_model=has_model) is lock


@pytest.mark.parametrize(("enabled", "admin_paused", "has_model"), FLAGS)
@pytest.mark.parametrize("has_schedule", [True, False])
def test_status_is_the_closed_lock_or_the_start_mode(
    enabled: bool, admin_paused: bool, has_model: bool, has_schedule: bool
) -> None:
    status = agent_status(
        enabled=enabled, admin_paused=admin_paused, has_model=has_model, has_schedule=has_schedule
    )
    lock = closed_lock(enabled=enabled, admin_paused=admin_paused, has_model=has_model)
    if lock is not None:
        assert status == lock.value
    else:
        assert status is (AgentStatus.SCHEDULED if has_schedule else AgentStatus.MANUAL)


def test_values_match_the_graphql_contract() -> None:
    assert [status.value for status in AgentStatus] == [
        "SCHEDULED",
        "MANUAL",
        "DISABLED",
        "ADMIN_PAUSED",
        "NO_MODEL",
    ]
    assert {lock.value for lock in Lock} == {"ADMIN_PAUSED", "DISABLED", "NO_MODEL"}


def test_every_lock_has_a_message() -> None:
    assert set(LOCK_MESSAGES) == set(Lock)
    assert "admin" in LOCK_MESSAGES[Lock.ADMIN_PAUSED]
    assert "model" in LOCK_MESSAGES[Lock.NO_MODEL]


def test_a_parked_run_goes_on_only_when_every_lock_is_open() -> None:
    open_gate = {
        "enabled": True,
        "admin_paused": False,
        "has_model": True,
        "deleted": False,
        "owner_active": True,
    }
    assert resume_stop(**open_gate) is None
    closed = {
        "enabled": ResumeStop.DISABLED,
        "admin_paused": ResumeStop.ADMIN_PAUSED,
        "has_model": ResumeStop.NO_MODEL,
        "deleted": ResumeStop.DELETED,
        "owner_active": ResumeStop.OWNER_INACTIVE,
    }
    for flag, stop in closed.items():
        assert resume_stop(**{**open_gate, flag: not open_gate[flag]}) is stop


def test_a_deactivated_owner_is_named_rather_than_the_switch_it_turned_off() -> None:
    # Deactivation writes enabled = false too; the owner reads why.
    stop = resume_stop(
        enabled=False, admin_paused=False, has_model=True, deleted=False, owner_active=False
    )
    assert stop is ResumeStop.OWNER_INACTIVE
    # Deleted wins over everything (a hidden agent is always switched off), then the admin's lock.
    assert (
        resume_stop(
            enabled=False, admin_paused=True, has_model=False, deleted=True, owner_active=False
        )
        is ResumeStop.DELETED
    )
    assert (
        resume_stop(
            enabled=False, admin_paused=True, has_model=False, deleted=False, owner_active=False
        )
        is ResumeStop.ADMIN_PAUSED
    )


def test_every_resume_stop_has_a_message_naming_it() -> None:
    assert set(RESUME_STOP_MESSAGES) == set(ResumeStop)
    assert "paused by an admin" in RESUME_STOP_MESSAGES[ResumeStop.ADMIN_PAUSED]
    assert "deactivated" in RESUME_STOP_MESSAGES[ResumeStop.OWNER_INACTIVE]
