"""What a grouped subscription follows (`Feed`), whose payload an execution builds
(`Audience`), and the values a feed's payload may return."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Hashable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from agent_engine.api.auth import Viewer
from agent_engine.api.errors import ApiError

if TYPE_CHECKING:
    from agent_engine.api.context import Context

SUBSCRIBER_TOO_SLOW = "SUBSCRIBER_TOO_SLOW"
# The user id of the admins' audience: no user has it, so no run is theirs.
NO_USER_ID = 0


class SubscriberLagged(ApiError):
    """The client did not keep up; it re-subscribes and re-queries the journal."""

    code = SUBSCRIBER_TOO_SLOW


class _Skip:
    def __repr__(self) -> str:
        return "SKIP"


SKIP: Any = _Skip()
"""A `Feed.payload` result: this event sends nothing to this feed's subscribers."""


class OwnedEvent(Protocol):
    """A source event; `owner_id` is whose run (or step, alert…) it is about."""

    @property
    def owner_id(self) -> int: ...


E = TypeVar("E", bound=OwnedEvent)


class EventSource(Protocol[E]):
    """A subscription to the process's events (e.g. `RunEventHub.subscribe`); `batches` raises
    `SubscriberTooSlow` when the source overflowed."""

    def batches(self) -> AsyncIterator[list[E]]: ...

    def close(self) -> None: ...


@dataclass(frozen=True, eq=False)
class Feed:
    """What a subscription field follows.

    `key` identifies the events (equal keys follow the same events: `("runEvents", owner, agent)`);
    `open(queue_size, counted)` subscribes to them; `payload(event, context)` makes the root
    field's value of one event (or `SKIP`), possibly awaiting (e.g. a budget read).
    """

    key: Hashable
    open: Callable[[int | None, bool], EventSource[Any]]
    payload: Callable[[Any, Context], Any]


@dataclass(frozen=True)
class Audience:
    """Whose payload an execution builds: `user_id` None is the admins' (owner of nothing)."""

    user_id: int | None
    is_admin: bool

    @classmethod
    def of(cls, viewer: Viewer) -> Audience:
        return cls(None, True) if viewer.is_admin else cls(viewer.user_id, False)

    def viewer(self) -> Viewer:
        user_id = NO_USER_ID if self.user_id is None else self.user_id
        return Viewer(
            user_id=user_id, is_admin=self.is_admin, email=None, display_name=None, timezone=None
        )
