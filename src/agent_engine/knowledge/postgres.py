"""The Knowledge Store stand-in on PostgreSQL: documents, grants, a public flag, links, FTS.

Search uses the generated `search_vector` column (title weighted above body) with
`websearch_to_tsquery`; when no document matches all the terms, it retries with any of them, so a
long natural-language prompt still finds something. Every statement carries the ACL predicate.
"""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from agent_engine.knowledge.store import Document, DocumentHit, DocumentRef

MAX_SEARCH_LIMIT = 20
MAX_RELATED = 50


def _visible(alias: str) -> str:
    """The ACL: public, or granted to :user_id."""
    return (
        f"({alias}.is_public OR EXISTS (SELECT 1 FROM kb_document_grants g"
        f" WHERE g.document_id = {alias}.id AND g.user_id = :user_id))"
    )


_ALL_TERMS = "websearch_to_tsquery('english', :query)"
# The same query with every AND turned into OR (phrases and negations stay as written).
_ANY_TERM = (
    "CAST(replace(CAST(websearch_to_tsquery('english', :query) AS text), ' & ', ' | ') AS tsquery)"
)


_HEADLINE_OPTIONS = (
    'MaxWords=35, MinWords=12, MaxFragments=2, FragmentDelimiter=" … ", StartSel=**, StopSel=**'
)


def _search_sql(tsquery: str) -> str:
    # ts_headline is costly: only the ranked page gets a snippet.
    return f"""
        WITH q AS (SELECT {tsquery} AS query),
        hits AS (
            SELECT d.id, d.title, d.body, ts_rank(d.search_vector, q.query) AS rank
            FROM kb_documents d, q
            WHERE d.search_vector @@ q.query AND {_visible("d")}
            ORDER BY rank DESC, d.id
            LIMIT :limit
        )
        SELECT h.id, h.title, h.rank,
               ts_headline('english', h.body, q.query,
                           '{_HEADLINE_OPTIONS}') AS snippet
        FROM hits h, q
        ORDER BY h.rank DESC, h.id
    """


_SEARCH_ALL = text(_search_sql(_ALL_TERMS))
_SEARCH_ANY = text(_search_sql(_ANY_TERM))

_READ = text(
    "SELECT d.id, d.title, d.body, d.source, d.updated_at FROM kb_documents d"
    f" WHERE d.id = :document_id AND {_visible('d')}"
)

_RELATED = text(
    f"""
    SELECT d.id, d.title
    FROM (
        SELECT l.to_document_id AS id FROM kb_document_links l
        WHERE l.from_document_id = :document_id
        UNION
        SELECT l.from_document_id FROM kb_document_links l WHERE l.to_document_id = :document_id
    ) r
    JOIN kb_documents d ON d.id = r.id
    WHERE r.id <> :document_id
      AND {_visible("d")}
      AND EXISTS (SELECT 1 FROM kb_documents s WHERE s.id = :document_id AND {_visible("s")})
    ORDER BY d.title, d.id
    LIMIT :limit
    """
)


class PostgresKnowledgeStore:
    """`KnowledgeStore` on the stand-in tables (kb_documents, kb_document_grants, links)."""

    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine

    async def search(self, user_id: int, query: str, limit: int = 5) -> list[DocumentHit]:
        if not query.strip():
            return []
        params = {
            "user_id": user_id,
            "query": query,
            "limit": max(1, min(int(limit), MAX_SEARCH_LIMIT)),
        }
        async with self._engine.connect() as conn:
            rows = (await conn.execute(_SEARCH_ALL, params)).all()
            if not rows:
                rows = (await conn.execute(_SEARCH_ANY, params)).all()
        return [
            DocumentHit(id=row.id, title=row.title, snippet=row.snippet, rank=float(row.rank))
            for row in rows
        ]

    async def read(self, user_id: int, document_id: int) -> Document | None:
        async with self._engine.connect() as conn:
            row = (
                await conn.execute(_READ, {"user_id": user_id, "document_id": document_id})
            ).first()
        if row is None:
            return None
        return Document(
            id=row.id, title=row.title, body=row.body, source=row.source, updated_at=row.updated_at
        )

    async def related(self, user_id: int, document_id: int) -> list[DocumentRef]:
        async with self._engine.connect() as conn:
            rows = (
                await conn.execute(
                    _RELATED,
                    {"user_id": user_id, "document_id": document_id, "limit": MAX_RELATED},
                )
            ).all()
        return [DocumentRef(id=row.id, title=row.title) for row in rows]


async def put_document(
    conn: AsyncConnection,
    *,
    title: str,
    body: str,
    source: str | None = None,
    public: bool = False,
    grant_to: Iterable[int] = (),
    links_to: Iterable[int] = (),
) -> int:
    """Insert one document with its grants and outgoing links (seeding, tests, demos)."""
    document_id: int = (
        await conn.execute(
            text(
                "INSERT INTO kb_documents (title, body, source, is_public)"
                " VALUES (:title, :body, :source, :public) RETURNING id"
            ),
            {"title": title, "body": body, "source": source, "public": public},
        )
    ).scalar_one()
    grants = [{"document_id": document_id, "user_id": user_id} for user_id in grant_to]
    if grants:
        await conn.execute(
            text(
                "INSERT INTO kb_document_grants (document_id, user_id)"
                " VALUES (:document_id, :user_id) ON CONFLICT DO NOTHING"
            ),
            grants,
        )
    links = [{"from_id": document_id, "to_id": to_id} for to_id in links_to]
    if links:
        await conn.execute(
            text(
                "INSERT INTO kb_document_links (from_document_id, to_document_id)"
                " VALUES (:from_id, :to_id) ON CONFLICT DO NOTHING"
            ),
            links,
        )
    return document_id
