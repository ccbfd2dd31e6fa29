"""What every resolver uses: the typed `Info`, field decorators that keep the resolver's type, and
the viewer's role."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, cast

import strawberry

from agent_engine.api.context import Context

Info = strawberry.Info[Context, None]
F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")


def awaited_later(value: Awaitable[T]) -> T:
    """A sync resolver's result that graphql-core awaits (it awaits any awaitable result).

    Resolvers whose value is usually at hand (prefetched for a page) stay sync: an async resolver
    costs a coroutine and a task per object even when there is nothing to wait for.
    """
    return cast(T, value)


def described(description: str) -> Callable[[F], F]:
    """`@strawberry.field(description=…)` with its type kept (Strawberry types it as Any)."""
    decorator: Callable[[F], F] = strawberry.field(description=description)
    return decorator


def described_mutation(description: str) -> Callable[[F], F]:
    decorator: Callable[[F], F] = strawberry.mutation(description=description)
    return decorator


def viewer_is_admin(info: Info) -> bool:
    return info.context.viewer is not None and info.context.viewer.is_admin
