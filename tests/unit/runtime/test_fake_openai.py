"""The fake OpenAI server speaks the protocol the official SDK expects, from sync and async code."""

from __future__ import annotations

import time

import httpx
import openai
import pytest

from agent_engine.testing import (
    FakeOpenAIServer,
    FakeReply,
    FakeToolCall,
    error_reply,
    text_reply,
    tool_reply,
)

MESSAGES = [{"role": "user", "content": "hi"}]


def test_sync_use_with_the_sync_sdk() -> None:
    with FakeOpenAIServer() as server:
        assert server.base_url.startswith("http://127.0.0.1:")
        with openai.OpenAI(base_url=server.base_url, api_key="k") as client:
            reply = client.chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
        assert reply.choices[0].message.content == "ok"
        assert reply.usage is not None and reply.usage.total_tokens == 15
        assert server.request_count == 1
        assert server.requests[0]["messages"] == MESSAGES
        assert server.request_headers[0]["authorization"] == "Bearer k"
    with pytest.raises(RuntimeError):
        _ = server.base_url


async def test_async_use_queue_then_script_then_default() -> None:
    async with FakeOpenAIServer() as server:
        server.enqueue(
            tool_reply(FakeToolCall("search_knowledge", {"query": "vpn"}), prompt_tokens=3),
            "plain text",
        )
        server.script(lambda body: text_reply(f"saw {len(body['messages'])} messages"))
        async with openai.AsyncOpenAI(base_url=server.base_url, api_key="k") as client:
            first = await client.chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
            calls = first.choices[0].message.tool_calls or []
            assert first.choices[0].finish_reason == "tool_calls"
            assert [c.function.name for c in calls] == ["search_knowledge"]  # type: ignore[union-attr]
            assert calls[0].function.arguments == '{"query": "vpn"}'  # type: ignore[union-attr]
            assert first.usage is not None and first.usage.total_tokens == 8
            second = await client.chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
            assert second.choices[0].message.content == "plain text"
            third = await client.chat.completions.create(model="m", messages=MESSAGES * 2)  # type: ignore[arg-type]
            assert third.choices[0].message.content == "saw 2 messages"
        server.reset()
        assert server.request_count == 0


async def test_errors_and_retries() -> None:
    async with FakeOpenAIServer() as server:
        server.script(lambda body: error_reply(503, "overloaded"))
        async with openai.AsyncOpenAI(
            base_url=server.base_url, api_key="k", max_retries=2
        ) as client:
            with pytest.raises(openai.APIStatusError) as raised:
                await client.chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
        assert raised.value.status_code == 503
        assert "overloaded" in str(raised.value)
        assert server.request_count == 3  # the SDK retried twice


async def test_slow_reply_times_out_and_stop_does_not_wait_for_it() -> None:
    server = FakeOpenAIServer(default=FakeReply(content="late", delay_seconds=30))
    async with server:
        async with openai.AsyncOpenAI(
            base_url=server.base_url, api_key="k", max_retries=0, timeout=0.2
        ) as client:
            with pytest.raises(openai.APITimeoutError):
                await client.chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
        started = time.monotonic()
    assert time.monotonic() - started < 5


def test_raw_json_replies_and_bad_requests() -> None:
    with FakeOpenAIServer() as server:
        server.enqueue({"custom": True})
        assert httpx.post(f"{server.base_url}/chat/completions", json={}).json() == {"custom": True}
        bad = httpx.post(f"{server.base_url}/chat/completions", content=b"not json")
        assert bad.status_code == 400
        assert httpx.get(f"{server.base_url}/models").json()["data"][0]["id"] == "fake-model"
