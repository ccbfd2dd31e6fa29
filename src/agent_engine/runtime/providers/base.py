"""The model-provider interface the loop talks to.

Messages and tools use the Chat Completions shapes (`{"role": ..., "content": ...}`, function
tools), the lingua franca of OpenAI-compatible servers; each provider maps them as it needs.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

Message = dict[str, Any]

# Rough tokens-per-character ratio for English text; used where a provider reports no usage.
CHARS_PER_TOKEN = 4


# Why a model counts as down (a fallback model may answer instead): the `cause` label of
# `agent_engine_model_fallbacks_total`. A request the model refused has no such cause.
CAUSE_RATE_LIMITED = "rate_limited"  # 429 (or 503) past the wait
CAUSE_SERVER_ERROR = "server_error"  # 5xx after the retries
CAUSE_TIMEOUT = "timeout"
CAUSE_UNREACHABLE = "unreachable"
# Not a failure of the call: the model's circuit breaker is open (it was down a moment ago).
CAUSE_BREAKER_OPEN = "breaker_open"


class ProviderError(Exception):
    """A model call failed (HTTP error, timeout, unreachable, malformed reply). The message is
    meant for the run journal's `error` column: what failed and where, never the API key.

    `down`: the model is down (one of the `CAUSE_*` above), after the provider's own retries;
    None when the model refused the request (4xx, refused credentials, a malformed or oversized
    reply), which another model would not fix."""

    def __init__(self, message: str, *, down: str | None = None) -> None:
        super().__init__(message)
        self.down = down


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # the raw JSON text the model produced; the loop parses it


@dataclass(frozen=True)
class ModelRequest:
    model: str
    messages: list[Message]
    tools: list[dict[str, Any]]
    # The owner's prompt layer, for providers that need it outside the composed system prompt
    # (the builtin model searches for it). Real LLMs read the messages.
    owner_prompt: str = ""
    # The run's wall-clock deadline (event-loop time, `loop.time()`): waiting out a rate limit
    # beyond it is pointless. None = the provider's own patience.
    deadline: float | None = None
    # Called after each attempt that failed as "down" (`ProviderError.down`) and would be
    # retried: True = stop retrying and raise now (a fallback answers; runtime/fallback.py).
    give_up: Callable[[], bool] | None = None


@dataclass(frozen=True)
class ModelReply:
    content: str | None
    tool_calls: tuple[ToolCall, ...] = ()
    tokens_used: int = 0
    raw_usage: dict[str, Any] = field(default_factory=dict)
    # The prompt (input) part of tokens_used; the rest is completion (output).
    prompt_tokens: int = 0

    @property
    def token_split(self) -> tuple[int, int]:
        """(prompt, completion), adding up to tokens_used."""
        total = max(self.tokens_used, 0)
        prompt = min(max(self.prompt_tokens, 0), total)
        return prompt, total - prompt


class ModelProvider(Protocol):
    async def complete(self, request: ModelRequest) -> ModelReply: ...

    async def aclose(self) -> None: ...


def estimate_tokens(*parts: object) -> int:
    """A deterministic usage estimate (~4 characters a token) for replies without usage."""
    chars = 0
    for part in parts:
        chars += len(part) if isinstance(part, str) else len(json.dumps(part, default=str))
    return math.ceil(chars / CHARS_PER_TOKEN)
