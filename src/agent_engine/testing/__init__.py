"""Test support shipped with the package: real fakes of external services (never mocks)."""

from agent_engine.testing.fake_openai import (
    FakeOpenAIServer,
    FakeReply,
    FakeToolCall,
    error_reply,
    raw_reply,
    text_reply,
    tool_reply,
    truncated_reply,
)

__all__ = [
    "FakeOpenAIServer",
    "FakeReply",
    "FakeToolCall",
    "error_reply",
    "raw_reply",
    "text_reply",
    "tool_reply",
    "truncated_reply",
]
