"""Tools offered to the model: the core Knowledge Store tools and the optional-tool registry."""

from agent_engine.runtime.tools.registry import (
    CORE_TOOL_NAMES,
    core_tools,
    optional_tools,
    sync_tool_catalog,
)
from agent_engine.runtime.tools.spec import ToolCallContext, ToolError, ToolSpec

__all__ = [
    "CORE_TOOL_NAMES",
    "ToolCallContext",
    "ToolError",
    "ToolSpec",
    "core_tools",
    "optional_tools",
    "sync_tool_catalog",
]
