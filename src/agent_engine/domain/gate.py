"""The start gate (docs/architecture.md §4.2): static, from the agent's definition.

Open when `enabled AND NOT admin_paused AND model_id IS NOT NULL`. A closed gate writes no rows:
the scheduler never sees the agent and a manual start is refused naming the closed lock. When
several locks are closed, the one reported follows the contract's AgentStatus precedence:
ADMIN_PAUSED > DISABLED > NO_MODEL (the admin's sticky lock first, since the owner cannot lift it).
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from types import MappingProxyType


class Lock(StrEnum):
    ADMIN_PAUSED = "ADMIN_PAUSED"
    DISABLED = "DISABLED"
    NO_MODEL = "NO_MODEL"


class AgentStatus(StrEnum):
    """Derived, never stored; precedence ADMIN_PAUSED > DISABLED > NO_MODEL > SCHEDULED > MANUAL."""

    SCHEDULED = "SCHEDULED"
    MANUAL = "MANUAL"
    DISABLED = "DISABLED"
    ADMIN_PAUSED = "ADMIN_PAUSED"
    NO_MODEL = "NO_MODEL"


# What a refused manual start tells the user, per closed lock.
LOCK_MESSAGES: Mapping[Lock, str] = MappingProxyType(
    {
        Lock.ADMIN_PAUSED: "the agent is paused by an admin; only an admin can resume it",
        Lock.DISABLED: "the agent is switched off; its owner can enable it",
        Lock.NO_MODEL: "the agent has no model; choose one from the allowed list",
    }
)


class AgentNotStartable(Exception):
    """A closed gate refused a manual start (the API answers AGENT_NOT_STARTABLE)."""

    def __init__(self, agent_id: int, lock: Lock) -> None:
        super().__init__(f"agent {agent_id} cannot start: {LOCK_MESSAGES[lock]}")
        self.agent_id = agent_id
        self.lock = lock

    @property
    def reason(self) -> str:
        return LOCK_MESSAGES[self.lock]


def closed_lock(*, enabled: bool, admin_paused: bool, has_model: bool) -> Lock | None:
    """The lock that keeps the agent from starting, or None when the gate is open."""
    if admin_paused:
        return Lock.ADMIN_PAUSED
    if not enabled:
        return Lock.DISABLED
    if not has_model:
        return Lock.NO_MODEL
    return None


def gate_open(*, enabled: bool, admin_paused: bool, has_model: bool) -> bool:
    return closed_lock(enabled=enabled, admin_paused=admin_paused, has_model=has_model) is None


def agent_status(
    *, enabled: bool, admin_paused: bool, has_model: bool, has_schedule: bool
) -> AgentStatus:
    lock = closed_lock(enabled=enabled, admin_paused=admin_paused, has_model=has_model)
    if lock is not None:
        return AgentStatus(lock.value)
    return AgentStatus.SCHEDULED if has_schedule else AgentStatus.MANUAL


class ResumeStop(StrEnum):
    """Why a parked run may not go on: what the start gate checks, plus what only a run that was
    admitted before can meet (its agent deleted, its owner deactivated meanwhile)."""

    DELETED = "DELETED"
    ADMIN_PAUSED = "ADMIN_PAUSED"
    OWNER_INACTIVE = "OWNER_INACTIVE"
    DISABLED = "DISABLED"
    NO_MODEL = "NO_MODEL"


# What the owner reads in `Run.error` (and the waiting step's error) of a run ended so.
RESUME_STOP_MESSAGES: Mapping[ResumeStop, str] = MappingProxyType(
    {
        ResumeStop.DELETED: "the agent was deleted while the run waited for approval",
        ResumeStop.ADMIN_PAUSED: (
            "the agent was paused by an admin while the run waited for approval"
        ),
        ResumeStop.OWNER_INACTIVE: (
            "the owner's account was deactivated while the run waited for approval"
        ),
        ResumeStop.DISABLED: (
            "the agent was switched off by its owner while the run waited for approval"
        ),
        ResumeStop.NO_MODEL: (
            "the agent's model was removed from the allowed list while the run waited for approval"
        ),
    }
)


def resume_stop(
    *, enabled: bool, admin_paused: bool, has_model: bool, deleted: bool, owner_active: bool
) -> ResumeStop | None:
    """What keeps a parked run from going on, or None. Deletion first (the agent is gone, whatever
    else), then the admin's lock; a deactivated owner before the owner's switch, which the
    deactivation itself turned off."""
    if deleted:
        return ResumeStop.DELETED
    if admin_paused:
        return ResumeStop.ADMIN_PAUSED
    if not owner_active:
        return ResumeStop.OWNER_INACTIVE
    if not enabled:
        return ResumeStop.DISABLED
    if not has_model:
        return ResumeStop.NO_MODEL
    return None
