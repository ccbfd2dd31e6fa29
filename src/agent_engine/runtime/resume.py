"""The resume path: a parked run's call once its owner decided (or the wait expired).

`ResumePath` is the part of `Runtime` (`runtime/loop.py`) that takes a `Resume`
(`runtime/park.py`) back into the run: the decided call made at most once (the claim is the
database's compare-and-set) or told to the model as declined, expired or not connected, then the
rest of the parked reply's calls. The step loop continues from there.
"""

from __future__ import annotations

from agent_engine.runtime.authority import Authority, not_connected_message
from agent_engine.runtime.bounded import truncate
from agent_engine.runtime.park import (
    APPROVED,
    CONNECTED,
    WAITS_CONNECTION,
    LoopState,
    Resume,
    RunOutcome,
    call_from_json,
    connection_park,
    decline_message,
    parked_outcome,
)
from agent_engine.runtime.providers.base import ToolCall
from agent_engine.runtime.tool_steps import MAX_ERROR_CHARS, ToolSteps, step_end, tool_error
from agent_engine.runtime.tools.spec import ToolCallContext, ToolFailed, ToolSpec
from agent_engine.runtime.transcript import Transcript


class ResumePath(ToolSteps):
    """The resumed call of a `Runtime`."""

    async def _resumed_calls(
        self,
        tools: dict[str, ToolSpec],
        tool_ctx: ToolCallContext,
        resume: Resume,
        record: Transcript,
        loop: LoopState,
    ) -> RunOutcome | None:
        """The checkpoint's pending call, decided, then the rest of its reply's calls; the
        outcome when the run parks again, else None (the loop goes on from `loop.iteration`)."""
        pending = call_from_json(resume.checkpoint["call"])
        remaining = [call_from_json(c) for c in resume.checkpoint.get("calls", [])]
        decided = await self._decided_call(
            tools, pending, remaining, tool_ctx, resume, record, loop
        )
        if isinstance(decided, RunOutcome):
            return decided  # parked again: now for the owner's connection
        result, error, held = decided
        await record.step_finished(
            resume.step_index, step_end(result, error, tools.get(pending.name), held)
        )
        loop.messages.append({"role": "tool", "tool_call_id": pending.id, "content": result})
        return await self._tool_calls(tools, remaining, tool_ctx, record, loop)

    async def _decided_call(
        self,
        tools: dict[str, ToolSpec],
        call: ToolCall,
        remaining: list[ToolCall],
        tool_ctx: ToolCallContext,
        resume: Resume,
        record: Transcript,
        loop: LoopState,
    ) -> tuple[str, str | None, Authority | None] | RunOutcome:
        """The parked call, once decided: approved (or its owner connected) -> made, at most
        once (`claim_call` is the compare-and-set); declined, or expired -> the model hears it
        as the tool's result. An approved call of an OWNER_OAUTH tool whose owner has no
        CONNECTED account parks again, for the connection (the call not yet claimed)."""
        if resume.waits_for == WAITS_CONNECTION:
            if resume.decision != CONNECTED:
                text, error = tool_error(not_connected_message(resume.source or "its source"))
                return text, error, None
        elif resume.decision != APPROVED:
            text, error = tool_error(decline_message(resume.decision, resume.note))
            return text, error, None
        spec = tools.get(call.name)
        held: Authority | None = None
        if spec is not None and spec.mcp is not None:
            try:
                held = await self.mcp.authority(spec.mcp, tool_ctx)
            except ToolFailed as exc:
                await record.step_finished(
                    resume.step_index,
                    step_end(None, truncate(str(exc), MAX_ERROR_CHARS), spec, None),
                )
                raise
            if held is None:
                checked = self._checked_arguments(spec, call)
                if isinstance(checked, dict):
                    return parked_outcome(
                        loop,
                        connection_park(
                            spec.mcp, checked, resume.step_index, loop.checkpoint(call, remaining)
                        ),
                    )
                return checked[0], checked[1], None
        if not await resume.claim_call():
            raise ToolFailed(
                call.name,
                "an earlier attempt at this approved call may have reached the server;"
                " it is not made twice",
            )
        if spec is None:
            gone, refusal = tool_error(f"the tool '{call.name}' is no longer available")
            return gone, refusal, None
        try:
            result, called_error = await self._call_tool(
                tools, call, tool_ctx, held, approval_id=resume.approval_id
            )
        except ToolFailed as exc:
            await record.step_finished(
                resume.step_index, step_end(None, truncate(str(exc), MAX_ERROR_CHARS), spec, held)
            )
            raise
        return result, called_error, held
