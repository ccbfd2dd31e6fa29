"""The builtin offline model, driven by hand through the tool protocol (no database)."""

from __future__ import annotations

import json
from typing import Any

from agent_engine.runtime.providers.base import ModelReply, ModelRequest
from agent_engine.runtime.providers.builtin import FOOTER, BuiltinProvider
from agent_engine.runtime.tools.registry import core_tools

TOOLS = [spec.openai_schema() for spec in core_tools().values()]
OPENING: list[dict[str, Any]] = [
    {"role": "system", "content": "Platform rules.\n\nWhat is our VPN policy?"},
    {"role": "user", "content": "Run started. Carry out your instructions now."},
]


def _request(messages: list[dict[str, Any]]) -> ModelRequest:
    return ModelRequest(
        model="builtin-digest", messages=messages, tools=TOOLS, owner_prompt="VPN policy"
    )


def _continue(messages: list[dict[str, Any]], reply: ModelReply, results: list[str]) -> None:
    messages.append(
        {
            "role": "assistant",
            "content": reply.content,
            "tool_calls": [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments},
                }
                for c in reply.tool_calls
            ],
        }
    )
    for call, result in zip(reply.tool_calls, results, strict=True):
        messages.append({"role": "tool", "tool_call_id": call.id, "content": result})


async def test_search_then_read_then_cited_digest() -> None:
    model = BuiltinProvider()
    messages = list(OPENING)
    first = await model.complete(_request(messages))
    assert first.content is None
    assert [c.name for c in first.tool_calls] == ["search_knowledge"]
    assert json.loads(first.tool_calls[0].arguments)["query"] == "VPN policy"
    assert first.tokens_used > 0

    search = {
        "query": "VPN policy",
        "results": [
            {"document_id": 12, "title": "VPN", "snippet": "Use the **VPN**", "rank": 0.5},
            {"document_id": 7, "title": "Travel", "snippet": "Abroad, use VPN", "rank": 0.2},
        ],
    }
    _continue(messages, first, [json.dumps(search)])
    second = await model.complete(_request(messages))
    assert [c.name for c in second.tool_calls] == ["read_document", "read_document"]
    assert [json.loads(c.arguments)["document_id"] for c in second.tool_calls] == [12, 7]
    assert len({c.id for c in (*first.tool_calls, *second.tool_calls)}) == 3

    _continue(
        messages,
        second,
        [
            "Document 12: VPN\nSource: /kb/vpn.md\nUpdated: x\nRelated documents: none\n\n"
            "# VPN\n\nAll staff connect through the **VPN** when off site. Tokens rotate.",
            "error: document 7 not found",
        ],
    )
    final = await model.complete(_request(messages))
    assert final.tool_calls == ()
    assert final.content is not None
    assert "All staff connect through the VPN when off site." in final.content
    assert "[1] VPN (document 12)" in final.content
    assert "[2] Travel (document 7)" in final.content  # falls back to the search snippet
    assert FOOTER in final.content
    again = await model.complete(_request(messages))
    assert again == final  # deterministic, usage included


async def test_nothing_found() -> None:
    model = BuiltinProvider()
    messages = list(OPENING)
    first = await model.complete(_request(messages))
    _continue(messages, first, [json.dumps({"query": "VPN policy", "results": []})])
    final = await model.complete(_request(messages))
    assert final.tool_calls == ()
    assert final.content is not None and "No documents" in final.content


async def test_falls_back_to_the_conversation_for_the_query() -> None:
    request = ModelRequest(model="b", messages=list(OPENING), tools=TOOLS)
    reply = await BuiltinProvider().complete(request)
    assert "Carry out your instructions" in json.loads(reply.tool_calls[0].arguments)["query"]
