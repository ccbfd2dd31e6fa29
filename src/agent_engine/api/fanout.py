"""Grouped subscription delivery: one execution and one serialisation per event and group.

Dashboards subscribe with the same few documents. Subscribers with the same document, operation
name, variables and *audience* get identical payloads, so the process keeps them in a group: each
event is executed once per group (graphql-core, with the group's context), serialised once, and
the same text is written to every socket of the group behind the operation's own id.

The audience is whose payload it is: an owner's (a non-admin sees only their own runs), or the
admins' (every owner's runs, no owner-only fields such as a run's `output`). An admin watching
everyone also owns some runs: for an event of such a run the admin's members get an execution of
their own (the owner's payload as an admin sees it), the other admins the general one. Resolvers
see the audience as `context.viewer`: the owner (or that admin), or an admin with user id
`NO_USER_ID` that owns nothing.

How a subscription rides this path (`runEvents`, `budget`, and later ones such as `runSteps`):
its resolver checks the viewer and the arguments as usual, then returns `shared_stream(info,
feed)`. A `Feed` names what it follows (`key`), opens a shared source for a group (`open`) and
turns a source event into the root field's value (`payload`, which may be async or return `SKIP`).

Over graphql-transport-ws, `GroupedTransportWSHandler.run_operation` tags the operation's task
with its socket and id. When graphql-core starts iterating the stream (inside that task, after
parsing, validation, the guards and the resolver), the stream joins its group and from then on
writes the group's `next` frames to its socket, in order, until the client completes it or the
socket closes; it never yields to graphql-core, so nothing is executed per subscriber. Strawberry
keeps doing the protocol around it: `connection_init`, the subscription cap, `error` for refused
operations, `complete`. A member whose bounded queue overflows ends with SUBSCRIBER_TOO_SLOW
like any stream that raised. Without a socket (e.g. `schema.subscribe` in process, or the legacy
protocol) the same stream yields payloads and graphql-core executes them per subscriber.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import json
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeGuard, TypeVar, cast

import orjson
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
from strawberry.subscriptions.protocols.graphql_transport_ws.handlers import (
    BaseGraphQLTransportWSHandler,
    Operation,
)

from agent_engine.api.auth import Viewer
from agent_engine.api.errors import ApiError, client_error
from agent_engine.api.subscribers import SubscriberTooSlow
from agent_engine.observability.metrics import ACTIVE_SUBSCRIPTIONS

if TYPE_CHECKING:
    import strawberry

    from agent_engine.api.context import Context

log = structlog.get_logger(__name__)

SUBSCRIBER_TOO_SLOW = "SUBSCRIBER_TOO_SLOW"
# The user id of the admins' audience: no user has it, so no run is theirs.
NO_USER_ID = 0
# Events a group's shared source may hold while the group executes (its members' queues are the
# per-subscriber bound; this one only guards against a group that cannot keep up at all).
GROUP_BACKLOG_EVENTS = 10_000


class SubscriberLagged(ApiError):
    """The client did not keep up; it re-subscribes and re-queries the journal."""

    code = SUBSCRIBER_TOO_SLOW


class _Skip:
    def __repr__(self) -> str:
        return "SKIP"


SKIP: Any = _Skip()
"""A `Feed.payload` result: this event sends nothing to this feed's subscribers."""


# --- what a subscription follows ------------------------------------------------------------


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


# --- the socket side --------------------------------------------------------------------------


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


# --- members and groups -----------------------------------------------------------------------


class _Ended(Exception):
    """The group ended normally (the process is stopping): the stream completes."""


class _Member:
    """One subscription in a group: a bounded queue of payload texts, drained by its writer."""

    __slots__ = ("_waiter", "closed", "error", "group", "limit", "pending", "user_id")

    def __init__(self, group: _Group, user_id: int, limit: int) -> None:
        self.group = group
        self.user_id = user_id
        self.limit = limit
        self.pending: deque[str] = deque()
        self.closed = False
        self.error: Exception | None = None
        self._waiter: asyncio.Future[None] | None = None

    def offer(self, text: str) -> None:
        if self.closed:
            return
        if len(self.pending) >= self.limit:
            self.end(SubscriberLagged("subscriber fell behind; re-query the journal"))
            return
        self.pending.append(text)
        self._wake()

    def end(self, error: Exception | None = None) -> None:
        if not self.closed:
            self.closed = True
            self.error = error
            self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def take(self) -> list[str]:
        """Everything queued (waiting for at least one); raises when the member ended."""
        while not self.pending:
            if self.closed:
                raise self.error or _Ended()
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        items = list(self.pending)
        self.pending.clear()
        return items


_Executor = Executor[Any]
# graphql-core's predicate type; Strawberry's fast check for plain values.
_is_awaitable = cast(Callable[[Any], TypeGuard[Awaitable[Any]]], optimized_is_awaitable)
_Job = tuple[Any, Audience, Any]  # (event, audience, payload text | None | awaitable of it)


class _Group:
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
        self.members: set[_Member] = set()
        # Admin groups: members by user id, for events of their own runs.
        self.by_user: dict[int, set[_Member]] = {}
        self._executors: dict[Audience, tuple[Context, _Executor | list[GraphQLError]]] = {}
        self.source = feed.open(GROUP_BACKLOG_EVENTS, False)
        self.task = asyncio.create_task(
            self._run(),
            name=f"subscription-group-{feed.key}",
            context=contextvars.Context(),  # not the joining operation's (its socket)
        )

    def add(self, member: _Member) -> None:
        self.members.add(member)
        if self.audience.is_admin:
            self.by_user.setdefault(member.user_id, set()).add(member)

    def remove(self, member: _Member) -> None:
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
                ending = SubscriberLagged("subscriber fell behind; re-query the journal")
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
        for event, audience, text in jobs:
            if text is None:
                continue
            for member in self._members_for(event, audience):
                member.offer(text)

    def _members_for(self, event: Any, audience: Audience) -> list[_Member]:
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


def dumps(value: Any) -> str:
    """JSON text; orjson, or the standard library for what orjson refuses (integers beyond 64
    bits in a JSON scalar)."""
    try:
        return orjson.dumps(value).decode()
    except TypeError:
        return json.dumps(value, separators=(",", ":"))


class Broadcaster:
    """The process's subscription groups (one per api process, like the run-event hub)."""

    def __init__(self, *, queue_size: int) -> None:
        self.queue_size = queue_size
        self._groups: dict[Hashable, _Group] = {}
        self._members = 0

    @property
    def member_count(self) -> int:
        """Subscriptions delivered by groups."""
        return self._members

    @property
    def group_count(self) -> int:
        return len(self._groups)

    def join(
        self,
        feed: Feed,
        schema: strawberry.Schema,
        operation: SocketOperation,
        viewer: Viewer,
        context: Context,
    ) -> _Member:
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
            group = self._groups[key] = _Group(
                self, key, feed, schema, document, operation, audience, context
            )
        member = _Member(group, viewer.user_id, self.queue_size)
        group.add(member)
        self._members += 1
        ACTIVE_SUBSCRIPTIONS.inc()
        return member

    def leave(self, member: _Member) -> None:
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

    def _forget(self, group: _Group) -> None:
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


# --- the stream a subscription resolver returns ----------------------------------------------


class SharedStream:
    """What a grouped subscription's resolver returns (see the module docstring).

    Over graphql-transport-ws it joins its group when first iterated and writes the group's
    frames to its socket, never yielding; elsewhere it yields each event's payload.
    """

    def __init__(self, info: strawberry.Info[Context, None], feed: Feed) -> None:
        self._info = info
        self._feed = feed
        self._operation = _OPERATION.get()
        self._member: _Member | None = None
        self._source: EventSource[Any] | None = None
        self._events: AsyncIterator[list[Any]] | None = None
        self._ready: deque[Any] = deque()

    def __aiter__(self) -> SharedStream:
        return self

    async def __anext__(self) -> Any:
        context = self._info.context
        if self._operation is None or context.broadcaster is None:
            return await self._next_payload()
        await self._write_frames(self._operation, context)
        raise StopAsyncIteration  # pragma: no cover - _write_frames only raises

    async def _write_frames(self, operation: SocketOperation, context: Context) -> None:
        broadcaster = context.broadcaster
        assert broadcaster is not None
        if self._member is None:
            self._member = broadcaster.join(
                self._feed, self._info.schema, operation, context.require_viewer(), context
            )
        member = self._member
        prefix = '{"id":' + json.dumps(operation.id) + ',"type":"next","payload":'
        try:
            while True:
                try:
                    texts = await member.take()
                except _Ended:
                    raise StopAsyncIteration from None
                for text in texts:
                    try:
                        await operation.send_text(prefix + text + "}")
                    except Exception:
                        # The socket is gone: its handler notices and cancels this operation.
                        await asyncio.Future()
        finally:
            broadcaster.leave(member)

    async def _next_payload(self) -> Any:
        """Without a socket: the next event's payload, for graphql-core to execute."""
        if self._source is None:
            self._source = self._feed.open(None, True)
            self._events = self._source.batches()
        assert self._events is not None
        context = self._info.context
        while True:
            while self._ready:
                event = self._ready.popleft()
                context.refresh()
                value = self._feed.payload(event, context)
                if optimized_is_awaitable(value):
                    value = await value
                if value is not SKIP:
                    return value
            try:
                self._ready.extend(await self._events.__anext__())
            except StopAsyncIteration:
                raise
            except Exception as exc:
                if isinstance(exc, SubscriberTooSlow):
                    raise SubscriberLagged(str(exc)) from exc
                raise

    async def aclose(self) -> None:
        if self._member is not None and self._info.context.broadcaster is not None:
            self._info.context.broadcaster.leave(self._member)
        if self._source is not None:
            self._source.close()


def shared_stream(info: strawberry.Info[Context, None], feed: Feed) -> AsyncIterator[Any]:
    """The stream a grouped subscription field returns (checks done, arguments parsed)."""
    return SharedStream(info, feed)


__all__ = [
    "NO_USER_ID",
    "SKIP",
    "SUBSCRIBER_TOO_SLOW",
    "Audience",
    "Broadcaster",
    "Feed",
    "GroupedTransportWSHandler",
    "SharedStream",
    "SubscriberLagged",
    "shared_stream",
]
