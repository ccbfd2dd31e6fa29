"""The three core Knowledge Store tools every agent has. Every read is made as the run's owner.

Search and related results are JSON (ids the model passes back); a document is plain text with a
short header, body last, so truncating a long document only shortens its body.
"""

from __future__ import annotations

import json
from typing import Any

from agent_engine.runtime.tools.spec import ToolCallContext, ToolError, ToolSpec

DEFAULT_SEARCH_LIMIT = 5
MAX_SEARCH_LIMIT = 20


def _document_id(args: dict[str, Any]) -> int:
    return int(args["document_id"])


async def search_knowledge(ctx: ToolCallContext, args: dict[str, Any]) -> str:
    query = str(args["query"]).strip()
    if not query:
        raise ToolError("query is empty")
    limit = max(1, min(int(args.get("limit", DEFAULT_SEARCH_LIMIT)), MAX_SEARCH_LIMIT))
    hits = await ctx.knowledge.search(ctx.owner_id, query, limit)
    result: dict[str, Any] = {
        "query": query,
        "results": [
            {
                "document_id": hit.id,
                "title": hit.title,
                "snippet": hit.snippet,
                "rank": round(hit.rank, 4),
            }
            for hit in hits
        ],
    }
    if not hits:
        result["note"] = "No documents matched. Try other or fewer words."
    return json.dumps(result, ensure_ascii=False)


async def read_document(ctx: ToolCallContext, args: dict[str, Any]) -> str:
    document_id = _document_id(args)
    document = await ctx.knowledge.read(ctx.owner_id, document_id)
    if document is None:
        # The same answer for "missing" and "not yours": existence is not leaked.
        raise ToolError(f"document {document_id} not found")
    related = await ctx.knowledge.related(ctx.owner_id, document_id)
    links = "; ".join(f"{ref.id} ({ref.title})" for ref in related) or "none"
    return (
        f"Document {document.id}: {document.title}\n"
        f"Source: {document.source or 'unknown'}\n"
        f"Updated: {document.updated_at.isoformat()}\n"
        f"Related documents: {links}\n"
        f"\n{document.body}"
    )


async def related_documents(ctx: ToolCallContext, args: dict[str, Any]) -> str:
    document_id = _document_id(args)
    related = await ctx.knowledge.related(ctx.owner_id, document_id)
    return json.dumps(
        {
            "document_id": document_id,
            "related": [{"document_id": ref.id, "title": ref.title} for ref in related],
        },
        ensure_ascii=False,
    )


_DOCUMENT_ID_SCHEMA = {
    "type": "object",
    "properties": {
        "document_id": {"type": "integer", "description": "The document's id from a search."}
    },
    "required": ["document_id"],
    "additionalProperties": False,
}

CORE_TOOLS = (
    ToolSpec(
        name="search_knowledge",
        description=(
            "Full-text search of the organisation's knowledge base (only documents the agent's"
            " owner may read). Returns document ids, titles and snippets, best match first."
        ),
        parameters={
            "type": "object",
            "properties": {
                "query": {"type": "string", "description": "Words or a phrase to search for."},
                "limit": {
                    "type": "integer",
                    "description": f"How many results (1-{MAX_SEARCH_LIMIT}).",
                    "minimum": 1,
                    "maximum": MAX_SEARCH_LIMIT,
                    "default": DEFAULT_SEARCH_LIMIT,
                },
            },
            "required": ["query"],
            "additionalProperties": False,
        },
        handler=search_knowledge,
    ),
    ToolSpec(
        name="read_document",
        description="Read a knowledge-base document in full, with the ids of related documents.",
        parameters=_DOCUMENT_ID_SCHEMA,
        handler=read_document,
    ),
    ToolSpec(
        name="related_documents",
        description="Documents linked from or to a knowledge-base document (ids and titles).",
        parameters=_DOCUMENT_ID_SCHEMA,
        handler=related_documents,
    ),
)
