"""The optional tools shipped with the engine: `current_time`, `calculator`, `previous_output`."""

from __future__ import annotations

from typing import Any

from agent_engine.db import runs as runs_sql
from agent_engine.domain.zones import zone_or_utc
from agent_engine.runtime.tools.calculator import CalculatorError, evaluate, format_number
from agent_engine.runtime.tools.spec import ToolCallContext, ToolError, ToolSpec


async def current_time(ctx: ToolCallContext, args: dict[str, Any]) -> str:
    zone = zone_or_utc(ctx.owner_timezone)
    local = ctx.now.astimezone(zone)
    return f"{local.isoformat(timespec='seconds')} ({local:%A}, time zone {zone.key})"


async def calculator(ctx: ToolCallContext, args: dict[str, Any]) -> str:
    try:
        return format_number(evaluate(str(args["expression"])))
    except CalculatorError as exc:
        raise ToolError(str(exc)) from exc


async def previous_output(ctx: ToolCallContext, args: dict[str, Any]) -> str:
    async with ctx.engine.connect() as conn:
        row = (
            await conn.execute(
                runs_sql.PREVIOUS_OUTPUT, {"agent_id": ctx.agent_id, "run_id": ctx.run_id}
            )
        ).first()
    if row is None:
        return "This agent has no earlier successful run."
    finished = row.finished_at.isoformat(timespec="seconds") if row.finished_at else "unknown"
    return (
        f"Output of this agent's last successful run (finished {finished}):\n\n{row.output or ''}"
    )


_NO_ARGUMENTS: dict[str, Any] = {"type": "object", "properties": {}, "additionalProperties": False}

BUILTIN_TOOLS = (
    ToolSpec(
        name="current_time",
        description="The current date and time in the agent owner's time zone.",
        parameters=_NO_ARGUMENTS,
        handler=current_time,
    ),
    ToolSpec(
        name="calculator",
        description=(
            "Evaluate an arithmetic expression: numbers, + - * / // % ** (or ^), parentheses,"
            " pi, e, and abs round min max sqrt exp log log10 log2 sin cos tan floor ceil."
        ),
        parameters={
            "type": "object",
            "properties": {
                "expression": {"type": "string", "description": "For example (17 * 3) / 4."}
            },
            "required": ["expression"],
            "additionalProperties": False,
        },
        handler=calculator,
    ),
    ToolSpec(
        name="previous_output",
        description=(
            "The final output of this agent's last successful run, to report what changed"
            " since last time."
        ),
        parameters=_NO_ARGUMENTS,
        handler=previous_output,
    ),
)
