"""`builtin` provider: a deterministic offline stand-in for a model. It is not an LLM.

It exists so the embedded default works with no network and no API key. Through the same tool
protocol as a real model it (1) calls `search_knowledge` with the owner's prompt, (2) calls
`read_document` for the best hits, and (3) answers with a cited digest: an excerpt of each
document, then a numbered source list ("[1] Title (document 12)"). Same inputs, same output.
Usage is an estimate (~4 characters a token) so weekly budgets apply to it like to any model.

For demos of other tools, a prompt may instead hold directives, one a line:
`/call <tool name> <JSON arguments>`. The provider then calls each directive's tool in turn (an
MCP ticket tool, say) and answers with what each tool said -- still no language model.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from agent_engine.runtime.providers.base import (
    Message,
    ModelReply,
    ModelRequest,
    ToolCall,
    estimate_tokens,
)

SEARCH_LIMIT = 5
DOCUMENTS_READ = 3
MAX_QUERY_CHARS = 500
EXCERPT_CHARS = 280
FOOTER = "(Built-in offline digest: keyword search over the knowledge base, no language model.)"

_DOCUMENT_HEADER = re.compile(r"\ADocument (\d+): (.*)$", re.MULTILINE)
_MARKDOWN_LINK = re.compile(r"!?\[([^\]]*)\]\([^)]*\)")
_MARKUP = re.compile(r"(^|\s)#{1,6}\s+|[*_`>]+")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
_DIRECTIVE = re.compile(r"^\s*/call\s+(\S+)\s*(.*)$", re.MULTILINE)
DIRECTIVE_CALL_PREFIX = "builtin_call_"


@dataclass(frozen=True)
class _Source:
    document_id: int
    title: str
    excerpt: str


class BuiltinProvider:
    async def complete(self, request: ModelRequest) -> ModelReply:
        offered = {tool["function"]["name"] for tool in request.tools if "function" in tool}
        directives = _DIRECTIVE.findall(request.owner_prompt)
        if directives:
            return self._directives(request, directives, offered)
        query = _query(request)
        step = sum(1 for m in request.messages if m.get("role") == "assistant")
        calls, results = _tool_history(request.messages)
        searched = [
            results[i]
            for i, (name, _) in calls.items()
            if name == "search_knowledge" and i in results
        ]
        reads = [
            results[i] for i, (name, _) in calls.items() if name == "read_document" and i in results
        ]
        read_requested = any(name == "read_document" for name, _ in calls.values())

        if not calls:
            if "search_knowledge" not in offered or not query:
                return self._answer(
                    request,
                    "There is nothing to search for: no prompt or no knowledge tools were given.",
                )
            arguments = json.dumps({"query": query, "limit": SEARCH_LIMIT}, ensure_ascii=False)
            return self._call(
                request, [ToolCall(f"builtin_{step}_0", "search_knowledge", arguments)]
            )

        hits = _hits(searched[-1]) if searched else []
        if hits and not read_requested and "read_document" in offered:
            return self._call(
                request,
                [
                    ToolCall(
                        f"builtin_{step}_{n}",
                        "read_document",
                        json.dumps({"document_id": hit.document_id}),
                    )
                    for n, hit in enumerate(hits[:DOCUMENTS_READ])
                ],
            )
        return self._answer(request, _digest(query, hits, reads))

    def _directives(
        self, request: ModelRequest, directives: list[tuple[str, str]], offered: set[str]
    ) -> ModelReply:
        """Call each `/call` directive's tool in turn, then report what each one answered."""
        calls, results = _tool_history(request.messages)
        made = [i for i in calls if i.startswith(DIRECTIVE_CALL_PREFIX)]
        if len(made) < len(directives):
            name, arguments = directives[len(made)]
            if name not in offered:
                return self._answer(request, f"The tool {name} is not available to this agent.")
            step = len(made)
            call = ToolCall(f"{DIRECTIVE_CALL_PREFIX}{step}", name, arguments.strip() or "{}")
            return self._call(request, [call])
        lines = [f"{calls[i][0]}: {results.get(i, '(no answer)')}" for i in made]
        return self._answer(request, "\n".join(["Tool results:", *lines, "", FOOTER]))

    async def aclose(self) -> None:
        return None

    def _call(self, request: ModelRequest, calls: list[ToolCall]) -> ModelReply:
        prompt = estimate_tokens(request.messages, request.tools)
        tokens = prompt + estimate_tokens([c.arguments for c in calls])
        return ModelReply(
            content=None, tool_calls=tuple(calls), tokens_used=tokens, prompt_tokens=prompt
        )

    def _answer(self, request: ModelRequest, content: str) -> ModelReply:
        prompt = estimate_tokens(request.messages, request.tools)
        tokens = prompt + estimate_tokens(content)
        return ModelReply(content=content, tokens_used=tokens, prompt_tokens=prompt)


def _query(request: ModelRequest) -> str:
    """The owner's prompt; failing that, the last user or system text in the conversation."""
    text = request.owner_prompt.strip()
    if not text:
        for message in reversed(request.messages):
            if message.get("role") in ("user", "system") and isinstance(
                message.get("content"), str
            ):
                text = message["content"].strip()
                if text:
                    break
    return " ".join(text.split())[:MAX_QUERY_CHARS]


def _tool_history(
    messages: list[Message],
) -> tuple[dict[str, tuple[str, str]], dict[str, str]]:
    calls: dict[str, tuple[str, str]] = {}
    results: dict[str, str] = {}
    for message in messages:
        if message.get("role") == "assistant":
            for call in message.get("tool_calls") or ():
                function = call.get("function", {})
                calls[call["id"]] = (function.get("name", ""), function.get("arguments", ""))
        elif message.get("role") == "tool":
            results[message.get("tool_call_id", "")] = str(message.get("content", ""))
    return calls, results


def _hits(search_result: str) -> list[_Source]:
    try:
        data: Any = json.loads(search_result)
        return [
            _Source(int(hit["document_id"]), str(hit["title"]), _clean(str(hit.get("snippet", ""))))
            for hit in data["results"]
        ]
    except (ValueError, KeyError, TypeError):  # an error result, or a truncated one
        return []


def _read(result: str) -> _Source | None:
    header = _DOCUMENT_HEADER.match(result)
    if header is None:
        return None
    title = header.group(2).strip()
    _, _, body = result.partition("\n\n")
    return _Source(int(header.group(1)), title, _excerpt(body, title))


def _excerpt(body: str, title: str) -> str:
    lines = [line for line in body.splitlines() if line.strip()]
    if lines and _clean(lines[0]) == title:
        lines = lines[1:]  # the heading the title came from
    text = _clean(" ".join(lines))
    excerpt = ""
    for sentence in _SENTENCE_END.split(text):
        if excerpt and len(excerpt) + len(sentence) > EXCERPT_CHARS:
            break
        excerpt = f"{excerpt} {sentence}".strip()
        if len(excerpt) >= EXCERPT_CHARS // 2:
            break
    if len(excerpt) > EXCERPT_CHARS:
        excerpt = excerpt[: EXCERPT_CHARS - 1].rstrip() + "…"
    return excerpt


def _clean(text: str) -> str:
    text = _MARKDOWN_LINK.sub(r"\1", text)
    text = _MARKUP.sub(r"\1", text)
    return " ".join(text.split())


def _digest(query: str, hits: list[_Source], reads: list[str]) -> str:
    read_sources = {s.document_id: s for s in (_read(r) for r in reads) if s is not None}
    sources = [read_sources.get(hit.document_id, hit) for hit in hits[:DOCUMENTS_READ]]
    subject = query if len(query) <= 120 else query[:119].rstrip() + "…"
    if not sources:
        return (
            f"Digest for: {subject}\n\nNo documents in the knowledge base you can read match"
            f" this prompt.\n\n{FOOTER}"
        )
    points = [
        f"{n}. {source.title}: {source.excerpt or '(no text)'} [{n}]"
        for n, source in enumerate(sources, start=1)
    ]
    cited = [
        f"[{n}] {source.title} (document {source.document_id})"
        for n, source in enumerate(sources, start=1)
    ]
    return (
        f"Digest for: {subject}\n\n"
        + "\n".join(points)
        + "\n\nSources:\n"
        + "\n".join(cited)
        + f"\n\n{FOOTER}"
    )
