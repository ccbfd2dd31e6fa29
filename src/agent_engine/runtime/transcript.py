"""The seam between the agent loop and whoever records its transcript.

The loop reports each model call and tool call as it starts and as it ends; it knows nothing of
where that goes. The run lifecycle plugs in `runs.steps.StepRecorder` (rows in `agent_run_steps`);
tests and callers that keep no transcript use `NO_TRANSCRIPT`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol

from agent_engine.runtime.bounded import truncate

# What a step keeps of a tool's result or the assistant's text (the whole result still goes to
# the model); longer text is cut and marked, like every bounded output of the runtime.
STEP_OUTPUT_MAX_CHARS = 8_000
# A tool call's arguments as the model sent them, bounded the same way.
STEP_INPUT_MAX_CHARS = 8_000


class StepKind(StrEnum):
    MODEL_CALL = "model_call"
    TOOL_CALL = "tool_call"


@dataclass(frozen=True)
class FallbackHop:
    """One model passed over for the next of its chain: the admin's names, and why."""

    model: str
    fallback: str
    cause: str


@dataclass(frozen=True)
class FallbackAnswer:
    """A model call answered by a fallback model: which (`name`: its provider model name, as
    steps name models; `model_id`: its row, for the price) and the hops that led to it."""

    name: str
    model_id: int | None
    hops: tuple[FallbackHop, ...]


@dataclass(frozen=True)
class StepEnd:
    """How a step ended: its output (bounded), the error if it failed, the tokens it cost;
    `fallback` when a fallback model answered the model call, and for an MCP tool call whose
    authority it carried."""

    output: str | None = None
    error: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    fallback: FallbackAnswer | None = None
    # An MCP tool step: whose authority the call carried, and the owner's account (owner_oauth).
    authority: str | None = None
    account: str | None = None


class Transcript(Protocol):
    async def step_started(self, kind: StepKind, name: str, input: Any | None = None) -> int:
        """Record a step that starts now; returns its index (0, 1, 2 … in starting order)."""
        ...

    async def step_finished(self, index: int, end: StepEnd) -> None: ...


class _NoTranscript:
    def __init__(self) -> None:
        self._next = 0

    async def step_started(self, kind: StepKind, name: str, input: Any | None = None) -> int:
        index, self._next = self._next, self._next + 1
        return index

    async def step_finished(self, index: int, end: StepEnd) -> None:
        return None


def no_transcript() -> Transcript:
    return _NoTranscript()


def tool_input(arguments: str) -> Any:
    """A tool call's arguments for the transcript: the JSON the model sent, or its raw text when
    it is not JSON, nested past the parser (the model's output is untrusted), or too long (cut
    and marked)."""
    if len(arguments) <= STEP_INPUT_MAX_CHARS:
        try:
            return json.loads(arguments) if arguments.strip() else {}
        except (json.JSONDecodeError, RecursionError):
            return arguments
    return truncate(arguments, STEP_INPUT_MAX_CHARS)


def step_output(text: str | None) -> str | None:
    return None if text is None else truncate(text, STEP_OUTPUT_MAX_CHARS)
