"""Refusals of definition writes; the API turns them into coded GraphQL errors."""

from __future__ import annotations


class DefinitionError(Exception):
    pass


class Missing(DefinitionError):
    """A referenced row does not exist (or is not visible to the caller)."""

    def __init__(self, what: str, ident: int) -> None:
        super().__init__(f"{what} {ident} not found")
        self.what = what
        self.ident = ident


class ToolsNotAllowed(DefinitionError):
    """Tools that do not exist or are not allowed for agents now."""

    def __init__(self, tool_ids: list[int]) -> None:
        listed = ", ".join(str(t) for t in tool_ids)
        super().__init__(f"tools not allowed for agents now (or unknown): {listed}")
        self.tool_ids = tool_ids


class UnderReview(DefinitionError):
    """An admin paused the agent: its owner may not delete it while the pause holds."""

    def __init__(self, agent_id: int, note: str | None) -> None:
        message = (
            f"agent {agent_id} is paused by an admin (under review) and cannot be deleted by"
            " its owner until an admin unpauses it"
        )
        super().__init__(message + (f"; the admin's note: {note}" if note else ""))
        self.agent_id = agent_id
        self.note = note


class ModelMissing(DefinitionError):
    def __init__(self, model_id: int) -> None:
        super().__init__(f"model {model_id} is not on the allowed list")
        self.model_id = model_id


class Contended(DefinitionError):
    """A concurrent write won (e.g. two admins setting a default model at once)."""


class TooManyAgents(DefinitionError):
    """The owner already has the most agents an owner may have."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"an owner may have at most {limit} agents: delete one first")
        self.limit = limit
