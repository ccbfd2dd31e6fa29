"""The live bus's events and what it reads: the topics and their channels, the event of each
topic (`RunChange`, `StepEvent`, `ApprovalChange`; an alert is its `BudgetAlertRow`), and the
`Store` the bus reads runs and steps from (`live/bus.py` says how each topic is fed).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any, Protocol

from agent_engine.db import approvals as approvals_db
from agent_engine.db.alerts import BudgetAlertRow


class Topic(StrEnum):
    RUNS = "runs"
    ALERTS = "alerts"
    STEPS = "steps"
    APPROVALS = "approvals"


# The NOTIFY channels the bus hears (on the one LISTEN connection of the api process).
RUNS_CHANNEL = "agent_run_events"
STEPS_CHANNEL = "agent_run_steps"
ALERTS_CHANNEL = "budget_alert_events"
APPROVALS_CHANNEL = approvals_db.CHANNEL
CHANNELS = (RUNS_CHANNEL, STEPS_CHANNEL, ALERTS_CHANNEL, APPROVALS_CHANNEL)

# Fields that only exist once a run reached a later state than the event shows.
_LATER_FIELDS_BY_STATE = {
    "queued": ("started_at", "finished_at", "heartbeat_at", "output", "error", "reason", "cost"),
    "running": ("finished_at", "output", "error", "reason", "cost"),
}


@dataclass(frozen=True)
class ApprovalChange:
    """A write to `tool_approvals` (requested, decided, expired, cancelled): ids only."""

    id: int
    owner_id: int


@dataclass(frozen=True)
class RunChange:
    run: dict[str, Any]
    previous_state: str | None
    owner_id: int

    @property
    def state(self) -> str:
        return str(self.run["state"])


@dataclass(frozen=True)
class StepEvent:
    """One step of a run as read (`row`: the step's columns and the run's `run_state`)."""

    run_id: int
    owner_id: int
    row: dict[str, Any]

    @property
    def index(self) -> int:
        return int(self.row["index"])

    @property
    def finished(self) -> bool:
        return self.row["finished_at"] is not None


class Store(Protocol):
    """What the bus reads (PostgreSQL in the api; a dict in the unit tests)."""

    async def load_runs(self, run_ids: Sequence[int]) -> dict[int, dict[str, Any]]: ...

    async def steps_since(self, run_id: int, from_index: int) -> list[dict[str, Any]]:
        """The run's state and its steps from `from_index` on (`run_state` in every row; one row
        with a NULL `index` when there are none; no row when the run is gone)."""
        ...

    async def close(self) -> None: ...


def as_of(row: dict[str, Any], state: str) -> dict[str, Any]:
    """The row as it was at the transition: the event's state, later fields blanked."""
    if row["state"] == state:
        return row
    shown = dict(row, state=state)
    for name in _LATER_FIELDS_BY_STATE.get(state, ()):
        shown[name] = None
    if state == "queued":
        shown["tokens_used"] = 0
    return shown


def alert_from_payload(payload: dict[str, Any]) -> BudgetAlertRow:
    """The alert from the trigger's JSON (timestamps in ISO 8601 with their offset)."""
    return BudgetAlertRow(
        id=int(payload["id"]),
        owner_id=int(payload["owner_id"]),
        window_start=datetime.fromisoformat(str(payload["window_start"])),
        percent=int(payload["percent"]),
        used_tokens=int(payload["used_tokens"]),
        cap_tokens=int(payload["cap_tokens"]),
        crossed_at=datetime.fromisoformat(str(payload["crossed_at"])),
    )
