"""The Knowledge Store: the protocol the runtime reads through, its PostgreSQL stand-in, import."""

from agent_engine.knowledge.store import Document, DocumentHit, DocumentRef, KnowledgeStore

__all__ = ["Document", "DocumentHit", "DocumentRef", "KnowledgeStore"]
