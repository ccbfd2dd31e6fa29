"""The model call fails the same way on the wire and through the thin call as through the SDK's own
request path: the same exception (type and text) or the same reply, after the same number of
requests, for each way a provider can fail; and a run ends in the same state with the same error."""

from __future__ import annotations

import asyncio
import dataclasses
import os
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from agent_engine.domain.runs import RunState
from agent_engine.runtime.loop import Runtime
from agent_engine.runtime.providers.base import ModelRequest
from agent_engine.runtime.providers.openai_provider import OpenAIProvider
from agent_engine.testing import (
    FakeOpenAIServer,
    FakeReply,
    FakeToolCall,
    error_reply,
    raw_reply,
    text_reply,
    tool_reply,
    truncated_reply,
)
from tests.integration.runs.support import FAKE_KEY_ENV, FakeAgent, execute_run, run_row
from tests.integration.runs.test_execute import BEAT, queued_run

TIMEOUT_SECONDS = 0.5
# A wait longer than the call's deadline: a rate limit gives up at once, deterministically.
LONG_RETRY_AFTER_MS = 60_000
RUN_TIMEOUT = timedelta(seconds=10)


# Each scenario: the replies the fake gives, in order (the last one repeats).
SCENARIOS: dict[str, list[FakeReply]] = {
    "answer": [text_reply("All quiet.", prompt_tokens=30, completion_tokens=12)],
    "tool calls": [
        tool_reply(FakeToolCall("search_knowledge", {"query": "vpn"}, id="c1"), content="Hm.")
    ],
    "no usage": [text_reply("No usage here.", include_usage=False)],
    "400": [error_reply(400, "Invalid value for 'messages'")],
    "401": [error_reply(401, "Incorrect API key provided")],
    "404": [error_reply(404, "The model 'gpt-9' does not exist")],
    "429 past the deadline": [error_reply(429, "slow down", retry_after_ms=LONG_RETRY_AFTER_MS)],
    "503 past the deadline": [error_reply(503, "overloaded", retry_after_ms=LONG_RETRY_AFTER_MS)],
    "503 then an answer": [error_reply(503, "overloaded", retry_after_ms=1), text_reply("Back.")],
    "500 every time": [error_reply(500, "upstream exploded", retry_after_ms=1)],
    "timeout": [FakeReply(content="too late", delay_seconds=5)],
    "malformed JSON": [raw_reply('{"id": "chatcmpl-1", "choices": [')],
    "not JSON, as text": [raw_reply("<html>bad gateway</html>", content_type="text/html")],
    "no choices": [raw_reply('{"id": "chatcmpl-1", "object": "chat.completion", "choices": []}')],
    "truncated body": [truncated_reply()],
}


def _request() -> ModelRequest:
    return ModelRequest(
        model="gpt-fake",
        messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Go."}],
        tools=[
            {
                "type": "function",
                "function": {
                    "name": "search_knowledge",
                    "description": "Search.",
                    "parameters": {"type": "object", "properties": {"query": {"type": "string"}}},
                },
            }
        ],
        # Rate limits are waited out only until here (event-loop time): shorter than the
        # scenarios' long Retry-After, longer than the timeouts' retries with their backoff (so
        # the outcome does not depend on the jitter).
        deadline=asyncio.get_running_loop().time() + 30,
    )


# The three ways of making the call: the SDK's own request path (the reference), the thin call over
# the SDK's client, and the wire (the default where the client would connect directly).
CALLS = {"sdk": {"thin": False}, "thin": {"direct": False}, "wire": {}}


async def _outcome(server: FakeOpenAIServer, *, call: str, replies: list[FakeReply]) -> Any:
    """What `complete` returned or raised (type and text), and how many requests it sent."""
    server.reset()
    server.enqueue(*replies[:-1])
    last = replies[-1]
    server.script(lambda _: last)
    os.environ[FAKE_KEY_ENV] = "test-key"
    provider = OpenAIProvider(
        base_url=server.base_url,
        api_key_env=FAKE_KEY_ENV,
        timeout_seconds=TIMEOUT_SECONDS,
        **CALLS[call],
    )
    assert (provider._pool is not None) == (call == "wire")
    try:
        reply = await provider.complete(_request())
        # The provider's usage as reported (the SDK's model adds its unset fields as None).
        usage = {key: value for key, value in reply.raw_usage.items() if value is not None}
        result: Any = dataclasses.replace(reply, raw_usage=usage)
    except Exception as exc:  # the outcome under comparison, whatever it is
        result = (type(exc), str(exc), type(exc.__cause__))
    finally:
        await provider.aclose()
    return result, server.request_count, server.requests[-1] if server.requests else None


@pytest.mark.parametrize("call", ["thin", "wire"])
@pytest.mark.parametrize("scenario", list(SCENARIOS))
async def test_the_fast_calls_answer_and_fail_like_the_sdk(
    fake_openai: FakeOpenAIServer, scenario: str, call: str
) -> None:
    replies = SCENARIOS[scenario]
    sdk = await _outcome(fake_openai, call="sdk", replies=replies)
    fast = await _outcome(fake_openai, call=call, replies=replies)
    assert fast == sdk
    result, requests, body = fast
    assert requests >= 1
    assert body is not None and body["model"] == "gpt-fake"  # the same request reached it
    if scenario in ("answer", "tool calls", "no usage", "503 then an answer"):
        assert not isinstance(result, tuple)
    else:
        assert isinstance(result, tuple)


async def test_the_fast_calls_send_what_the_sdk_sends(fake_openai: FakeOpenAIServer) -> None:
    await _outcome(fake_openai, call="sdk", replies=SCENARIOS["answer"])
    sdk_body, sdk_headers = fake_openai.requests[-1], fake_openai.request_headers[-1]
    await _outcome(fake_openai, call="thin", replies=SCENARIOS["answer"])
    thin_body, thin_headers = fake_openai.requests[-1], fake_openai.request_headers[-1]
    await _outcome(fake_openai, call="wire", replies=SCENARIOS["answer"])
    wire_body, wire_headers = fake_openai.requests[-1], fake_openai.request_headers[-1]
    assert thin_body == sdk_body
    assert wire_body == sdk_body
    for header in ("authorization", "content-type", "accept", "user-agent"):
        assert thin_headers[header] == sdk_headers[header]
    assert thin_headers["authorization"] == "Bearer test-key"
    # The wire sends the SDK's request: every header but its per-attempt telemetry.
    per_attempt = ("x-stainless-read-timeout", "x-stainless-retry-count")
    assert wire_headers == {k: v for k, v in sdk_headers.items() if k not in per_attempt}


# What a run's journal shows for each failure (through the worker's path: claim, runtime,
# finish); the error's stable part.
RUN_FAILURES = {
    "401": ("HTTP 401", 1),
    "404": ("HTTP 404", 1),
    "429 past the deadline": ("HTTP 429", 1),
    "timeout": ("timed out", 3),
    "malformed JSON": ("JSONDecodeError", 1),
    "truncated body": ("unreachable", 3),
    "no choices": ("no choices", 1),
}


@pytest.mark.parametrize("scenario", list(RUN_FAILURES))
async def test_a_failing_provider_fails_the_run_with_its_error(
    engine: AsyncEngine,
    fake_openai: FakeOpenAIServer,
    fake_agent: FakeAgent,
    scenario: str,
) -> None:
    words, requests = RUN_FAILURES[scenario]
    replies = SCENARIOS[scenario]
    fake_openai.script(lambda _: replies[-1])
    agent = await fake_agent()
    run_id = await queued_run(engine, agent["id"])

    async with Runtime(engine, model_timeout_seconds=TIMEOUT_SECONDS) as runtime:
        state = await execute_run(
            engine, runtime, run_id, heartbeat_interval=BEAT, run_timeout=RUN_TIMEOUT
        )

    row = await run_row(engine, run_id)
    assert state is RunState.FAILED
    assert (row["state"], row["reason"], row["tokens_used"]) == ("failed", "error", 0)
    assert words in row["error"]
    assert fake_openai.request_count == requests
