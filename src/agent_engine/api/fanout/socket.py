"""The socket side: each graphql-transport-ws operation's task knows its socket and id."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, cast

from strawberry.subscriptions.protocols.graphql_transport_ws.handlers import (
    BaseGraphQLTransportWSHandler,
    Operation,
)


@dataclass(frozen=True)
class SocketOperation:
    """A graphql-transport-ws operation: its id, document and variables, and its socket."""

    id: str
    query: str
    operation_name: str | None
    variables: dict[str, Any] | None
    send_text: Callable[[str], Awaitable[None]]


_OPERATION: ContextVar[SocketOperation | None] = ContextVar("ws_operation", default=None)


class GroupedTransportWSHandler(BaseGraphQLTransportWSHandler[Any, Any]):
    """Strawberry's graphql-transport-ws handler; each operation's task knows its socket and id,
    so a subscription can join its group (see the module docstring).

    A check of the socket's viewer before every operation belongs in `run_operation`, before
    `super().run_operation`: nothing is registered before that (the group is joined when the
    stream is first iterated, after the resolver's own `require_viewer`).
    """

    async def run_operation(self, operation: Operation[Any, Any]) -> None:
        # The task of this operation (created by handle_subscribe) has its own context copy.
        _OPERATION.set(
            SocketOperation(
                id=operation.id,
                query=operation.query,
                operation_name=operation.operation_name,
                variables=operation.variables,
                send_text=self.send_text,
            )
        )
        await super().run_operation(operation)

    async def send_text(self, text: str) -> None:
        """A message serialised already (a group's `next` frame)."""
        websocket = cast(Any, self.websocket).ws
        await websocket.send({"type": "websocket.send", "text": text})


def current_operation() -> SocketOperation | None:
    """The socket operation whose task this is (None outside of graphql-transport-ws)."""
    return _OPERATION.get()
