"""The `KnowledgeStore` protocol: every read is made as a user and applies that user's ACL.

A user sees a document when it is public or granted to them. A document the user cannot see does
not exist for them: `read` returns None, `related` of it is empty, and links to it are not shown.
A deployment inside the platform plugs the real Knowledge Store's client behind this protocol.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Protocol


@dataclass(frozen=True)
class Document:
    id: int
    title: str
    body: str
    source: str | None
    updated_at: datetime


@dataclass(frozen=True)
class DocumentRef:
    id: int
    title: str


@dataclass(frozen=True)
class DocumentHit:
    id: int
    title: str
    snippet: str
    rank: float


class KnowledgeStore(Protocol):
    async def search(self, user_id: int, query: str, limit: int = 5) -> list[DocumentHit]:
        """Documents visible to the user matching the query, most relevant first."""
        ...

    async def read(self, user_id: int, document_id: int) -> Document | None:
        """The document, or None when it does not exist or the user may not see it."""
        ...

    async def related(self, user_id: int, document_id: int) -> list[DocumentRef]:
        """Documents linked from or to this one, both visible to the user."""
        ...
