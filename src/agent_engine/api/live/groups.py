"""Subscription groups: members sharing a document, variables and audience are executed and
serialised once per event, and the same text goes to each member's bounded queue."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import json
from collections.abc import Awaitable, Callable, Hashable, Sequence
from typing import TYPE_CHECKING, Any, TypeGuard, cast

import structlog
from graphql import (
    DocumentNode,
    ExecutionResult,
    GraphQLError,
    execute_subscription_event,
    parse,
)
from graphql.execution import Executor
from strawberry.execution.is_awaitable import optimized_is_awaitable

from agent_engine.api.auth import Caller
from agent_engine.api.encoding import dumps
from agent_engine.api.errors import client_error
from agent_engine.api.live.feeds import SKIP, Audience, Feed, Shown
from agent_engine.api.live.queue import BoundedQueue, SubscriberTooSlow
from agent_engine.api.live.socket import SocketOperation
from agent_engine.observability.metrics import ACTIVE_SUBSCRIPTIONS

if TYPE_CHECKING:
    import strawberry

    from agent_engine.api.context import Context

log = structlog.get_logger(__name__)

# Events a group's shared source may hold while the group executes (its members' queues are the
# per-subscriber bound; this one only guards against a group that cannot keep up at all).
GROUP_BACKLOG_EVENTS = 10_000


class Member:
    """One subscription in a group: a bounded queue of payload texts, drained by its writer.

    Members of a replaying feed (runSteps) get `(tag, text)` items and a `shown` record."""

    __slots__ = ("group", "queue", "shown", "user_id")

    def __init__(self, group: Group, user_id: int, limit: int) -> None:
        self.group = group
        self.user_id = user_id
        self.queue: BoundedQueue[Any] = BoundedQueue(limit)
        self.shown: Shown | None = (
            Shown(group.feed.shown_as) if group.feed.shown_as is not None else None
        )

    def offer(self, item: Any) -> None:
        self.queue.offer(item)

    def end(self, error: Exception | None = None) -> None:
        self.queue.end(error)

    async def take(self) -> list[Any]:
        """Everything queued (waiting for at least one); raises when the member ended."""
        return await self.queue.take()


_Executor = Executor[Any]
# graphql-core's predicate type; Strawberry's fast check for plain values.
_is_awaitable = cast(Callable[[Any], TypeGuard[Awaitable[Any]]], optimized_is_awaitable)
_Job = tuple[Any, Audience, Any]  # (event, audience, payload text | None | awaitable of it)


class Group:
    """Members sharing (feed, document, operation name, variables, audience) and one source."""

    def __init__(
        self,
        broadcaster: Broadcaster,
        key: Hashable,
        feed: Feed,
        schema: strawberry.Schema,
        document: DocumentNode,
        operation: SocketOperation,
        audience: Audience,
        context: Context,
    ) -> None:
        self.broadcaster = broadcaster
        self.key = key
        self.feed = feed
        self.schema = schema
        self.document = document
        self.operation_name = operation.operation_name
        self.variables = operation.variables
        self.audience = audience
        # The joining socket's context without what is the socket's: the group outlives it.
        self.base_context = dataclasses.replace(
            context, viewer=None, request=None, response=None, connection_params=None
        )
        self.members: set[Member] = set()
        # Admin groups: members by user id, for events of their own runs.
        self.by_user: dict[int, set[Member]] = {}
        self._executors: dict[Audience, tuple[Context, _Executor | list[GraphQLError]]] = {}
        self.source = feed.open(GROUP_BACKLOG_EVENTS, False)
        self.task = asyncio.create_task(
            self._run(),
            name=f"subscription-group-{feed.key}",
            context=contextvars.Context(),  # not the joining operation's (its socket)
        )

    def add(self, member: Member) -> None:
        self.members.add(member)
        if self.audience.is_admin:
            self.by_user.setdefault(member.user_id, set()).add(member)

    def remove(self, member: Member) -> None:
        self.members.discard(member)
        same_user = self.by_user.get(member.user_id)
        if same_user is not None:
            same_user.discard(member)
            if not same_user:
                del self.by_user[member.user_id]

    # -- execution -------------------------------------------------------------------------

    async def _run(self) -> None:
        ending: Exception | None = None
        try:
            async for batch in self.source.batches():
                await self._deliver(batch)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the source overflowed, or a bug: tell the members
            if isinstance(exc, SubscriberTooSlow):
                ending = SubscriberTooSlow()
            else:
                log.exception("subscription group failed", feed=str(self.feed.key))
                ending = exc
        finally:
            self.source.close()
            for member in list(self.members):
                member.end(ending)
            self.broadcaster._forget(self)
            for context, _ in self._executors.values():
                with contextlib.suppress(Exception):
                    await context.release()

    async def _deliver(self, batch: Sequence[Any]) -> None:
        for context, _ in self._executors.values():
            context.refresh()  # each burst is a request of its own: new `now`, empty loaders
        jobs: list[_Job] = []
        for event in batch:
            owners = self.by_user.get(event.owner_id) if self.audience.is_admin else None
            if not owners or len(owners) < len(self.members):  # a member who does not own it
                jobs.append((event, self.audience, self._execute(event, self.audience)))
            if owners:  # an admin watching everyone owns this run: the owner's payload for them
                own = Audience(event.owner_id, True)
                jobs.append((event, own, self._execute(event, own)))
        pending = [job[2] for job in jobs if optimized_is_awaitable(job[2])]
        if pending:
            done = iter(await asyncio.gather(*pending))
            jobs = [
                (event, audience, next(done) if optimized_is_awaitable(text) else text)
                for event, audience, text in jobs
            ]
        shown_as = self.feed.shown_as
        for event, audience, text in jobs:
            if text is None:
                continue
            item = text if shown_as is None else (shown_as(event), text)
            for member in self._members_for(event, audience):
                member.offer(item)

    def execute_for(self, member: Member, event: Any) -> Any:
        """`event`'s payload text as `member` sees it (a replay), or an awaitable of it."""
        audience = self.audience
        if audience.is_admin and event.owner_id == member.user_id:
            audience = Audience(event.owner_id, True)
        context, _ = self._executor(audience)
        context.refresh()
        return self._execute(event, audience)

    def _members_for(self, event: Any, audience: Audience) -> list[Member]:
        if not self.audience.is_admin:
            return list(self.members)
        owners = self.by_user.get(event.owner_id, set())
        if audience.user_id is not None:
            return list(owners)
        return [member for member in self.members if member not in owners]

    def _executor(self, audience: Audience) -> tuple[Context, _Executor | list[GraphQLError]]:
        found = self._executors.get(audience)
        if found is None:
            context = dataclasses.replace(self.base_context, viewer=audience.viewer())
            executor_class = cast(type[_Executor], self.schema.execution_context_class)
            executor = executor_class.build(
                self.schema._schema,
                self.document,
                context_value=context,
                raw_variable_values=self.variables,
                operation_name=self.operation_name,
                is_awaitable=_is_awaitable,
                operation_extensions=None,
            )
            found = self._executors[audience] = (context, executor)
        return found

    def _execute(self, event: Any, audience: Audience) -> Any:
        """The serialised payload of `event` for `audience` (None: SKIP), or an awaitable of it
        when a resolver awaits."""
        context, executor = self._executor(audience)
        if isinstance(executor, list):  # variables no longer coerce: cannot happen after start
            return _serialise(ExecutionResult(None, executor))
        try:
            value = self.feed.payload(event, context)
        except Exception as exc:
            return _serialise(ExecutionResult(None, [GraphQLError(str(exc), original_error=exc)]))
        if optimized_is_awaitable(value):
            return self._execute_later(executor, value)
        if value is SKIP:
            return None
        result = execute_subscription_event(executor.build_per_event_executor(value))
        if optimized_is_awaitable(result):
            return self._serialise_later(cast(Awaitable[ExecutionResult], result))
        return _serialise(cast(ExecutionResult, result))

    async def _execute_later(self, executor: _Executor, value: Awaitable[Any]) -> str | None:
        try:
            payload = await value
        except Exception as exc:
            return _serialise(ExecutionResult(None, [GraphQLError(str(exc), original_error=exc)]))
        if payload is SKIP:
            return None
        result = execute_subscription_event(executor.build_per_event_executor(payload))
        if optimized_is_awaitable(result):
            result = await cast(Awaitable[ExecutionResult], result)
        return _serialise(cast(ExecutionResult, result))

    async def _serialise_later(self, result: Awaitable[ExecutionResult]) -> str:
        return _serialise(await result)


def _serialise(result: ExecutionResult) -> str:
    """The `payload` of a `next` message, as text."""
    payload: dict[str, Any] = {"data": result.data}
    if result.errors:
        payload["errors"] = [client_error(error).formatted for error in result.errors]
    return dumps(payload)


class Broadcaster:
    """The process's subscription groups (one per api process, beside the bus)."""

    def __init__(self, *, queue_size: int) -> None:
        self.queue_size = queue_size
        self._groups: dict[Hashable, Group] = {}
        self._members = 0

    @property
    def member_count(self) -> int:
        """Subscriptions delivered by groups."""
        return self._members

    @property
    def group_count(self) -> int:
        return len(self._groups)

    def members_of(self, feed_name: str) -> int:
        """Subscriptions of one field (`Feed.key[0]`, e.g. "budgetAlerts") delivered by groups."""
        return sum(
            len(group.members)
            for group in self._groups.values()
            if isinstance(group.feed.key, tuple) and group.feed.key[0] == feed_name
        )

    def join(
        self,
        feed: Feed,
        schema: strawberry.Schema,
        operation: SocketOperation,
        viewer: Caller,
        context: Context,
    ) -> Member:
        audience = Audience.of(viewer)
        key = (
            feed.key,
            operation.query,
            operation.operation_name,
            _canonical(operation.variables),
            audience,
        )
        group = self._groups.get(key)
        if group is None or group.task.done():
            # Parsed again once per group (the operation's own parse passed the guards already).
            document = parse(operation.query)
            group = self._groups[key] = Group(
                self, key, feed, schema, document, operation, audience, context
            )
        member = Member(group, viewer.user_id, self.queue_size)
        group.add(member)
        self._members += 1
        ACTIVE_SUBSCRIPTIONS.inc()
        return member

    def leave(self, member: Member) -> None:
        member.end()
        group = member.group
        if member in group.members:
            group.remove(member)
            self._members -= 1
            ACTIVE_SUBSCRIPTIONS.dec()
            if not group.members:
                # Gone at once: a subscription arriving while the task winds down starts anew.
                if self._groups.get(group.key) is group:
                    del self._groups[group.key]
                group.task.cancel()

    def _forget(self, group: Group) -> None:
        """The group ended (its members were told): it takes no one any more."""
        if self._groups.get(group.key) is group:
            del self._groups[group.key]
        for member in list(group.members):
            group.remove(member)
            self._members -= 1
            ACTIVE_SUBSCRIPTIONS.dec()

    async def stop(self) -> None:
        groups = list(self._groups.values())
        for group in groups:
            group.task.cancel()
        for group in groups:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await group.task


def _canonical(variables: dict[str, Any] | None) -> str:
    return json.dumps(variables or {}, sort_keys=True, separators=(",", ":"))
