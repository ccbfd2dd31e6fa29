"""Model providers behind one interface (`ModelProvider`): `openai` and `builtin`."""

from agent_engine.runtime.providers.base import (
    ModelProvider,
    ModelReply,
    ModelRequest,
    ProviderError,
    ToolCall,
)

__all__ = ["ModelProvider", "ModelReply", "ModelRequest", "ProviderError", "ToolCall"]
