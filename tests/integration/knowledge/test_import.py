"""Importing Markdown and text: titles, links between imported files, idempotent re-imports."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from agent_engine.knowledge.importer import (
    UnknownOwnerError,
    collect_files,
    extract_link_targets,
    extract_title,
    import_command,
    import_paths,
)
from agent_engine.knowledge.postgres import PostgresKnowledgeStore
from agent_engine.settings import Settings
from tests.support.factories import Factories


def _write(root: Path, relative: str, content: str) -> Path:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content)
    return path


@pytest.fixture
def kb(tmp_path: Path) -> Path:
    root = tmp_path / "kb"
    _write(
        root,
        "index.md",
        "---\ntitle: ignored\n# not a heading\n---\n# Handbook\n\nStart with [VPN](guides/vpn.md),"
        ' [travel](guides/travel%20policy.md "Travel") and [the web](https://example.com).\n',
    )
    _write(
        root,
        "guides/vpn.md",
        "Intro line\n\n```\n# not the title\n[fake](../notes.txt)\n```\n\n# VPN access\n\n"
        "Request VPN access from IT. Back to [home](../index.md#top), [gone](nope.md).\n",
    )
    _write(root, "guides/travel policy.md", "Travel Policy\n=============\n\nBook early.\n")
    _write(root, "notes.txt", "Plain notes about [links](index.md) that are not parsed.\n")
    _write(root, "readme.markdown", "no heading here, links to [self](readme.markdown)\n")
    _write(root, ".obsidian/hidden.md", "# Hidden\n")
    _write(root, "picture.png", "not text")
    return root


async def _links(engine: AsyncEngine) -> set[tuple[str, str]]:
    async with engine.connect() as conn:
        rows = await conn.execute(
            text(
                "SELECT f.title, t.title FROM kb_document_links l"
                " JOIN kb_documents f ON f.id = l.from_document_id"
                " JOIN kb_documents t ON t.id = l.to_document_id"
            )
        )
        return {(a, b) for a, b in rows}


async def _documents(engine: AsyncEngine) -> dict[str, tuple[int, str]]:
    async with engine.connect() as conn:
        rows = await conn.execute(text("SELECT source, id, title FROM kb_documents"))
        return {source: (id_, title) for source, id_, title in rows}


def test_parsing(kb: Path) -> None:
    files = collect_files([kb, kb / "index.md"])
    assert [f.relative_to(kb).as_posix() for f in files] == [
        "guides/travel policy.md",
        "guides/vpn.md",
        "index.md",
        "notes.txt",
        "readme.markdown",
    ]
    assert extract_title("Intro\n\n## Sub\n\n# Main\n") == "Main"
    assert extract_title("Title\n===\n\n# Later") == "Title"
    assert extract_title("# Closed heading ##\n") == "Closed heading"
    assert extract_title("no heading") is None
    targets = extract_link_targets("[a](b.md) [c](http://x) [d](#frag)\n[e]: ./f.md\n", kb)
    assert targets == (str(kb / "b.md"), str(kb / "f.md"))
    with pytest.raises(FileNotFoundError):
        collect_files([kb / "missing"])


async def test_import_twice_yields_the_same_documents_and_links(
    engine: AsyncEngine, kb: Path
) -> None:
    first = await import_paths(engine, [kb], owner_id=None, public=True, progress=False)
    assert (first.files, first.created, first.updated, first.unchanged) == (5, 5, 0, 0)
    documents = await _documents(engine)
    assert {title for _, title in documents.values()} == {
        "Handbook",
        "VPN access",
        "Travel Policy",
        "notes",
        "readme",
    }
    assert str((kb / "guides/vpn.md").resolve()) in documents
    expected_links = {
        ("Handbook", "VPN access"),
        ("Handbook", "Travel Policy"),
        ("VPN access", "Handbook"),
    }
    assert await _links(engine) == expected_links
    assert first.links == 3

    second = await import_paths(engine, [kb], owner_id=None, public=True, progress=False)
    assert (second.created, second.updated, second.unchanged, second.links) == (0, 0, 5, 3)
    assert await _documents(engine) == documents
    assert await _links(engine) == expected_links

    # An edit updates in place and replaces the document's outgoing links.
    _write(kb, "index.md", "# Handbook v2\n\nOnly [travel](guides/travel%20policy.md) now.\n")
    third = await import_paths(
        engine, [kb / "index.md"], owner_id=None, public=True, progress=False
    )
    assert (third.created, third.updated) == (0, 1)
    assert await _links(engine) == {
        ("Handbook v2", "Travel Policy"),
        ("VPN access", "Handbook v2"),
    }
    assert len(await _documents(engine)) == 5


async def test_owner_import_grants_only_that_owner(
    engine: AsyncEngine, factories: Factories, kb: Path
) -> None:
    owner = (await factories.user())["id"]
    stranger = (await factories.user())["id"]
    await import_paths(engine, [kb], owner_id=owner, public=False, progress=False)
    store = PostgresKnowledgeStore(engine)
    hits = await store.search(owner, "VPN access")
    assert hits[0].title == "VPN access"
    assert await store.search(stranger, "VPN access") == []
    with pytest.raises(UnknownOwnerError):
        await import_paths(engine, [kb], owner_id=424242, public=False, progress=False)
    with pytest.raises(ValueError, match="owner"):
        await import_paths(engine, [kb], owner_id=None, public=False, progress=False)


async def test_import_command(
    settings: Settings,
    engine: AsyncEngine,
    factories: Factories,
    kb: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    owner = (await factories.user())["id"]
    code = await asyncio.to_thread(import_command, settings, [kb], owner_id=owner, public=False)
    out, _ = capsys.readouterr()
    assert code == 0
    assert (
        f"imported 5 files (granted to user {owner}): 5 new, 0 updated, 0 unchanged; 3 links" in out
    )
    code = await asyncio.to_thread(import_command, settings, [kb], owner_id=999999, public=False)
    _, err = capsys.readouterr()
    assert code == 2
    assert "user 999999 does not exist" in err
    code = await asyncio.to_thread(
        import_command, settings, [kb / "nothing-here"], owner_id=None, public=True
    )
    assert code == 2
    assert "no such file or folder" in capsys.readouterr().err
