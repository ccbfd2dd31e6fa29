"""ACL of the Knowledge Store stand-in: an invisible document does not exist for the reader,
whether searched, read by id or reached through a link; public documents are visible to all."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from agent_engine.knowledge.postgres import PostgresKnowledgeStore, put_document
from agent_engine.runtime.tools.core import read_document, related_documents, search_knowledge
from agent_engine.runtime.tools.registry import ToolCallContext, ToolError
from tests.support.factories import Factories

NOW = datetime(2025, 3, 3, 9, 0, tzinfo=UTC)


@dataclass
class Library:
    alice: int
    bob: int
    public: int
    alice_notes: int
    bob_secret: int


@pytest.fixture
async def library(engine: AsyncEngine, factories: Factories) -> Library:
    alice = (await factories.user())["id"]
    bob = (await factories.user())["id"]
    async with engine.begin() as conn:
        bob_secret = await put_document(
            conn,
            title="Zeppelin merger plan",
            body="Confidential: the zeppelin merger closes in June. Codename BLUEFIN.",
            grant_to=[bob],
        )
        public = await put_document(
            conn,
            title="Zeppelin handbook",
            body="How to board a zeppelin safely. See the plans for details.",
            public=True,
            links_to=[bob_secret],
        )
        alice_notes = await put_document(
            conn,
            title="Alice's zeppelin notes",
            body="My notes on the zeppelin handbook.",
            grant_to=[alice],
            links_to=[public, bob_secret],
        )
        await put_document(  # a link into the public document from the secret one
            conn,
            title="Bob's zeppelin index",
            body="zeppelin index",
            grant_to=[bob],
            links_to=[public],
        )
    return Library(alice, bob, public, alice_notes, bob_secret)


async def test_search_shows_public_and_granted_documents_only(
    engine: AsyncEngine, library: Library
) -> None:
    store = PostgresKnowledgeStore(engine)
    alice_hits = await store.search(library.alice, "zeppelin", limit=20)
    assert {h.id for h in alice_hits} == {library.public, library.alice_notes}
    bob_hits = await store.search(library.bob, "zeppelin merger", limit=20)
    assert bob_hits[0].id == library.bob_secret
    assert "**" in bob_hits[0].snippet  # matched words are marked
    assert await store.search(library.alice, "BLUEFIN") == []
    assert await store.search(library.alice, "merger confidential") == []


async def test_search_ranks_title_matches_first_and_falls_back_to_any_term(
    engine: AsyncEngine, library: Library
) -> None:
    store = PostgresKnowledgeStore(engine)
    hits = await store.search(library.alice, "handbook", limit=5)
    assert hits[0].id == library.public  # title beats body
    assert hits[0].rank >= hits[-1].rank
    # Not every word matches any document: the OR fallback still finds the handbook.
    fallback = await store.search(library.alice, "zeppelin handbook quarterly okr", limit=5)
    assert library.public in {h.id for h in fallback}
    assert await store.search(library.alice, "   ") == []
    assert len(await store.search(library.bob, "zeppelin", limit=1)) == 1


async def test_read_and_related_apply_the_acl(engine: AsyncEngine, library: Library) -> None:
    store = PostgresKnowledgeStore(engine)
    assert await store.read(library.alice, library.bob_secret) is None
    assert await store.read(library.alice, 987654) is None
    document = await store.read(library.bob, library.bob_secret)
    assert document is not None and document.title == "Zeppelin merger plan"

    # Links to the invisible document are not shown; links from it do not surface it either.
    alice_related = {r.id for r in await store.related(library.alice, library.public)}
    assert library.bob_secret not in alice_related
    assert library.alice_notes in alice_related
    assert await store.related(library.alice, library.bob_secret) == []
    bob_related = {r.id for r in await store.related(library.bob, library.public)}
    assert library.bob_secret in bob_related
    assert library.alice_notes not in bob_related


def _ctx(engine: AsyncEngine, owner: int) -> ToolCallContext:
    return ToolCallContext(
        run_id=1,
        agent_id=1,
        owner_id=owner,
        owner_timezone="UTC",
        now=NOW,
        knowledge=PostgresKnowledgeStore(engine),
        engine=engine,
    )


async def test_core_tools_read_as_the_owner(engine: AsyncEngine, library: Library) -> None:
    alice = _ctx(engine, library.alice)
    found = json.loads(await search_knowledge(alice, {"query": "zeppelin merger plan"}))
    assert library.bob_secret not in [r["document_id"] for r in found["results"]]
    assert "BLUEFIN" not in json.dumps(found)

    with pytest.raises(ToolError) as hidden:
        await read_document(alice, {"document_id": library.bob_secret})
    with pytest.raises(ToolError) as missing:
        await read_document(alice, {"document_id": 987654})
    # Same answer for "not yours" and "does not exist".
    assert str(hidden.value) == f"document {library.bob_secret} not found"
    assert str(missing.value) == "document 987654 not found"

    handbook = await read_document(alice, {"document_id": library.public})
    assert handbook.startswith(f"Document {library.public}: Zeppelin handbook")
    assert "merger" not in handbook.lower()  # its link to the secret is not listed
    related = json.loads(await related_documents(alice, {"document_id": library.public}))
    assert library.bob_secret not in [r["document_id"] for r in related["related"]]
    via_secret = json.loads(await related_documents(alice, {"document_id": library.bob_secret}))
    assert via_secret["related"] == []

    bob = _ctx(engine, library.bob)
    assert "BLUEFIN" in await read_document(bob, {"document_id": library.bob_secret})
