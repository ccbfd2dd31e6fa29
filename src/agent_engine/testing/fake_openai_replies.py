"""What the fake OpenAI server (`testing/fake_openai.py`) answers: the scripted replies
(`text_reply`, `tool_reply`, `error_reply`, `raw_reply`, `truncated_reply`, `flood_reply`), the
per-model failure scripts (`unavailable`, `rate_limited`, `server_error`, `hang`, `bad_request`,
`context_too_long`), and a reply as the wire carries it (a chat completion, an OpenAI error, a
body cut short). `fake_openai` re-exports these names.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from starlette.responses import JSONResponse, Response

FAKE_CREATED = 1_700_000_000  # a fixed `created` stamp: replies do not depend on the clock
FAKE_MODEL_ID = "fake-model"


@dataclass(frozen=True)
class FakeToolCall:
    name: str
    arguments: Mapping[str, Any] | str = field(default_factory=dict)
    id: str | None = None  # generated ("call_<request>_<n>") when None


@dataclass(frozen=True)
class FakeReply:
    """One scripted reply: a final text, tool calls, or an HTTP error; optionally slow."""

    content: str | None = None
    tool_calls: Sequence[FakeToolCall] = ()
    status: int = 200
    error_message: str = "scripted failure"
    delay_seconds: float = 0.0
    prompt_tokens: int = 10
    completion_tokens: int = 5
    include_usage: bool = True
    # The error's `code` (OpenAI's, e.g. "context_length_exceeded").
    error_code: str | None = None
    # How long the client should wait before retrying an error (`retry-after-ms`, what OpenAI
    # sends); short by default so retry tests are fast.
    retry_after_ms: int | None = 10
    # The standard `Retry-After` header of an error: delay-seconds ("1") or an HTTP date.
    retry_after: str | None = None
    # A broken reply instead of the completion: this body as is (e.g. malformed JSON), with
    # `content_type`; `truncated`: the body is cut short of the Content-Length it announces.
    raw_body: str | None = None
    content_type: str = "application/json"
    truncated: bool = False
    # A flood: the completion's content is `flood_bytes` of "x" (forever when None), sent
    # chunked -- no Content-Length says how big (a hostile or broken endpoint).
    flood: bool = False
    flood_bytes: int | None = None


def raw_reply(body: str, **kwargs: Any) -> FakeReply:
    """A reply with this body (status 200 unless given), not a completion: malformed JSON etc."""
    return FakeReply(raw_body=body, **kwargs)


def truncated_reply(**kwargs: Any) -> FakeReply:
    """A completion whose body stops half-way: the connection closes before Content-Length."""
    return FakeReply(content="cut short", truncated=True, **kwargs)


def flood_reply(size_bytes: int | None, **kwargs: Any) -> FakeReply:
    """A completion of `size_bytes` of "x" (None: it never ends), sent chunked."""
    return FakeReply(flood=True, flood_bytes=size_bytes, **kwargs)


def text_reply(content: str, **kwargs: Any) -> FakeReply:
    return FakeReply(content=content, **kwargs)


def tool_reply(*calls: FakeToolCall, content: str | None = None, **kwargs: Any) -> FakeReply:
    return FakeReply(content=content, tool_calls=calls, **kwargs)


def error_reply(status: int = 500, message: str = "scripted failure", **kwargs: Any) -> FakeReply:
    return FakeReply(status=status, error_message=message, **kwargs)


INSTANT_REPLY = FakeReply(content="ok")


@dataclass(frozen=True)
class ModelFailure:
    """A failure script for one model: `reply` for its next `times` requests (None: forever)."""

    reply: FakeReply
    times: int | None = None


def unavailable(times: int | None = None, **kwargs: Any) -> ModelFailure:
    """503 "overloaded" (what a provider in an outage answers)."""
    return ModelFailure(error_reply(503, "the model is overloaded", **kwargs), times)


def rate_limited(times: int | None = None, **kwargs: Any) -> ModelFailure:
    """429, with the usual short `retry-after-ms` unless given."""
    return ModelFailure(error_reply(429, "rate limit reached", **kwargs), times)


def server_error(times: int | None = None, status: int = 500, **kwargs: Any) -> ModelFailure:
    return ModelFailure(error_reply(status, "internal error", **kwargs), times)


def hang(times: int | None = None) -> ModelFailure:
    """No answer (until the server stops): the client's timeout decides."""
    return ModelFailure(text_reply("too late", delay_seconds=24 * 3600), times)


def bad_request(times: int | None = None) -> ModelFailure:
    return ModelFailure(error_reply(400, "invalid request: scripted", retry_after_ms=None), times)


def context_too_long(times: int | None = None) -> ModelFailure:
    return ModelFailure(
        error_reply(
            400,
            "This model's maximum context length is 8192 tokens; your messages resulted in"
            " 9000 tokens.",
            retry_after_ms=None,
            error_code="context_length_exceeded",
        ),
        times,
    )


ScriptResult = FakeReply | str | dict[str, Any]
Script = Callable[[dict[str, Any]], ScriptResult]


class TruncatedResponse(Response):
    """Announces the whole body, sends half of it, and ends the connection."""

    def __init__(self, body: bytes) -> None:
        super().__init__(media_type="application/json")
        self._whole = body
        self.headers["content-length"] = str(len(body))

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
        # The server closes the connection when the app ends short of the announced length.
        await send(
            {
                "type": "http.response.body",
                "body": self._whole[: len(self._whole) // 2],
                "more_body": False,
            }
        )


FLOOD_MARK = "<flood>"
FLOOD_CHUNK_BYTES = 64 * 1024


def error_response(
    status: int,
    message: str,
    kind: str,
    headers: Mapping[str, str] | None = None,
    code: str | None = None,
) -> Response:
    return JSONResponse(
        {"error": {"message": message, "type": kind, "param": None, "code": code}},
        status_code=status,
        headers=dict(headers or {}),
    )


def completion(request: dict[str, Any], reply: FakeReply, number: int) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": reply.content}
    if reply.tool_calls:
        message["tool_calls"] = [
            {
                "id": call.id or f"call_{number}_{index}",
                "type": "function",
                "function": {
                    "name": call.name,
                    "arguments": call.arguments
                    if isinstance(call.arguments, str)
                    else json.dumps(dict(call.arguments)),
                },
            }
            for index, call in enumerate(reply.tool_calls)
        ]
    completion: dict[str, Any] = {
        "id": f"chatcmpl-fake-{number}",
        "object": "chat.completion",
        "created": FAKE_CREATED,
        "model": request.get("model", FAKE_MODEL_ID),
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": "tool_calls" if reply.tool_calls else "stop",
                "logprobs": None,
            }
        ],
    }
    if reply.include_usage:
        completion["usage"] = {
            "prompt_tokens": reply.prompt_tokens,
            "completion_tokens": reply.completion_tokens,
            "total_tokens": reply.prompt_tokens + reply.completion_tokens,
        }
    return completion
