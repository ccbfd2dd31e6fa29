"""What a run's loop ends in, and what a parked run keeps to come back.

A WRITE call the owner has not auto-approved (or an OWNER_OAUTH call whose owner has no
CONNECTED account) ends the loop PARKED: `RunOutcome.parked` carries the call and a checkpoint of
the conversation (`LoopState.checkpoint`). Once the owner decided (or the wait expired) a
`Resume` brings the checkpoint back; the resumed call itself is made by `runtime/resume.py`.
The step loop that parks and resumes is `runtime/loop.py`, which re-exports these names.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from agent_engine.runtime.providers.base import Message, ToolCall
from agent_engine.runtime.tools.spec import McpTool

SUCCEEDED = "succeeded"
FAILED = "failed"
# Not a run state: the run stays running, waiting for its owner (`RunOutcome.parked`).
PARKED = "parked"
APPROVED = "approved"
EXPIRED = "expired"
CONNECTED = "connected"
# What a parked run waits for (`Parked.waits_for`, `Resume.waits_for`).
WAITS_APPROVAL = "approval"
WAITS_CONNECTION = "connection"
REASON_ITERATION_CAP = "iteration_cap"
REASON_ERROR = "error"
REASON_TOKEN_CAP = "token_cap"


@dataclass(frozen=True)
class RunOutcome:
    state: str  # "succeeded" | "failed"
    reason: str | None  # None | "iteration_cap" | "error"
    output: str | None
    error: str | None
    tokens_used: int
    # The provider's split of tokens_used (prompt + completion = tokens_used).
    prompt_tokens: int = 0
    completion_tokens: int = 0
    # state "parked": the WRITE call waiting for the owner, and where to resume.
    parked: Parked | None = None


@dataclass(frozen=True)
class Parked:
    tool_id: int
    tool_name: str
    input: dict[str, Any]
    step_index: int
    checkpoint: dict[str, Any]
    # "approval" (a WRITE call for the owner to decide) or "connection" (an OWNER_OAUTH call
    # whose owner has no CONNECTED account at `source`).
    waits_for: str = WAITS_APPROVAL
    source_id: int | None = None
    source: str | None = None


@dataclass(frozen=True)
class Resume:
    """A parked run's way back: its checkpoint, the decision, and the compare-and-set that lets
    exactly one attempt make an approved call."""

    checkpoint: dict[str, Any]
    # approval: "approved" | "declined" | "expired"; connection: "connected" | "expired"
    decision: str
    note: str | None
    step_index: int
    claim_call: Callable[[], Awaitable[bool]]
    # The approval decided (the resumed call's `execute_tool` span names it).
    approval_id: int | None = None
    waits_for: str = WAITS_APPROVAL
    # connection: the source whose account the run waited for (what the model hears).
    source: str | None = None


@dataclass
class LoopState:
    """What the loop carries from one model call to the next (and into a checkpoint)."""

    messages: list[Message] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    iteration: int = 0
    tokens: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0

    def checkpoint(self, call: ToolCall, rest: list[ToolCall]) -> dict[str, Any]:
        return {
            "version": 1,
            "messages": self.messages,
            "texts": self.texts,
            "iteration": self.iteration,
            "tokens": self.tokens,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "call": _call_json(call),
            "calls": [_call_json(c) for c in rest],
        }

    def restore(self, checkpoint: dict[str, Any]) -> None:
        self.messages = list(checkpoint["messages"])
        self.texts = list(checkpoint.get("texts", []))
        self.iteration = int(checkpoint["iteration"])
        self.tokens = int(checkpoint.get("tokens", 0))
        self.prompt_tokens = int(checkpoint.get("prompt_tokens", 0))
        self.completion_tokens = int(checkpoint.get("completion_tokens", 0))


def _call_json(call: ToolCall) -> dict[str, str]:
    return {"id": call.id, "name": call.name, "arguments": call.arguments}


def call_from_json(value: dict[str, Any]) -> ToolCall:
    return ToolCall(id=str(value["id"]), name=str(value["name"]), arguments=str(value["arguments"]))


def decline_message(decision: str, note: str | None) -> str:
    """What the model hears for a call the owner did not approve."""
    if decision == EXPIRED:
        text = "the owner declined this call (no decision before the approval expired)"
    else:
        text = "the owner declined this call"
    return f"{text}; their note: {note}" if note else text


def connection_park(
    tool: McpTool, arguments: dict[str, Any], step_index: int, checkpoint: dict[str, Any]
) -> Parked:
    return Parked(
        tool_id=tool.id,
        tool_name=tool.name,
        input=arguments,
        step_index=step_index,
        checkpoint=checkpoint,
        waits_for=WAITS_CONNECTION,
        source_id=tool.source_id,
        source=tool.source,
    )


def parked_outcome(loop: LoopState, parked: Parked) -> RunOutcome:
    return RunOutcome(
        PARKED,
        None,
        None,
        None,
        loop.tokens,
        loop.prompt_tokens,
        loop.completion_tokens,
        parked=parked,
    )
