"""An in-memory `Store` for the live bus: runs and steps in dicts, reads counted."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class MemoryStore:
    def __init__(self) -> None:
        self.runs: dict[int, dict[str, Any]] = {}
        self.steps: dict[int, dict[int, dict[str, Any]]] = {}
        self.reads: list[tuple[str, int]] = []

    def run(self, run_id: int, *, owner_id: int, agent_id: int, state: str) -> dict[str, Any]:
        self.runs[run_id] = {"id": run_id, "agent_id": agent_id, "state": state, "owner": owner_id}
        return self.runs[run_id]

    def step(self, run_id: int, index: int, *, finished: bool = False) -> None:
        self.steps.setdefault(run_id, {})[index] = {
            "index": index,
            "kind": "model_call",
            "finished_at": "done" if finished else None,
        }

    async def load_runs(self, run_ids: Sequence[int]) -> dict[int, dict[str, Any]]:
        self.reads.extend(("runs", r) for r in run_ids)
        return {r: dict(self.runs[r]) for r in run_ids if r in self.runs}

    async def steps_since(self, run_id: int, from_index: int) -> list[dict[str, Any]]:
        self.reads.append(("steps", run_id))
        run = self.runs.get(run_id)
        if run is None:
            return []
        steps = [s for i, s in sorted(self.steps.get(run_id, {}).items()) if i >= from_index]
        if not steps:
            return [{"run_state": run["state"], "index": None, "finished_at": None}]
        return [{"run_state": run["state"], **step} for step in steps]

    async def close(self) -> None:
        pass
