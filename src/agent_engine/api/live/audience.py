"""The one audience index: who may see an event of an owner's run, step or alert.

An owner sees their own; an admin (owner `None` here) sees every owner's. An event of owner O
touches O's entries and the admins', never the rest of the process.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Generic, TypeVar

M = TypeVar("M")


class AudienceIndex(Generic[M]):
    """Members by owner id; `None` is the admins (every owner's events)."""

    __slots__ = ("_admins", "_by_owner")

    def __init__(self) -> None:
        self._by_owner: dict[int, set[M]] = {}
        self._admins: set[M] = set()

    def add(self, owner_id: int | None, member: M) -> None:
        if owner_id is None:
            self._admins.add(member)
        else:
            self._by_owner.setdefault(owner_id, set()).add(member)

    def discard(self, owner_id: int | None, member: M) -> bool:
        """Remove `member`; False when it was not there."""
        if owner_id is None:
            if member not in self._admins:
                return False
            self._admins.discard(member)
            return True
        members = self._by_owner.get(owner_id)
        if members is None or member not in members:
            return False
        members.discard(member)
        if not members:
            del self._by_owner[owner_id]
        return True

    def audience(self, owner_id: int) -> list[M]:
        """Who may see an event of `owner_id` (a copy: delivering may remove members)."""
        return [*self._by_owner.get(owner_id, ()), *self._admins]

    def has_audience(self, owner_id: int) -> bool:
        return bool(self._admins) or owner_id in self._by_owner

    def __len__(self) -> int:
        return len(self._admins) + sum(len(m) for m in self._by_owner.values())

    def __iter__(self) -> Iterator[M]:
        yield from self._admins
        for members in self._by_owner.values():
            yield from members
