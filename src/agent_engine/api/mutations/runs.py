"""Starting and cancelling runs: start is the owner's alone, cancel the owner's or an admin's."""

from __future__ import annotations

import strawberry

from agent_engine.api.access import is_owner, may_see
from agent_engine.api.errors import BadUserInput, Conflict, NotFound, StartRefused
from agent_engine.api.ids import parse_id
from agent_engine.api.mutations.common import owned_agent
from agent_engine.api.resolvers import Info, described_mutation
from agent_engine.api.state import services
from agent_engine.api.types.agents import Run
from agent_engine.db.runs import run_owner, runs_by_id
from agent_engine.domain.gate import AgentNotStartable
from agent_engine.domain.runs import RunTrigger
from agent_engine.runs import cancel as run_cancel
from agent_engine.runs import request as run_request
from agent_engine.runs import retry as run_retry


@strawberry.type
class RunMutation:
    @described_mutation(
        description=(
            "Requests a manual run. Returns the journal row: QUEUED, or SKIPPED with its reason. "
            "A closed start gate is an AGENT_NOT_STARTABLE error and writes no row. The owner "
            "only: FORBIDDEN to an admin on another's agent (it reads the Knowledge Store as "
            "its owner)."
        )
    )
    async def start_run(self, info: Info, agent_id: strawberry.ID) -> Run:
        info.context.require_viewer()
        ident = parse_id(agent_id, "agentId")
        agent = await owned_agent(info, ident, "start it", owner_only=True)
        try:
            row = await run_request.request_run(
                services(info)["engine"],
                ident,
                trigger=RunTrigger.MANUAL,
                now=info.context.now,
                enqueue=services(info)["enqueue"],
                send_wait_seconds=services(info)["settings"].broker_timeout_seconds,
                database_clock=True,
            )
        except run_request.AgentNotFound as exc:
            raise NotFound("agent", ident) from exc
        except AgentNotStartable as exc:
            raise StartRefused(exc) from exc
        return Run.from_row(row, owner_id=agent.user_id)

    @described_mutation(
        description=(
            "Owner only. A FAILED run (reason ERROR or STALE) continues as a new run (trigger "
            "RETRY) from its last completed step: recorded model answers and tool results are "
            "reused, not redone and not counted again; a WRITE call is never made twice. Passes "
            "the start gate like startRun."
        )
    )
    async def retry_run(self, info: Info, run_id: strawberry.ID) -> Run:
        viewer = info.context.require_viewer()
        ident = parse_id(run_id, "runId")
        engine = services(info)["engine"]
        async with engine.connect() as conn:
            found = await runs_by_id(conn, [ident])
            owner = await run_owner(conn, ident) if found else None
        if not found or owner is None or not may_see(viewer, owner):
            raise NotFound("run", ident)
        failed = found[0]
        # Someone else's agent: NOT_FOUND to an owner, FORBIDDEN to an admin (as startRun).
        agent = await owned_agent(info, failed.agent_id, "retry its runs", owner_only=True)
        try:
            run_retry.check_retryable(ident, failed.state, failed.reason)
        except run_retry.NotRetryable as exc:
            raise BadUserInput("runId", str(exc)) from exc
        try:
            row = await run_retry.retry_run(
                engine,
                ident,
                now=info.context.now,
                enqueue=services(info)["enqueue"],
                send_wait_seconds=services(info)["settings"].broker_timeout_seconds,
            )
        except run_retry.NotRetryable as exc:
            raise BadUserInput("runId", str(exc)) from exc
        except run_retry.AlreadyRetried as exc:
            raise Conflict(str(exc)) from exc
        except (run_request.AgentNotFound, LookupError) as exc:
            raise NotFound("run", ident) from exc
        except AgentNotStartable as exc:
            raise StartRefused(exc) from exc
        return Run.from_row(row, owner_id=agent.user_id)

    @described_mutation(
        description=(
            "Stops a QUEUED or RUNNING run: it ends FAILED / CANCELLED (a running one within "
            "seconds, keeping the tokens spent so far). Owner or admin. A finished run is a "
            "CONFLICT."
        )
    )
    async def cancel_run(self, info: Info, run_id: strawberry.ID) -> Run:
        viewer = info.context.require_viewer()
        ident = parse_id(run_id, "runId")
        async with services(info)["engine"].connect() as conn:
            owner = await run_owner(conn, ident)
        if owner is None or not may_see(viewer, owner):
            raise NotFound("run", ident)
        by = "its owner" if is_owner(viewer, owner) else f"an admin (user {viewer.user_id})"
        try:
            row = await run_cancel.cancel_run(
                services(info)["engine"],
                ident,
                error=f"cancelled by {by}",
                # An admin cancelling another owner's run is an admin action.
                audited_actor_id=None if is_owner(viewer, owner) else viewer.user_id,
                owner_id=owner,
            )
        except run_cancel.RunMissing as exc:
            raise NotFound("run", ident) from exc
        except run_cancel.RunFinished as exc:
            raise Conflict(
                f"run {ident} already finished ({exc.state}): nothing to cancel"
            ) from exc
        return Run.from_row(row)
