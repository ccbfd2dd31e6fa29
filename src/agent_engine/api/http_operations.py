"""Rules of a GraphQL operation that arrived as a plain HTTP request, as schema extensions.

A socket's operations (graphql-transport-ws) share one context for the socket's life, so these
apply only where the context belongs to one HTTP request.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

from starlette.requests import Request
from strawberry.extensions import SchemaExtension
from strawberry.schema.exceptions import InvalidOperationTypeError
from strawberry.types.graphql import OperationType

from agent_engine.api.context import Context


def _request_context(context: object) -> Context | None:
    """The context when it is one HTTP request's (not a socket's, nor an in-process call's)."""
    if isinstance(context, Context) and isinstance(context.request, Request):
        return context
    return None


class SubscriptionsOverSocketsOnly(SchemaExtension):
    """Subscriptions are for graphql-transport-ws: over plain HTTP they are a 400 (Strawberry's
    own wording for an operation type the method does not allow) rather than a resolver run
    outside of a stream. First among the extensions: nothing else validates such a request."""

    def on_validate(self) -> Iterator[None]:
        execution = self.execution_context
        if (
            execution.operation_type is OperationType.SUBSCRIPTION
            and _request_context(execution.context) is not None
        ):
            raise InvalidOperationTypeError(OperationType.SUBSCRIPTION)
        yield


class ReleaseLoaders(SchemaExtension):
    """The request's loaders' shared connection goes back to the pool when its operation ends,
    not when the loaders' idle timer fires."""

    async def on_operation(self) -> AsyncIterator[None]:
        try:
            yield
        finally:
            context = _request_context(self.execution_context.context)
            if context is not None:
                await context.release()
