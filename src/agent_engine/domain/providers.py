"""The model providers the engine can call (runtime/providers has one client per member)."""

from __future__ import annotations

from enum import StrEnum


class Provider(StrEnum):
    OPENAI = "openai"
    BUILTIN = "builtin"
