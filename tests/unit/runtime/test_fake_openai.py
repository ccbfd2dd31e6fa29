"""The fake OpenAI server speaks the protocol the official SDK expects, from sync and async code."""

from __future__ import annotations

import asyncio
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


async def test_held_replies_pile_up_in_flight_until_released() -> None:
    async with FakeOpenAIServer(default=FakeReply(content="ok", delay_seconds=0.05)) as server:
        server.hold()
        async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
            calls = [
                asyncio.create_task(
                    client.post("/chat/completions", json={"model": "m", "messages": MESSAGES})
                )
                for _ in range(50)
            ]
            while server.active_requests < 50:
                await asyncio.sleep(0.01)
            assert not any(call.done() for call in calls)
            server.release()
            replies = await asyncio.gather(*calls)
        assert {r.json()["choices"][0]["message"]["content"] for r in replies} == {"ok"}
        assert (server.active_requests, server.max_active_requests) == (0, 50)
        server.reset_peak()
        assert server.max_active_requests == 0


def test_errors_carry_retry_after_in_seconds_or_as_a_date() -> None:
    with FakeOpenAIServer() as server:
        server.enqueue(
            error_reply(429, "slow down", retry_after="1", retry_after_ms=None),
            error_reply(503, "busy", retry_after="Wed, 21 Oct 2026 07:28:00 GMT"),
        )
        first = httpx.post(f"{server.base_url}/chat/completions", json={})
        second = httpx.post(f"{server.base_url}/chat/completions", json={})
    assert (first.status_code, first.headers["retry-after"]) == (429, "1")
    assert "retry-after-ms" not in first.headers
    assert first.json()["error"]["message"] == "slow down"
    assert second.headers["retry-after"] == "Wed, 21 Oct 2026 07:28:00 GMT"
    assert second.headers["retry-after-ms"] == "10"
