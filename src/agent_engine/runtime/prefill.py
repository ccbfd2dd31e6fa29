"""A retry run's start: the conversation of the failed run, rebuilt from the steps the retry
carried over (`runs/retry.py`), so the loop goes on where the failed run stopped without calling
the model or a tool again for any of them.

Each reused model call is the assistant's turn (its text; the tool calls are the tool steps that
follow it, with ids made from their step index), each reused tool call the tool's answer as the
model saw it (an unknown outcome as such). The reused model calls count towards the iteration
cap; their tokens do not count again.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from agent_engine.db.run_steps import StepRow
from agent_engine.domain.runs import RunStepKind
from agent_engine.runtime.providers.base import Message


@dataclass(frozen=True)
class Prefill:
    """What the loop starts from: the messages after the opening, the texts so far, the model
    calls already made and the index of the next step."""

    messages: list[Message] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    iterations: int = 0
    next_index: int = 0


def _arguments(value: Any) -> str:
    if value is None:
        return "{}"
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False)


def prefill_from_steps(run_id: int, steps: Sequence[StepRow]) -> Prefill:
    """The conversation of the reused steps (in index order)."""
    messages: list[Message] = []
    texts: list[str] = []
    iterations = 0
    calls: list[dict[str, Any]] | None = None
    next_index = 0
    for step in steps:
        next_index = step.index + 1
        if step.kind == RunStepKind.MODEL_CALL:
            iterations += 1
            content = step.output or ""
            if content.strip():
                texts.append(content.strip())
            calls = []
            messages.append({"role": "assistant", "content": content, "tool_calls": calls})
            continue
        if calls is None:
            continue
        call_id = f"call_retry_{run_id}_{step.index}"
        calls.append(
            {
                "id": call_id,
                "type": "function",
                "function": {"name": step.name, "arguments": _arguments(step.input)},
            }
        )
        messages.append({"role": "tool", "tool_call_id": call_id, "content": step.output or ""})
    for message in messages:
        # An assistant turn without tool calls sends none (providers refuse an empty list).
        if message["role"] == "assistant" and not message["tool_calls"]:
            del message["tool_calls"]
    return Prefill(messages=messages, texts=texts, iterations=iterations, next_index=next_index)
