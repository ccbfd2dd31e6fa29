"""Mutation fields: parse and check the input, call one function of `agent_engine.agents` (or the
run lifecycle), return the fresh row.

One module per idea; `Mutation` joins them in the order the schema lists its fields. Admins
oversee but do not act as the owner (see api/access.py); the admin-only mutations are FORBIDDEN
to owners.
"""

from __future__ import annotations

import strawberry

from agent_engine.api.mutations.admin import AdminMutation
from agent_engine.api.mutations.agents import AgentMutation
from agent_engine.api.mutations.approvals import ApprovalMutation
from agent_engine.api.mutations.connections import ConnectionMutation
from agent_engine.api.mutations.delivery import AgentDeliveryMutation, DeliveryTargetMutation
from agent_engine.api.mutations.runs import RunMutation
from agent_engine.api.mutations.settings import SettingsMutation
from agent_engine.api.mutations.tool_sources import ToolSourceMutation


@strawberry.type
class Mutation(
    AgentMutation,
    RunMutation,
    ApprovalMutation,
    ConnectionMutation,
    AgentDeliveryMutation,
    AdminMutation,
    DeliveryTargetMutation,
    SettingsMutation,
    ToolSourceMutation,
):
    """The schema lists the fields in the order of these bases."""


__all__ = ["Mutation"]
