"""A run's tool calls: made in order, checked against the tool's schema, timed out, traced, and
a WRITE call that needs its owner parked (`runtime/park.py`).

`ToolSteps` is the part of `Runtime` (`runtime/loop.py`) that makes the calls of one model
reply; the step loop around it stays in `loop.py`, the resumed call in `runtime/resume.py`. A
tool's own refusal goes back to the model as the tool's result; an infrastructure failure raises
`ToolFailed` and ends the run.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from agent_engine.observability import genai_spans as spans
from agent_engine.runtime.authority import Authority
from agent_engine.runtime.bounded import truncate
from agent_engine.runtime.mcp_calls import McpCalls
from agent_engine.runtime.park import LoopState, Parked, RunOutcome, connection_park, parked_outcome
from agent_engine.runtime.providers.base import ToolCall
from agent_engine.runtime.tools.mcp import check_arguments
from agent_engine.runtime.tools.registry import validate_arguments
from agent_engine.runtime.tools.spec import ToolCallContext, ToolError, ToolFailed, ToolSpec
from agent_engine.runtime.transcript import StepEnd, StepKind, Transcript, step_output, tool_input

log = logging.getLogger("agent_engine.runtime.loop")

MAX_ERROR_CHARS = 2_000


class ToolSteps:
    """The tool calls of a `Runtime`; it sets these attributes."""

    mcp: McpCalls
    _max_tool_result_chars: int
    _tool_timeout_seconds: float

    async def _tool_calls(
        self,
        tools: dict[str, ToolSpec],
        calls: list[ToolCall],
        tool_ctx: ToolCallContext,
        record: Transcript,
        loop: LoopState,
    ) -> RunOutcome | None:
        """Make the calls of one reply in order; a WRITE call that needs the owner parks the run
        (the outcome returned), the rest of the reply's calls wait in the checkpoint."""
        for position, call in enumerate(calls):
            step = await record.step_started(
                StepKind.TOOL_CALL, call.name, tool_input(call.arguments)
            )
            spec = tools.get(call.name)
            error: str | None
            held: Authority | None = None
            if spec is not None and spec.mcp is not None and spec.mcp.needs_approval:
                checked = self._checked_arguments(spec, call)
                if isinstance(checked, dict):
                    # Checked before the owner is asked: they approve a call that can be made.
                    # Approval first; the connection, if the call needs one, after it.
                    return parked_outcome(
                        loop,
                        Parked(
                            tool_id=spec.mcp.id,
                            tool_name=spec.name,
                            input=checked,
                            step_index=step,
                            checkpoint=loop.checkpoint(call, calls[position + 1 :]),
                        ),
                    )
                result, error = checked
            else:
                try:
                    if spec is not None and spec.mcp is not None:
                        held = await self.mcp.authority(spec.mcp, tool_ctx)
                        if held is None:
                            checked = self._checked_arguments(spec, call)
                            if not isinstance(checked, dict):
                                result, error = checked
                                await record.step_finished(
                                    step, step_end(result, error, spec, None)
                                )
                                loop.messages.append(
                                    {"role": "tool", "tool_call_id": call.id, "content": result}
                                )
                                continue
                            return parked_outcome(
                                loop,
                                connection_park(
                                    spec.mcp,
                                    checked,
                                    step,
                                    loop.checkpoint(call, calls[position + 1 :]),
                                ),
                            )
                    result, error = await self._call_tool(tools, call, tool_ctx, held)
                except ToolFailed as exc:
                    await record.step_finished(
                        step, step_end(None, truncate(str(exc), MAX_ERROR_CHARS), spec, held)
                    )
                    raise
            await record.step_finished(step, step_end(result, error, spec, held))
            loop.messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
        return None

    def _checked_arguments(
        self, spec: ToolSpec, call: ToolCall
    ) -> dict[str, Any] | tuple[str, str]:
        """The call's arguments checked against the tool's schema (an MCP tool's JSON Schema in
        full, a built-in tool's flat one with coercion), or the refusal (the result the model
        sees, the error for the transcript)."""
        try:
            raw: Any = json.loads(call.arguments) if call.arguments.strip() else {}
        except json.JSONDecodeError as exc:
            return tool_error(f"the arguments are not valid JSON ({exc.msg})")
        except RecursionError:  # the model's output is untrusted: past Python's parser
            return tool_error("the arguments are nested too deeply")
        check = check_arguments if spec.mcp is not None else validate_arguments
        try:
            return check(spec.parameters, raw)
        except ToolError as exc:
            text, _ = tool_error(str(exc))
            return truncate(text, self._max_tool_result_chars), truncate(str(exc), MAX_ERROR_CHARS)

    async def _call_tool(
        self,
        tools: dict[str, ToolSpec],
        call: ToolCall,
        tool_ctx: ToolCallContext,
        held: Authority | None = None,
        *,
        approval_id: int | None = None,
    ) -> tuple[str, str | None]:
        """The result the model sees, and the error when the model's call was refused (for the
        transcript). A tool that cannot answer (timeout, infrastructure) raises ToolFailed."""
        spec = tools.get(call.name)
        if spec is None:
            return tool_error(
                f"unknown tool '{call.name}'; the available tools are {', '.join(sorted(tools))}"
            )
        authority = held.kind if held is not None else None
        with spans.tool_span(spec, call, approval_id=approval_id, authority=authority) as span:
            result, error = await self._checked_call(spec, call, tool_ctx, held)
            span.result(result, error=error)
        return result, error

    async def _checked_call(
        self, spec: ToolSpec, call: ToolCall, tool_ctx: ToolCallContext, held: Authority | None
    ) -> tuple[str, str | None]:
        arguments = self._checked_arguments(spec, call)
        if not isinstance(arguments, dict):
            return arguments
        try:
            async with asyncio.timeout(self._tool_timeout_seconds):
                if spec.mcp is not None and held is not None:
                    result = await self.mcp.call(spec.mcp, held, tool_ctx, arguments)
                else:
                    result = await spec.handler(tool_ctx, arguments)
        except ToolError as exc:
            text, _ = tool_error(str(exc))
            return truncate(text, self._max_tool_result_chars), truncate(str(exc), MAX_ERROR_CHARS)
        except TimeoutError as exc:
            raise ToolFailed(
                call.name, f"no answer within {self._tool_timeout_seconds:g} s"
            ) from exc
        except ToolFailed:
            raise
        except Exception as exc:
            # Details may hold internals (SQL); they go to the log, the run names the kind.
            log.warning("tool %s failed in run %s", call.name, tool_ctx.run_id, exc_info=True)
            raise ToolFailed(
                call.name, f"{type(exc).__name__} (details in the worker log)"
            ) from exc
        return truncate(str(result), self._max_tool_result_chars), None


def tool_error(message: str) -> tuple[str, str]:
    return f"error: {message}", message


def step_end(
    result: str | None, error: str | None, spec: ToolSpec | None, held: Authority | None
) -> StepEnd:
    """A tool step's end; an MCP tool's names the authority its call carried (or would have:
    the source's kind when no credential was had) and the owner's account."""
    authority_kind = None
    if spec is not None and spec.mcp is not None:
        authority_kind = held.kind if held is not None else spec.mcp.auth
    return StepEnd(
        output=step_output(result),
        error=error,
        authority=authority_kind,
        account=held.account if held is not None else None,
    )
