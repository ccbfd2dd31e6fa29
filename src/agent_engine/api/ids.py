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


def parse_id(value: str | strawberry.ID, field: str) -> int:
    """A database id from its string form; anything else is the client's mistake."""
    text = str(value).strip()
    if (
        len(text) > MAX_ID_CHARS
        or not (text.isascii() and text.isdigit())
        or not 0 < int(text) <= MAX_DATABASE_ID
    ):
        raise BadUserInput(field, f"not a valid id: {str(value)[:40]!r}")
    return int(text)


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
    prefix, _, ident = raw.partition(":")
    if (
        prefix != kind
        or not (ident.isascii() and ident.isdigit())
        or len(ident) > MAX_ID_CHARS
        or int(ident) > MAX_DATABASE_ID
    ):
        raise BadUserInput(field, "not a cursor returned by this API")
    return int(ident)
