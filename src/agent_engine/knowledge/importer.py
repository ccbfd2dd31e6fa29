"""`agent-engine knowledge import`: Markdown and text files into the Knowledge Store stand-in.

A document's `source` is the resolved absolute path of its file, so importing the same file again
updates the document instead of adding a second one. Markdown links between imported files become
rows in `kb_document_links`; a re-import replaces the document's outgoing links. Access: `public`
sets the public flag, `owner_id` adds a grant. Re-imports only add access (a grant, the public
flag), they never take it away: revoking is a deliberate act, not a side effect of an import.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import unquote

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from agent_engine.db.engine import create_engine

if TYPE_CHECKING:
    from agent_engine.settings import Settings

MARKDOWN_SUFFIXES = frozenset({".md", ".markdown"})
SUPPORTED_SUFFIXES = MARKDOWN_SUFFIXES | {".txt"}
# Files per INSERT statement: big enough to amortise round trips, small enough to show progress.
BATCH_FILES = 200

_FENCE = re.compile(r"^ {0,3}(```|~~~).*?^ {0,3}\1[^\n]*$", re.MULTILINE | re.DOTALL)
_FRONT_MATTER = re.compile(r"\A---[ \t]*\n.*?\n---[ \t]*(\n|\Z)", re.DOTALL)
_ATX_H1 = re.compile(r"^ {0,3}#[ \t]+(.+?)(?:[ \t]+#+)?[ \t]*$", re.MULTILINE)
_SETEXT_H1 = re.compile(r"^ {0,3}(\S[^\n]*)\n {0,3}=+[ \t]*$", re.MULTILINE)
_INLINE_LINK = re.compile(r"(?<!!)\[[^\]\n]*\]\(\s*<?([^)\s>]+)>?(?:\s+[\"'(][^)\n]*)?\)")
_REFERENCE_LINK = re.compile(r"^ {0,3}\[[^\]\n]+\]:[ \t]*<?([^\s>]+)>?", re.MULTILINE)
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


class UnknownOwnerError(LookupError):
    """The user the import should grant to does not exist."""


@dataclass(frozen=True)
class ParsedFile:
    source: str
    title: str
    body: str
    link_targets: tuple[str, ...]


@dataclass
class ImportSummary:
    files: int = 0
    created: int = 0
    updated: int = 0
    unchanged: int = 0
    links: int = 0
    skipped: list[tuple[str, str]] = field(default_factory=list)
    document_ids: dict[str, int] = field(default_factory=dict)


# --- files and parsing -----------------------------------------------------------------------


def collect_files(paths: Iterable[Path]) -> list[Path]:
    """Supported files under the given paths, resolved, deduplicated, in a stable order.

    Hidden files and folders (`.git`, `.obsidian`) are skipped inside folders. A path that does
    not exist raises FileNotFoundError; an explicitly named file of another type is ignored.
    """
    seen: dict[Path, None] = {}
    for given in paths:
        path = given.expanduser().resolve()
        if not path.exists():
            raise FileNotFoundError(f"no such file or folder: {given}")
        candidates = _walk(path) if path.is_dir() else iter([path])
        for candidate in candidates:
            if candidate.suffix.lower() in SUPPORTED_SUFFIXES and candidate.is_file():
                seen.setdefault(candidate, None)
    return list(seen)


def _walk(folder: Path) -> Iterator[Path]:
    for entry in sorted(folder.iterdir()):
        if entry.name.startswith("."):
            continue
        if entry.is_dir():
            yield from _walk(entry)
        else:
            yield entry


def parse_file(path: Path) -> ParsedFile:
    raw = path.read_bytes().decode("utf-8", errors="replace")
    body = raw.removeprefix("\ufeff")
    is_markdown = path.suffix.lower() in MARKDOWN_SUFFIXES
    if is_markdown:
        prose = _FENCE.sub("", _FRONT_MATTER.sub("", body, count=1))
        title = extract_title(prose) or path.stem
        targets = extract_link_targets(prose, path.parent)
    else:
        title, targets = path.stem, ()
    return ParsedFile(source=str(path), title=title, body=body, link_targets=targets)


def extract_title(markdown: str) -> str | None:
    """The first level-one heading (`# Title` or `Title` over `===`), whichever comes first."""
    found = [m for m in (_ATX_H1.search(markdown), _SETEXT_H1.search(markdown)) if m]
    if not found:
        return None
    first = min(found, key=lambda match: match.start())
    return first.group(1).strip() or None


def extract_link_targets(markdown: str, base_dir: Path) -> tuple[str, ...]:
    """Absolute paths that the document's relative links point at (web links are ignored)."""
    targets: dict[str, None] = {}
    raw_links = [m.group(1) for m in _INLINE_LINK.finditer(markdown)]
    raw_links += [m.group(1) for m in _REFERENCE_LINK.finditer(markdown)]
    for raw in raw_links:
        if _SCHEME.match(raw) or raw.startswith(("#", "//")):
            continue
        relative = unquote(raw.split("#", 1)[0].split("?", 1)[0])
        if not relative:
            continue
        targets.setdefault(str((base_dir / relative).resolve()), None)
    return tuple(targets)


def _parse_batch(paths: Sequence[Path]) -> tuple[list[ParsedFile], list[tuple[str, str]]]:
    parsed, skipped = [], []
    for path in paths:
        try:
            parsed.append(parse_file(path))
        except OSError as exc:
            skipped.append((str(path), exc.strerror or str(exc)))
    return parsed, skipped


# --- database --------------------------------------------------------------------------------

_UPSERT = text(
    """
    INSERT INTO kb_documents AS d (title, body, source, is_public)
    SELECT t.title, t.body, t.source, :public
    FROM unnest(CAST(:titles AS text[]), CAST(:bodies AS text[]), CAST(:sources AS text[]))
         AS t(title, body, source)
    ON CONFLICT (source) DO UPDATE SET
        title = EXCLUDED.title,
        body = EXCLUDED.body,
        is_public = d.is_public OR EXCLUDED.is_public,
        updated_at = CASE
            WHEN (d.title, d.body, d.is_public)
                 IS DISTINCT FROM (EXCLUDED.title, EXCLUDED.body, d.is_public OR EXCLUDED.is_public)
            THEN now() ELSE d.updated_at END
    RETURNING d.id, d.source, (d.xmax = 0) AS inserted, (d.updated_at = now()) AS touched
    """
)
_LOOKUP_SOURCES = text("SELECT id, source FROM kb_documents WHERE source = ANY(:sources)")
_DELETE_LINKS = text("DELETE FROM kb_document_links WHERE from_document_id = ANY(:ids)")
_INSERT_LINKS = text(
    "INSERT INTO kb_document_links (from_document_id, to_document_id)"
    " SELECT * FROM unnest(CAST(:froms AS bigint[]), CAST(:tos AS bigint[]))"
    " ON CONFLICT DO NOTHING"
)
_GRANT = text(
    "INSERT INTO kb_document_grants (document_id, user_id)"
    " SELECT unnest(CAST(:ids AS bigint[])), :user_id ON CONFLICT DO NOTHING"
)
_USER_EXISTS = text("SELECT EXISTS (SELECT 1 FROM users WHERE id = :user_id)")


async def import_paths(
    engine: AsyncEngine,
    paths: list[Path],
    *,
    owner_id: int | None,
    public: bool,
    progress: bool = True,
) -> ImportSummary:
    """Import files and folders in one transaction; returns what happened."""
    if owner_id is None and not public:
        raise ValueError("an import needs an owner to grant to, or public=True")
    files = await asyncio.to_thread(collect_files, paths)
    summary = ImportSummary(files=len(files))
    parsed_all: list[ParsedFile] = []
    bar = Progress(
        SpinnerColumn(),
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        disable=not progress,
    )
    with bar:
        task = bar.add_task("importing", total=len(files))
        async with engine.begin() as conn:
            if (
                owner_id is not None
                and not (await conn.execute(_USER_EXISTS, {"user_id": owner_id})).scalar_one()
            ):
                raise UnknownOwnerError(f"user {owner_id} does not exist")
            for start in range(0, len(files), BATCH_FILES):
                batch = files[start : start + BATCH_FILES]
                parsed, skipped = await asyncio.to_thread(_parse_batch, batch)
                summary.skipped.extend(skipped)
                await _upsert(conn, parsed, public=public, summary=summary)
                parsed_all.extend(parsed)
                bar.advance(task, len(batch))
            bar.update(task, description="linking")
            summary.links = await _replace_links(conn, parsed_all, summary.document_ids)
            if owner_id is not None and summary.document_ids:
                await conn.execute(
                    _GRANT, {"ids": list(summary.document_ids.values()), "user_id": owner_id}
                )
        bar.update(task, description="done")
    return summary


async def _upsert(
    conn: AsyncConnection, parsed: list[ParsedFile], *, public: bool, summary: ImportSummary
) -> None:
    if not parsed:
        return
    rows = await conn.execute(
        _UPSERT,
        {
            "titles": [p.title for p in parsed],
            "bodies": [p.body for p in parsed],
            "sources": [p.source for p in parsed],
            "public": public,
        },
    )
    for row in rows:
        summary.document_ids[row.source] = row.id
        if row.inserted:
            summary.created += 1
        elif row.touched:
            summary.updated += 1
        else:
            summary.unchanged += 1


async def _replace_links(
    conn: AsyncConnection, parsed: list[ParsedFile], ids: dict[str, int]
) -> int:
    """Replace the imported documents' outgoing links; targets may be earlier imports too."""
    if not ids:
        return 0
    known = dict(ids)
    outside = {t for p in parsed for t in p.link_targets if t not in known}
    if outside:
        rows = await conn.execute(_LOOKUP_SOURCES, {"sources": sorted(outside)})
        known.update({row.source: row.id for row in rows})
    pairs = sorted(
        {
            (ids[p.source], known[target])
            for p in parsed
            if p.source in ids
            for target in p.link_targets
            if target in known and known[target] != ids[p.source]
        }
    )
    await conn.execute(_DELETE_LINKS, {"ids": list(ids.values())})
    if pairs:
        await conn.execute(
            _INSERT_LINKS, {"froms": [a for a, _ in pairs], "tos": [b for _, b in pairs]}
        )
    return len(pairs)


# --- command line ----------------------------------------------------------------------------


def import_command(
    settings: Settings, paths: list[Path], *, owner_id: int | None, public: bool
) -> int:
    """The CLI's `knowledge import`: run the import with a progress bar, print a summary."""
    err = Console(stderr=True)

    async def run() -> ImportSummary:
        engine = create_engine(settings, pool_size=1)
        try:
            return await import_paths(engine, paths, owner_id=owner_id, public=public)
        finally:
            await engine.dispose()

    try:
        summary = asyncio.run(run())
    except UnknownOwnerError as exc:
        err.print(
            f"[red]error:[/] {exc}; users are created when they first sign in (or give --public)",
            highlight=False,
        )
        return 2
    except FileNotFoundError as exc:
        err.print(f"[red]error:[/] {exc}", highlight=False)
        return 2
    except RuntimeError as exc:  # e.g. DATABASE_URL is not set
        err.print(f"[red]error:[/] {exc}", highlight=False)
        return 2

    out = Console()
    if summary.files == 0:
        out.print("no Markdown (.md, .markdown) or text (.txt) files found")
        return 1
    access = "public" if public else f"granted to user {owner_id}"
    if public and owner_id is not None:
        access = f"public, granted to user {owner_id}"
    out.print(
        f"imported {summary.files} files ({access}): {summary.created} new,"
        f" {summary.updated} updated, {summary.unchanged} unchanged; {summary.links} links",
        highlight=False,
    )
    for path, reason in summary.skipped:
        err.print(f"[yellow]skipped[/] {path}: {reason}", highlight=False)
    return 0
