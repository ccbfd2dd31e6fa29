"""The run's spans, after the OpenTelemetry GenAI semantic conventions: `invoke_agent <agent>`,
`chat <model>`, `execute_tool <tool>`, the tick's and the delivery's spans, and the park event.

Each helper first reads `tracing.ENABLED` and, while it is false, hands out a shared do-nothing
handle: no span, context or attribute is made on a hot path. The names of every span and
attribute are in `tracing` (one module); this module only puts them together. Content is
recorded only when `tracing.CAPTURE_CONTENT` is on.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from agent_engine.observability import tracing
from agent_engine.observability.tracing import (
    APPROVAL_ID,
    AUTHORITY_SHARED,
    CHAT,
    DELIVER_SPAN,
    DELIVERY_ID,
    ERROR_TYPE,
    EXCEPTION_TYPE,
    EXECUTE_TOOL,
    GEN_AI_AGENT_ID,
    GEN_AI_AGENT_NAME,
    GEN_AI_CONVERSATION_ID,
    GEN_AI_INPUT_MESSAGES,
    GEN_AI_OPERATION_NAME,
    GEN_AI_OUTPUT_MESSAGES,
    GEN_AI_PROVIDER_NAME,
    GEN_AI_REQUEST_MODEL,
    GEN_AI_RESPONSE_FINISH_REASONS,
    GEN_AI_RESPONSE_MODEL,
    GEN_AI_TOOL_CALL_ARGUMENTS,
    GEN_AI_TOOL_CALL_ID,
    GEN_AI_TOOL_CALL_RESULT,
    GEN_AI_TOOL_NAME,
    GEN_AI_TOOL_TYPE,
    GEN_AI_USAGE_INPUT_TOKENS,
    GEN_AI_USAGE_OUTPUT_TOKENS,
    INVOKE_AGENT,
    PARKED_EVENT,
    PROVIDER_NAMES,
    RUN_ID,
    RUN_RESUMED,
    SESSION_ID,
    TOOL_ACCESS,
    TOOL_AUTHORITY,
    TOOL_TYPE_EXTENSION,
    TOOL_TYPE_FUNCTION,
    USER_ID,
    extract,
    tracer,
)

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.trace import Span

log = logging.getLogger("agent_engine.observability.tracing")

# --- spans -------------------------------------------------------------------------------------


class SpanHandle:
    """What a hook holds while its span is open: set the outcome on it. The do-nothing handle
    (tracing off) has the same methods and makes nothing."""

    __slots__ = ("span",)

    def __init__(self, span: Span | None) -> None:
        self.span = span

    def set(self, name: str, value: Any) -> None:
        if self.span is not None and value is not None:
            self.span.set_attribute(name, value)

    def reply(
        self,
        *,
        model: str | None,
        input_tokens: int,
        output_tokens: int,
        finish_reasons: Sequence[str],
        content: str | None,
        tool_calls: Sequence[Any] = (),
    ) -> None:
        """A model call's answer (the `chat` span)."""
        span = self.span
        if span is None:
            return
        # Without the provider's word, the model asked for is the one that answered.
        answered = model or getattr(span, "attributes", {}).get(GEN_AI_REQUEST_MODEL)
        if answered:
            span.set_attribute(GEN_AI_RESPONSE_MODEL, answered)
        span.set_attribute(GEN_AI_USAGE_INPUT_TOKENS, input_tokens)
        span.set_attribute(GEN_AI_USAGE_OUTPUT_TOKENS, output_tokens)
        span.set_attribute(GEN_AI_RESPONSE_FINISH_REASONS, list(finish_reasons))
        if tracing.CAPTURE_CONTENT:
            span.set_attribute(
                GEN_AI_OUTPUT_MESSAGES,
                _json([_output_message(content, tool_calls, finish_reasons)]),
            )

    def result(self, text: str, *, error: str | None = None) -> None:
        """A tool call's result (the `execute_tool` span); `error`: the model's call was refused."""
        span = self.span
        if span is None:
            return
        if error is not None:
            span.set_attribute(ERROR_TYPE, "tool_error")
        if tracing.CAPTURE_CONTENT:
            span.set_attribute(GEN_AI_TOOL_CALL_RESULT, text)

    def event(self, name: str, attributes: Mapping[str, Any]) -> None:
        if self.span is not None:
            self.span.add_event(name, {k: v for k, v in attributes.items() if v is not None})


NO_SPAN = SpanHandle(None)


class _Off:
    """The shared do-nothing context manager of every hook while tracing is off."""

    __slots__ = ()

    def __enter__(self) -> SpanHandle:
        return NO_SPAN

    def __exit__(self, *_: Any) -> None:
        return None


_OFF = _Off()


def _span(
    name: str,
    attributes: Mapping[str, Any],
    *,
    kind: Any = None,
    context: Context | None = None,
    links: Sequence[Any] = (),
) -> Any:
    """A new span, current while its context manager is open."""
    from opentelemetry.trace import SpanKind

    span = tracer().start_span(
        name,
        context=context,
        kind=kind if kind is not None else SpanKind.INTERNAL,
        attributes={k: v for k, v in attributes.items() if v is not None},
        links=list(links),
        record_exception=False,
        set_status_on_exception=False,
    )
    return _current(span)


@contextmanager
def _current(span: Span) -> Iterator[SpanHandle]:
    """`span` made current, ended on exit; an exception is recorded by its type only."""
    from opentelemetry.trace import use_span

    with use_span(span, end_on_exit=True, record_exception=False, set_status_on_exception=False):
        try:
            yield SpanHandle(span)
        except BaseException as exc:
            record_error(span, exc)
            raise


def record_error(span: Span, exc: BaseException) -> None:
    """`error.type` and an `exception` event naming the type only: the text may hold content."""
    from opentelemetry.trace import Status, StatusCode

    kind = type(exc).__name__
    span.set_attribute(ERROR_TYPE, kind)
    span.add_event("exception", {EXCEPTION_TYPE: kind})
    span.set_status(Status(StatusCode.ERROR))


class StartedSpan:
    """A run's `invoke_agent` span started before its claim, so that the claim's own statement
    saves its traceparent on the run (no statement of tracing's own). `agent_span(started=…)`
    carries on with it once the claim started the run; a claim that started nothing drops it
    (a span never ended is never exported)."""

    __slots__ = ("span", "traceparent")

    def __init__(self, span: Span, traceparent: str | None) -> None:
        self.span = span
        self.traceparent = traceparent


def start_agent_span(run_id: int) -> StartedSpan | None:
    """The fresh run's `invoke_agent` span, a child of the current one (the message's
    `process execute_run`), not yet current; None while tracing is off."""
    if not tracing.ENABLED:
        return None
    from opentelemetry.trace import SpanKind, set_span_in_context

    span = tracer().start_span(
        INVOKE_AGENT,
        kind=SpanKind.INTERNAL,
        attributes={
            GEN_AI_OPERATION_NAME: INVOKE_AGENT,
            GEN_AI_CONVERSATION_ID: str(run_id),
            SESSION_ID: str(run_id),
            RUN_ID: str(run_id),
            RUN_RESUMED: False,
        },
        record_exception=False,
        set_status_on_exception=False,
    )
    carrier: dict[str, str] = {}
    tracing.inject(carrier, set_span_in_context(span))
    return StartedSpan(span, carrier.get("traceparent"))


def agent_span(
    *,
    agent_name: str | None,
    agent_id: int,
    run_id: int,
    owner_id: int,
    session_id: str | None = None,
    resume_of: str | None = None,
    approval_id: int | None = None,
    started: StartedSpan | None = None,
) -> Any:
    """`invoke_agent <agent>`: the run's execution on a worker (a context manager).

    A fresh run's span is a child of the current one (the message's `process execute_run`);
    `started` is that span when it was started before the claim (`start_agent_span`). A
    resumed run's (`resume_of`: the run's saved traceparent) is a child of the run's own trace,
    with a link to the current span -- the decision's request, through its message."""
    if not tracing.ENABLED:
        return _OFF
    from opentelemetry import trace
    from opentelemetry.trace import Link

    if started is not None and resume_of is None:
        span = started.span
        if agent_name:
            span.update_name(f"{INVOKE_AGENT} {agent_name}")
        span.set_attributes(
            {
                GEN_AI_AGENT_ID: str(agent_id),
                USER_ID: str(owner_id),
                **({GEN_AI_AGENT_NAME: agent_name} if agent_name else {}),
                **({SESSION_ID: session_id} if session_id else {}),
            }
        )
        return _current(span)

    context = None
    links: list[Any] = []
    if resume_of is not None:
        context = extract({"traceparent": resume_of})
        current = trace.get_current_span().get_span_context()
        if current.is_valid:
            links.append(Link(current, {APPROVAL_ID: approval_id} if approval_id else None))
    return _span(
        f"{INVOKE_AGENT} {agent_name}" if agent_name else INVOKE_AGENT,
        {
            GEN_AI_OPERATION_NAME: INVOKE_AGENT,
            GEN_AI_AGENT_ID: str(agent_id),
            GEN_AI_AGENT_NAME: agent_name,
            GEN_AI_CONVERSATION_ID: str(run_id),
            USER_ID: str(owner_id),
            SESSION_ID: session_id or str(run_id),
            RUN_ID: str(run_id),
            RUN_RESUMED: resume_of is not None,
            APPROVAL_ID: str(approval_id) if approval_id else None,
        },
        context=context,
        links=links,
    )


def chat_span(provider: str, request: Any) -> Any:
    """`chat <model>`: one model call (`request` a ModelRequest) as a CLIENT span;
    `model_reply(span, reply)` records the answer."""
    if not tracing.ENABLED:
        return _OFF
    from opentelemetry.trace import SpanKind

    model, messages = request.model, request.messages
    return _span(
        f"{CHAT} {model}",
        {
            GEN_AI_OPERATION_NAME: CHAT,
            GEN_AI_PROVIDER_NAME: PROVIDER_NAMES.get(provider, provider),
            GEN_AI_REQUEST_MODEL: model,
            GEN_AI_INPUT_MESSAGES: _json(_input_messages(messages))
            if tracing.CAPTURE_CONTENT
            else None,
        },
        kind=SpanKind.CLIENT,
    )


def tool_span(
    spec: Any, call: Any, *, approval_id: int | None = None, authority: str | None = None
) -> Any:
    """`execute_tool <tool>`: one tool call (`spec` a ToolSpec, `call` the model's ToolCall);
    `.result(...)` records what the model hears."""
    if not tracing.ENABLED:
        return _OFF
    mcp = spec.mcp
    return _span(
        f"{EXECUTE_TOOL} {call.name}",
        {
            GEN_AI_OPERATION_NAME: EXECUTE_TOOL,
            GEN_AI_TOOL_NAME: call.name,
            GEN_AI_TOOL_CALL_ID: call.id,
            GEN_AI_TOOL_TYPE: TOOL_TYPE_EXTENSION if mcp is not None else TOOL_TYPE_FUNCTION,
            TOOL_ACCESS: mcp.access if mcp is not None else None,
            # Whose credential the call carries (MCP tools): "none", "shared" or "owner_oauth".
            TOOL_AUTHORITY: (authority or AUTHORITY_SHARED).upper() if mcp is not None else None,
            APPROVAL_ID: str(approval_id) if approval_id else None,
            GEN_AI_TOOL_CALL_ARGUMENTS: call.arguments if tracing.CAPTURE_CONTENT else None,
        },
    )


def model_reply(handle: SpanHandle, reply: Any) -> None:
    """A model's reply (a ModelReply) on its `chat` span: the model that answered, the tokens,
    why it stopped, and (content on) what it said."""
    if handle.span is None:
        return
    usage = reply.raw_usage
    prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
    if not isinstance(prompt, int) or not isinstance(completion, int):
        prompt, completion = reply.token_split
    reason = getattr(reply, "finish_reason", None) or ("tool_calls" if reply.tool_calls else "stop")
    handle.reply(
        model=getattr(reply, "model", None),
        input_tokens=prompt,
        output_tokens=completion,
        finish_reasons=[reason],
        content=reply.content,
        tool_calls=reply.tool_calls,
    )


def tick_span(name: str) -> Any:
    """A clock tick's work on a worker (`schedule_tick`): the runs it starts are its children."""
    if not tracing.ENABLED:
        return _OFF
    return _span(name, {})


def delivery_span(*, delivery_id: int, run_traceparent: str | None) -> Any:
    """`deliver`: one attempt of a run's delivery, in the run's trace (its saved traceparent),
    linked to the dispatch that sent it."""
    if not tracing.ENABLED:
        return _OFF
    from opentelemetry import trace
    from opentelemetry.trace import Link

    context = extract({"traceparent": run_traceparent}) if run_traceparent else None
    links = []
    current = trace.get_current_span().get_span_context()
    if context is not None and current.is_valid:
        links.append(Link(current))
    return _span(DELIVER_SPAN, {DELIVERY_ID: str(delivery_id)}, context=context, links=links)


def parked(handle: SpanHandle, *, approval_id: int | None, tool_name: str | None) -> None:
    """The run's span ends with the park: an event, never a span held open across the wait."""
    handle.event(
        PARKED_EVENT,
        {APPROVAL_ID: str(approval_id) if approval_id else None, GEN_AI_TOOL_NAME: tool_name},
    )


# --- content (only with tracing.CAPTURE_CONTENT) ---


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)


def _input_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The conventions' input messages: role and parts (text, tool calls, tool results)."""
    out: list[dict[str, Any]] = []
    for message in messages:
        role = str(message.get("role", "user"))
        parts: list[dict[str, Any]] = []
        if role == "tool":
            parts.append(
                {
                    "type": "tool_call_response",
                    "id": message.get("tool_call_id"),
                    "response": message.get("content"),
                }
            )
        elif message.get("content"):
            parts.append({"type": "text", "content": message.get("content")})
        for call in message.get("tool_calls") or ():
            function = call.get("function", {})
            parts.append(
                {
                    "type": "tool_call",
                    "id": call.get("id"),
                    "name": function.get("name"),
                    "arguments": function.get("arguments"),
                }
            )
        out.append({"role": role, "parts": parts})
    return out


def _output_message(
    content: str | None, tool_calls: Sequence[Any], finish_reasons: Sequence[str]
) -> dict[str, Any]:
    parts: list[dict[str, Any]] = []
    if content:
        parts.append({"type": "text", "content": content})
    for call in tool_calls:
        parts.append(
            {"type": "tool_call", "id": call.id, "name": call.name, "arguments": call.arguments}
        )
    return {
        "role": "assistant",
        "parts": parts,
        "finish_reason": finish_reasons[0] if finish_reasons else "stop",
    }
