"""What a grouped subscription follows (`Feed`), whose payload an execution builds
(`Audience`), and the values a feed's payload may return."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agent_engine.api.auth import Caller

if TYPE_CHECKING:
    from agent_engine.api.context import Context
    from agent_engine.api.live.listeners import BusListener

# The user id of the admins' audience: no user has it, so no run is theirs.
NO_USER_ID = 0


class _Skip:
    def __repr__(self) -> str:
        return "SKIP"


SKIP: Any = _Skip()
"""A `Feed.payload` result: this event sends nothing to this feed's subscribers."""


@dataclass(frozen=True, eq=False)
class Feed:
    """What a subscription field follows.

    `key` identifies the events (equal keys follow the same events: `("runEvents", owner, agent)`);
    `open(queue_size, counted)` subscribes to them on the bus; `payload(event, context)` makes the
    root field's value of one event (or `SKIP`), possibly awaiting (e.g. a budget read).

    A feed that starts with what happened so far (runSteps) also has `replay()`: the events so
    far and whether the stream ends after them, read once per subscriber *after* it joined; and
    `shown_as(event)`: `(what, rank)` -- an event is shown to a subscriber only if it has not
    shown that `what` at that rank or a higher one (a step started, then finished).
    """

    key: Hashable
    open: Callable[[int | None, bool], BusListener[Any]]
    payload: Callable[[Any, Context], Any]
    replay: Callable[[], Awaitable[tuple[list[Any], bool]]] | None = None
    shown_as: Callable[[Any], tuple[Hashable, int]] | None = None


@dataclass(frozen=True)
class Audience:
    """Whose payload an execution builds: `user_id` None is the admins' (owner of nothing)."""

    user_id: int | None
    is_admin: bool

    @classmethod
    def of(cls, viewer: Caller) -> Audience:
        return cls(None, True) if viewer.is_admin else cls(viewer.user_id, False)

    def viewer(self) -> Caller:
        user_id = NO_USER_ID if self.user_id is None else self.user_id
        return Caller(
            user_id=user_id, is_admin=self.is_admin, email=None, display_name=None, timezone=None
        )


class Shown:
    """What one subscriber has shown of a replaying feed (see `Feed.shown_as`)."""

    __slots__ = ("_rank", "_shown_as")

    def __init__(self, shown_as: Callable[[Any], tuple[Hashable, int]]) -> None:
        self._shown_as = shown_as
        self._rank: dict[Hashable, int] = {}

    def first_time(self, event: Any) -> bool:
        """True (and remembered) when `event` shows something new to this subscriber."""
        return self.tag_first_time(self._shown_as(event))

    def tag_first_time(self, tag: tuple[Hashable, int]) -> bool:
        """As `first_time`, for an event's `(what, rank)` computed already (by its group)."""
        what, rank = tag
        before = self._rank.get(what)
        if before is not None and before >= rank:
            return False
        self._rank[what] = rank
        return True
