"""A run's execution as one trace (DESIGN §12, "One trace per run"): the `invoke_agent` span of
each stretch a worker executes, the trace context saved on the run, the park, the resume and the
delivery joining it. The span and attribute names are `observability/tracing.py`'s.

- A fresh run's span is a child of the current one (its message's `process execute_run`, itself a
  child of the API request or the schedule tick that sent it). It is started just before the
  claim (`genai_spans.start_agent_span`), so that the claim's start saves its traceparent on the
  run (`agent_runs.trace_parent`, what `Run.traceId` shows) in the statement it makes anyway.
- A park ends the span with an event naming the approval: no span is held open across the wait.
- The resume (the decision's message, on any worker) is a new `invoke_agent` span whose parent is
  the run's saved context, linked to the decision's request.
- A delivery's attempt is a `deliver` span in the run's trace, linked to its dispatch.

While tracing is off each helper yields at once: no query, no span.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from typing import TypeVar

from sqlalchemy.ext.asyncio import AsyncEngine

from agent_engine.db import run_traces
from agent_engine.domain.runs import RunState
from agent_engine.observability import genai_spans as spans
from agent_engine.observability import tracing
from agent_engine.runs.claim import Claim

T = TypeVar("T")


class TracedRun:
    """The run's span while a worker executes it; `ended(state)` passes the state written on."""

    __slots__ = ("handle", "state")

    def __init__(self, handle: spans.SpanHandle) -> None:
        self.handle = handle
        self.state: RunState | None = None

    def ended(self, state: RunState | None) -> RunState | None:
        self.state = state
        return state


_UNTRACED = TracedRun(spans.NO_SPAN)


@asynccontextmanager
async def traced_run(engine: AsyncEngine, claim: Claim) -> AsyncIterator[TracedRun]:
    ctx = claim.context
    if not tracing.ENABLED or ctx is None:
        yield _UNTRACED
        return
    resumed = claim.resumed
    saved = None
    if resumed is not None:
        # The resume continues the run's trace: its saved context is the new span's parent.
        async with engine.connect() as conn:
            found = await run_traces.load_run_trace(conn, claim.run_id)
        saved = found.trace_parent if found is not None else None
    with spans.agent_span(
        agent_name=ctx.agent_name,
        agent_id=ctx.agent_id,
        run_id=claim.run_id,
        owner_id=ctx.owner_id,
        resume_of=saved,
        # A connection wait's resume has no decision to link (its owner connected or it expired).
        approval_id=getattr(resumed, "approval_id", None),
        # A fresh run's span, started before the claim, which saved its traceparent.
        started=claim.span,
    ) as handle:
        if saved is None and claim.span is None:
            # A run parked before tracing was on: this span's context is the run's from now on.
            traceparent = tracing.current_traceparent()
            if traceparent is not None:
                await run_traces.save_trace_parent(engine, claim.run_id, traceparent)
        traced = TracedRun(handle)
        yield traced
        handle.set(tracing.RUN_OUTCOME, str(traced.state) if traced.state else None)
        if traced.state is RunState.RUNNING:
            pending = await run_traces.pending_approval(engine, claim.run_id)
            spans.parked(
                handle,
                approval_id=pending[0] if pending else None,
                tool_name=pending[1] if pending else None,
            )


@asynccontextmanager
async def traced_delivery(engine: AsyncEngine, delivery_id: int) -> AsyncIterator[None]:
    """One attempt of a run's delivery, in the run's trace."""
    if not tracing.ENABLED:
        yield
        return
    traceparent = await run_traces.delivery_trace_parent(engine, delivery_id)
    with spans.delivery_span(delivery_id=delivery_id, run_traceparent=traceparent):
        yield


async def in_delivery_trace(engine: AsyncEngine, delivery_id: int, attempt: Awaitable[T]) -> T:
    """`attempt` (the delivery's send) inside its `deliver` span."""
    async with traced_delivery(engine, delivery_id):
        return await attempt
