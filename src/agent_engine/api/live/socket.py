"""The socket side: each graphql-transport-ws operation's task knows its socket and id."""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, cast

from strawberry.subscriptions.protocols.graphql_transport_ws.handlers import (
    BaseGraphQLTransportWSHandler,
    Operation,
    _OperationStreamClosed,
)
from strawberry.subscriptions.protocols.graphql_transport_ws.types import CompleteMessage
from strawberry.utils.aio import aclosing


@dataclass(frozen=True)
class SocketOperation:
    """A graphql-transport-ws operation: its id, document and variables, and its socket."""

    id: str
    query: str
    operation_name: str | None
    variables: dict[str, Any] | None
    send_text: Callable[[str], Awaitable[None]]


_OPERATION: ContextVar[SocketOperation | None] = ContextVar("ws_operation", default=None)
# The context of the operation whose task is being created (set by the handler's
# `handle_subscribe` just before Strawberry creates the task, which copies it).
OPERATION_CONTEXT: ContextVar[Any] = ContextVar("ws_operation_context", default=None)


class GroupedTransportWSHandler(BaseGraphQLTransportWSHandler[Any, Any]):
    """Strawberry's graphql-transport-ws handler; each operation's task knows its socket and id,
    so a subscription can join its group (see the module docstring).

    A check of the socket's viewer before every operation belongs in `run_operation`, before
    `super().run_operation`: nothing is registered before that (the group is joined when the
    stream is first iterated, after the resolver's own `require_viewer`).
    """

    async def run_operation(self, operation: Operation[Any, Any]) -> None:
        """Strawberry's `run_operation`, executed with the operation's own context (see
        `OPERATION_CONTEXT`; the socket's when none was set)."""
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
        context = OPERATION_CONTEXT.get()
        try:
            result_source = await self.schema.stream(
                operation.query,
                variable_values=operation.variables,
                context_value=self.context if context is None else context,
                root_value=self.root_value,
                operation_name=operation.operation_name,
            )
            async with aclosing(result_source):
                await self._send_result_stream(operation, result_source)
            await operation.send_operation_message(
                CompleteMessage(id=operation.id, type="complete")
            )
        except _OperationStreamClosed:
            return
        except Exception as error:  # pragma: no cover - as Strawberry's
            await self.handle_task_exception(error)
            with contextlib.suppress(Exception):
                await operation.send_operation_message({"id": operation.id, "type": "complete"})
            self.operations.pop(operation.id, None)
            raise
        finally:
            if context is not None:  # the operation's loaders give their connection back now
                with contextlib.suppress(Exception):
                    await context.release()

    async def send_text(self, text: str) -> None:
        """A message serialised already (a group's `next` frame)."""
        websocket = cast(Any, self.websocket).ws
        await websocket.send({"type": "websocket.send", "text": text})


def current_operation() -> SocketOperation | None:
    """The socket operation whose task this is (None outside of graphql-transport-ws)."""
    return _OPERATION.get()
