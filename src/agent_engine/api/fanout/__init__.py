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

The parts: what a subscription follows (`feed.py`), the socket an operation runs on
(`socket.py`), the groups and the process's `Broadcaster` (`groups.py`), and the stream a
resolver returns (`stream.py`).
"""

from agent_engine.api.fanout.feed import (
    NO_USER_ID,
    SKIP,
    SUBSCRIBER_TOO_SLOW,
    Audience,
    EventSource,
    Feed,
    OwnedEvent,
    SubscriberLagged,
)
from agent_engine.api.fanout.groups import Broadcaster
from agent_engine.api.fanout.socket import GroupedTransportWSHandler, SocketOperation
from agent_engine.api.fanout.stream import SharedStream, shared_stream

__all__ = [
    "NO_USER_ID",
    "SKIP",
    "SUBSCRIBER_TOO_SLOW",
    "Audience",
    "Broadcaster",
    "EventSource",
    "Feed",
    "GroupedTransportWSHandler",
    "OwnedEvent",
    "SharedStream",
    "SocketOperation",
    "SubscriberLagged",
    "shared_stream",
]
