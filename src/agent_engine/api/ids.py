"""The id and cursor codec: database ids as GraphQL IDs, opaque keyset cursors."""

from __future__ import annotations

import base64
import binascii

import strawberry

from agent_engine.api.errors import BadUserInput

MAX_DATABASE_ID = 2**63 - 1
# The longest text that can hold a database id or one of our cursors; longer input is refused
# before any conversion (Python refuses to convert integers of more than 4,300 digits).
MAX_ID_CHARS = 40
MAX_CURSOR_CHARS = 64


def database_id(text: str) -> int | None:
    """The id `text` spells (ASCII digits, 1 to MAX_DATABASE_ID), or None. Length first: a
    longer text is never converted."""
    if len(text) > MAX_ID_CHARS or not (text.isascii() and text.isdigit()):
        return None
    ident = int(text)
    return ident if 0 < ident <= MAX_DATABASE_ID else None


def parse_id(value: str | strawberry.ID, field: str) -> int:
    """A database id from its string form; anything else is the client's mistake."""
    ident = database_id(str(value).strip())
    if ident is None:
        raise BadUserInput(field, f"not a valid id: {str(value)[:40]!r}")
    return ident


def encode_cursor(kind: str, ident: int) -> str:
    return base64.urlsafe_b64encode(f"{kind}:{ident}".encode()).decode().rstrip("=")


def decode_cursor(kind: str, cursor: str | None, field: str = "after") -> int | None:
    """Opaque cursors encode the id of the last row seen (keyset paging, newest first)."""
    if cursor is None:
        return None
    if len(cursor) > MAX_CURSOR_CHARS:
        raise BadUserInput(field, "not a cursor returned by this API")
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
    except (binascii.Error, UnicodeDecodeError, ValueError) as exc:
        raise BadUserInput(field, "not a cursor returned by this API") from exc
    prefix, _, text = raw.partition(":")
    ident = database_id(text) if prefix == kind else None
    if ident is None:
        raise BadUserInput(field, "not a cursor returned by this API")
    return ident
