"""Keyset pagination, as in Strawberry's pagination guide: `Connection[Node]` is served as
`NodeConnection` (e.g. `RunConnection`), its edges as `NodeEdge`.

A page is read with one row more than asked for; that row only tells `hasNextPage`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Generic, Protocol, TypeVar

import strawberry

from agent_engine.api.ids import encode_cursor


class Identified(Protocol):
    @property
    def id(self) -> strawberry.ID: ...


NodeT = TypeVar("NodeT", bound=Identified)
RowT = TypeVar("RowT")


@strawberry.type
class PageInfo:
    has_next_page: bool
    end_cursor: str | None


@strawberry.type
class Edge(Generic[NodeT]):
    cursor: str
    node: NodeT


@strawberry.type
class Connection(Generic[NodeT]):
    edges: list[Edge[NodeT]]
    page_info: PageInfo

    @classmethod
    def from_rows(
        cls, rows: Sequence[RowT], first: int, *, kind: str, node: Callable[[RowT], NodeT]
    ) -> Connection[NodeT]:
        """The first `first` rows as nodes; each cursor is the node's id under `kind`."""
        nodes = [node(row) for row in rows[:first]]
        edges = [Edge(cursor=encode_cursor(kind, int(n.id)), node=n) for n in nodes]
        return cls(
            edges=edges,
            page_info=PageInfo(
                has_next_page=len(rows) > first,
                end_cursor=edges[-1].cursor if edges else None,
            ),
        )
