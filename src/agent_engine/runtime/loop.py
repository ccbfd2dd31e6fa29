"""The agent loop of one run, independent of queues and the run journal.

System prompt = the platform layer, then the owner's prompt. Offered tools = the three core
Knowledge Store tools plus the run's allowed optional tools. Model call → tool calls → results →
model call, until the model answers without tool calls (succeeded) or the iteration cap is hit
(failed/iteration_cap, the text so far kept). A provider error or timeout ends the run
failed/error. A tool's own refusal (bad or unknown arguments, an unknown tool name, a document not
found: `ToolError`) goes back to the model as the tool's result, so it can correct the call; an
infrastructure failure (the Knowledge Store unreachable, a timeout, any other exception) ends the
run failed/error naming the tool -- a run must not succeed on an answer built on nothing.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from types import TracebackType
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from agent_engine.domain.zones import zone_or_utc
from agent_engine.knowledge.postgres import PostgresKnowledgeStore
from agent_engine.knowledge.store import KnowledgeStore
from agent_engine.observability import tracing
from agent_engine.runtime.authority import Authority, not_connected_message
from agent_engine.runtime.bounded import truncate as truncate
from agent_engine.runtime.context import ModelSpec, RunContext
from agent_engine.runtime.credentials import CredentialGuard, CredentialRefused
from agent_engine.runtime.fallback import (
    DEFAULT_BREAKER_OPEN_SECONDS,
    DEFAULT_RATE_LIMIT_WAIT_SECONDS,
    ChainFailed,
    Fallbacks,
)
from agent_engine.runtime.mcp_calls import McpCalls
from agent_engine.runtime.prefill import Prefill
from agent_engine.runtime.providers.base import (
    Message,
    ModelProvider,
    ModelReply,
    ModelRequest,
    ProviderError,
    ToolCall,
)
from agent_engine.runtime.providers.builtin import BuiltinProvider
from agent_engine.runtime.providers.openai_provider import OpenAIProvider
from agent_engine.runtime.tools.mcp import check_arguments
from agent_engine.runtime.tools.registry import core_tools, optional_tools, validate_arguments
from agent_engine.runtime.tools.spec import (
    McpTool,
    ToolCallContext,
    ToolError,
    ToolSpec,
)
from agent_engine.runtime.tools.spec import ToolFailed as ToolFailed
from agent_engine.runtime.transcript import (
    StepEnd,
    StepKind,
    Transcript,
    no_transcript,
    step_output,
    tool_input,
)

log = logging.getLogger(__name__)

DEFAULT_MODEL_TIMEOUT_SECONDS = 120.0
DEFAULT_TOOL_TIMEOUT_SECONDS = 30.0
DEFAULT_MAX_OUTPUT_CHARS = 100_000
DEFAULT_MAX_TOOL_RESULT_CHARS = 20_000
MAX_ERROR_CHARS = 2_000

SUCCEEDED = "succeeded"
FAILED = "failed"
# Not a run state: the run stays running, waiting for its owner (`RunOutcome.parked`).
PARKED = "parked"
APPROVED = "approved"
EXPIRED = "expired"
CONNECTED = "connected"
# What a parked run waits for (`Parked.waits_for`, `Resume.waits_for`).
WAITS_APPROVAL = "approval"
WAITS_CONNECTION = "connection"
REASON_ITERATION_CAP = "iteration_cap"
REASON_ERROR = "error"
REASON_TOKEN_CAP = "token_cap"


@dataclass(frozen=True)
class RunOutcome:
    state: str  # "succeeded" | "failed"
    reason: str | None  # None | "iteration_cap" | "error"
    output: str | None
    error: str | None
    tokens_used: int
    # The provider's split of tokens_used (prompt + completion = tokens_used).
    prompt_tokens: int = 0
    completion_tokens: int = 0
    # state "parked": the WRITE call waiting for the owner, and where to resume.
    parked: Parked | None = None


@dataclass(frozen=True)
class Parked:
    tool_id: int
    tool_name: str
    input: dict[str, Any]
    step_index: int
    checkpoint: dict[str, Any]
    # "approval" (a WRITE call for the owner to decide) or "connection" (an OWNER_OAUTH call
    # whose owner has no CONNECTED account at `source`).
    waits_for: str = WAITS_APPROVAL
    source_id: int | None = None
    source: str | None = None


@dataclass(frozen=True)
class Resume:
    """A parked run's way back: its checkpoint, the decision, and the compare-and-set that lets
    exactly one attempt make an approved call."""

    checkpoint: dict[str, Any]
    # approval: "approved" | "declined" | "expired"; connection: "connected" | "expired"
    decision: str
    note: str | None
    step_index: int
    claim_call: Callable[[], Awaitable[bool]]
    # The approval decided (the resumed call's `execute_tool` span names it).
    approval_id: int | None = None
    waits_for: str = WAITS_APPROVAL
    # connection: the source whose account the run waited for (what the model hears).
    source: str | None = None


@dataclass
class _LoopState:
    """What the loop carries from one model call to the next (and into a checkpoint)."""

    messages: list[Message] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    iteration: int = 0
    tokens: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0

    def checkpoint(self, call: ToolCall, rest: list[ToolCall]) -> dict[str, Any]:
        return {
            "version": 1,
            "messages": self.messages,
            "texts": self.texts,
            "iteration": self.iteration,
            "tokens": self.tokens,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "call": _call_json(call),
            "calls": [_call_json(c) for c in rest],
        }

    def restore(self, checkpoint: dict[str, Any]) -> None:
        self.messages = list(checkpoint["messages"])
        self.texts = list(checkpoint.get("texts", []))
        self.iteration = int(checkpoint["iteration"])
        self.tokens = int(checkpoint.get("tokens", 0))
        self.prompt_tokens = int(checkpoint.get("prompt_tokens", 0))
        self.completion_tokens = int(checkpoint.get("completion_tokens", 0))


def _call_json(call: ToolCall) -> dict[str, str]:
    return {"id": call.id, "name": call.name, "arguments": call.arguments}


def _call_from_json(value: dict[str, Any]) -> ToolCall:
    return ToolCall(id=str(value["id"]), name=str(value["name"]), arguments=str(value["arguments"]))


def decline_message(decision: str, note: str | None) -> str:
    """What the model hears for a call the owner did not approve."""
    if decision == EXPIRED:
        text = "the owner declined this call (no decision before the approval expired)"
    else:
        text = "the owner declined this call"
    return f"{text}; their note: {note}" if note else text


def compose_system_prompt(platform_prompt: str, owner_prompt: str) -> str:
    """The platform layer first, the owner's layer beneath it."""
    return "\n\n".join(p.strip() for p in (platform_prompt, owner_prompt) if p and p.strip())


class Runtime:
    """Executes runs. One per process and event loop (like the AsyncEngine it reads through);
    model clients are cached per endpoint and closed by `aclose()` / `async with`."""

    def __init__(
        self,
        engine: AsyncEngine,
        *,
        knowledge: KnowledgeStore | None = None,
        model_timeout_seconds: float = DEFAULT_MODEL_TIMEOUT_SECONDS,
        max_output_chars: int = DEFAULT_MAX_OUTPUT_CHARS,
        max_tool_result_chars: int = DEFAULT_MAX_TOOL_RESULT_CHARS,
        tool_timeout_seconds: float = DEFAULT_TOOL_TIMEOUT_SECONDS,
        model_concurrency: int = 1,
        credentials: CredentialGuard | None = None,
        breaker_open_seconds: float = DEFAULT_BREAKER_OPEN_SECONDS,
        rate_limit_wait_seconds: float = DEFAULT_RATE_LIMIT_WAIT_SECONDS,
    ) -> None:
        """`model_concurrency`: how many model calls this runtime may have in flight at once
        (a worker's in-flight limit); providers size their connection pools by it.
        `credentials` checks a model's key variable before every call (default: the rule with
        no allow-list, the delivery targets read from `engine`). `breaker_open_seconds`: how long
        a model that was down is skipped for its fallback; `rate_limit_wait_seconds`: how long a
        model with a fallback waits out rate limits (runtime/fallback.py)."""
        self._engine = engine
        self.credentials = credentials or CredentialGuard(engine)
        self._knowledge: KnowledgeStore = knowledge or PostgresKnowledgeStore(engine)
        self._model_timeout_seconds = model_timeout_seconds
        self._max_output_chars = max_output_chars
        self._max_tool_result_chars = max_tool_result_chars
        self._tool_timeout_seconds = tool_timeout_seconds
        self._model_concurrency = model_concurrency
        self.fallbacks = Fallbacks(
            engine,
            breaker_open_seconds=breaker_open_seconds,
            rate_limit_wait_seconds=rate_limit_wait_seconds,
        )
        # (base_url, api_key_env) -> (api key it was made with, provider)
        self._openai: dict[tuple[str | None, str | None], tuple[str, OpenAIProvider]] = {}
        self._retired: list[OpenAIProvider] = []
        self._builtin = BuiltinProvider()
        self._loop: asyncio.AbstractEventLoop | None = None
        # MCP calls: the authority each carries, one pooled session per server and credential
        # (per owner and server for OWNER_OAUTH) for this process: no handshake per call.
        self.mcp = McpCalls(engine, self.credentials, timeout_seconds=tool_timeout_seconds)
        self.mcp_sessions = self.mcp.sessions

    async def __aenter__(self) -> Runtime:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        providers = [provider for _, provider in self._openai.values()] + self._retired
        self._openai.clear()
        self._retired = []
        for provider in providers:
            await provider.aclose()
        await self.mcp.aclose()

    def toolset(self, ctx: RunContext) -> dict[str, ToolSpec]:
        """Core tools, then the run's optional tools that the registry still has, then its
        allowed MCP tools."""
        tools = core_tools()
        registered = optional_tools()
        for name in ctx.optional_tools:
            if name in registered and name not in tools:
                tools[name] = registered[name]
        for tool in ctx.mcp_tools:
            if tool.name not in tools:
                tools[tool.name] = ToolSpec(
                    name=tool.name,
                    description=tool.description,
                    parameters=tool.input_schema,
                    handler=self.mcp.handler(tool),
                    mcp=tool,
                )
        return tools

    async def execute(
        self,
        ctx: RunContext,
        *,
        now: datetime,
        on_tokens: Callable[[int], None] | None = None,
        deadline: float | None = None,
        on_usage: Callable[[int, int], None] | None = None,
        transcript: Transcript | None = None,
        resume: Resume | None = None,
        prefill: Prefill | None = None,
    ) -> RunOutcome:
        """Run the loop. `on_tokens` gets the running total after each model call, `on_usage`
        the running (prompt, completion) split. `deadline` (event-loop time) is the run's
        wall-clock end: providers wait out rate limits only up to it. Every model call and tool
        call is reported to `transcript` as it starts and as it ends (the run's steps).

        A WRITE call the owner has not auto-approved ends this call PARKED, with the checkpoint
        to resume from (`RunOutcome.parked`); `resume` continues a parked run from it once the
        owner decided (or the approval expired). `prefill` starts a retry run from the failed
        run's conversation (`runtime.prefill`): its model calls are not made again."""
        record = transcript if transcript is not None else no_transcript()
        loop = _LoopState()

        def partial() -> str | None:
            joined = "\n\n".join(loop.texts).strip()
            return truncate(joined, self._max_output_chars) if joined else None

        def failed(reason: str, error: str) -> RunOutcome:
            return RunOutcome(
                FAILED,
                reason,
                partial(),
                truncate(error, MAX_ERROR_CHARS),
                loop.tokens,
                loop.prompt_tokens,
                loop.completion_tokens,
            )

        def report() -> None:
            if on_tokens is not None:
                on_tokens(loop.tokens)
            if on_usage is not None:
                on_usage(loop.prompt_tokens, loop.completion_tokens)

        try:
            await self._provider(ctx.model)  # an unknown provider fails the run before its start
            tools = self.toolset(ctx)
            schemas = [spec.openai_schema() for spec in tools.values()]
            tool_ctx = ToolCallContext(
                run_id=ctx.run_id,
                agent_id=ctx.agent_id,
                owner_id=ctx.owner_id,
                owner_timezone=ctx.owner_timezone,
                now=now,
                knowledge=self._knowledge,
                engine=self._engine,
            )
            cap = max(ctx.iteration_cap, 1)
            first = 1
            if resume is None:
                loop.messages = self._opening(ctx, now)
                if prefill is not None:
                    first = _prefilled(loop, prefill)
            else:
                loop.restore(resume.checkpoint)
                report()
                pending = _call_from_json(resume.checkpoint["call"])
                remaining = [_call_from_json(c) for c in resume.checkpoint.get("calls", [])]
                decided = await self._decided_call(
                    tools, pending, remaining, tool_ctx, resume, record, loop
                )
                if isinstance(decided, RunOutcome):
                    return decided  # parked again: now for the owner's connection
                result, error, held = decided
                await record.step_finished(
                    resume.step_index, _step_end(result, error, tools.get(pending.name), held)
                )
                loop.messages.append(
                    {"role": "tool", "tool_call_id": pending.id, "content": result}
                )
                parked = await self._tool_calls(tools, remaining, tool_ctx, record, loop)
                if parked is not None:
                    return parked
                first = loop.iteration + 1
            for iteration in range(first, cap + 1):
                loop.iteration = iteration
                request = ModelRequest(
                    model=ctx.model.model,
                    messages=list(loop.messages),
                    tools=schemas,
                    owner_prompt=ctx.prompt,
                    deadline=deadline,
                )
                step = await record.step_started(StepKind.MODEL_CALL, ctx.model.model)
                try:
                    # The run's model, or the next of its chain when it is down (fallback.py).
                    with tracing.chat_span(ctx.model.provider, request) as span:
                        answer = await self.fallbacks.complete(
                            ctx, request, provider_for=self._provider, credentials=self.credentials
                        )
                        tracing.model_reply(span, answer.reply)
                except (ProviderError, CredentialRefused) as exc:
                    refused = _model_error(ctx.model, exc)
                    await record.step_finished(
                        step, StepEnd(error=truncate(refused, MAX_ERROR_CHARS))
                    )
                    return failed(REASON_ERROR, refused)
                reply = answer.reply
                loop.tokens += max(reply.tokens_used, 0)
                prompt, completion = usage_split(reply)
                loop.prompt_tokens += prompt
                loop.completion_tokens += completion
                await record.step_finished(
                    step,
                    StepEnd(
                        output=step_output(reply.content or ""),
                        prompt_tokens=prompt,
                        completion_tokens=completion,
                        fallback=answer.fallback,
                    ),
                )
                report()
                if reply.content and reply.content.strip():
                    loop.texts.append(reply.content.strip())
                over = _over_token_cap(ctx, loop)
                if over is not None:
                    return failed(REASON_TOKEN_CAP, over)
                if not reply.tool_calls:
                    output = truncate(reply.content or "", self._max_output_chars)
                    return RunOutcome(
                        SUCCEEDED,
                        None,
                        output,
                        None,
                        loop.tokens,
                        loop.prompt_tokens,
                        loop.completion_tokens,
                    )
                if iteration == cap:
                    break
                loop.messages.append(_assistant_message(reply))
                parked = await self._tool_calls(
                    tools, list(reply.tool_calls), tool_ctx, record, loop
                )
                if parked is not None:
                    return parked
            return failed(
                REASON_ITERATION_CAP,
                f"no final answer after {cap} model calls (the platform's iteration cap)",
            )
        except ProviderError as exc:
            return failed(REASON_ERROR, _model_error(ctx.model, exc))
        except ToolFailed as exc:
            return failed(REASON_ERROR, str(exc))
        except Exception as exc:
            # The exception's text may name hosts or SQL: it goes to the log only.
            log.exception("run %s failed inside the runtime", ctx.run_id)
            return failed(
                REASON_ERROR, f"internal error ({type(exc).__name__}; details in the worker log)"
            )

    async def _tool_calls(
        self,
        tools: dict[str, ToolSpec],
        calls: list[ToolCall],
        tool_ctx: ToolCallContext,
        record: Transcript,
        loop: _LoopState,
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
                    return _parked(
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
                                    step, _step_end(result, error, spec, None)
                                )
                                loop.messages.append(
                                    {"role": "tool", "tool_call_id": call.id, "content": result}
                                )
                                continue
                            return _parked(
                                loop,
                                _connection_park(
                                    spec.mcp,
                                    checked,
                                    step,
                                    loop.checkpoint(call, calls[position + 1 :]),
                                ),
                            )
                    result, error = await self._call_tool(tools, call, tool_ctx, held)
                except ToolFailed as exc:
                    await record.step_finished(
                        step, _step_end(None, truncate(str(exc), MAX_ERROR_CHARS), spec, held)
                    )
                    raise
            await record.step_finished(step, _step_end(result, error, spec, held))
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
            return _tool_error(f"the arguments are not valid JSON ({exc.msg})")
        except RecursionError:  # the model's output is untrusted: past Python's parser
            return _tool_error("the arguments are nested too deeply")
        check = check_arguments if spec.mcp is not None else validate_arguments
        try:
            return check(spec.parameters, raw)
        except ToolError as exc:
            text, _ = _tool_error(str(exc))
            return truncate(text, self._max_tool_result_chars), truncate(str(exc), MAX_ERROR_CHARS)

    async def _decided_call(
        self,
        tools: dict[str, ToolSpec],
        call: ToolCall,
        remaining: list[ToolCall],
        tool_ctx: ToolCallContext,
        resume: Resume,
        record: Transcript,
        loop: _LoopState,
    ) -> tuple[str, str | None, Authority | None] | RunOutcome:
        """The parked call, once decided: approved (or its owner connected) -> made, at most
        once (`claim_call` is the compare-and-set); declined, or expired -> the model hears it
        as the tool's result. An approved call of an OWNER_OAUTH tool whose owner has no
        CONNECTED account parks again, for the connection (the call not yet claimed)."""
        if resume.waits_for == WAITS_CONNECTION:
            if resume.decision != CONNECTED:
                text, error = _tool_error(not_connected_message(resume.source or "its source"))
                return text, error, None
        elif resume.decision != APPROVED:
            text, error = _tool_error(decline_message(resume.decision, resume.note))
            return text, error, None
        spec = tools.get(call.name)
        held: Authority | None = None
        if spec is not None and spec.mcp is not None:
            try:
                held = await self.mcp.authority(spec.mcp, tool_ctx)
            except ToolFailed as exc:
                await record.step_finished(
                    resume.step_index,
                    _step_end(None, truncate(str(exc), MAX_ERROR_CHARS), spec, None),
                )
                raise
            if held is None:
                checked = self._checked_arguments(spec, call)
                if isinstance(checked, dict):
                    return _parked(
                        loop,
                        _connection_park(
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
            gone, refusal = _tool_error(f"the tool '{call.name}' is no longer available")
            return gone, refusal, None
        try:
            result, called_error = await self._call_tool(
                tools, call, tool_ctx, held, approval_id=resume.approval_id
            )
        except ToolFailed as exc:
            await record.step_finished(
                resume.step_index, _step_end(None, truncate(str(exc), MAX_ERROR_CHARS), spec, held)
            )
            raise
        return result, called_error, held

    def _opening(self, ctx: RunContext, now: datetime) -> list[Message]:
        zone = zone_or_utc(ctx.owner_timezone)
        local = now.astimezone(zone).isoformat(timespec="minutes")
        return [
            {"role": "system", "content": compose_system_prompt(ctx.platform_prompt, ctx.prompt)},
            {
                "role": "user",
                "content": (
                    f"Run started at {local} ({zone.key}). Carry out your instructions now:"
                    " use the tools where they help, then give your final answer."
                ),
            },
        ]

    async def _provider(self, model: ModelSpec) -> ModelProvider:
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            if self._openai:
                # Their connections belong to the other loop and cannot be closed from here.
                raise RuntimeError("a Runtime serves one event loop; create one per loop")
            self._loop = loop
        if model.provider == "builtin":
            return self._builtin
        if model.provider != "openai":
            raise ProviderError(f"unknown provider {model.provider!r}")
        key = (model.base_url, model.api_key_env)
        api_key = os.environ.get(model.api_key_env or "", "") if model.api_key_env else ""
        cached = self._openai.get(key)
        if cached is not None and cached[0] == api_key:
            return cached[1]
        if cached is not None:
            # The key was rotated. Runs in flight may still use the old client: close it later.
            self._retired.append(cached[1])
        provider = OpenAIProvider(
            base_url=model.base_url,
            api_key_env=model.api_key_env,
            timeout_seconds=self._model_timeout_seconds,
            concurrency=self._model_concurrency,
        )
        self._openai[key] = (api_key, provider)
        return provider

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
            return _tool_error(
                f"unknown tool '{call.name}'; the available tools are {', '.join(sorted(tools))}"
            )
        authority = held.kind if held is not None else None
        with tracing.tool_span(spec, call, approval_id=approval_id, authority=authority) as span:
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
            text, _ = _tool_error(str(exc))
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


def _prefilled(loop: _LoopState, prefill: Prefill) -> int:
    """Start from a retried run's conversation; returns the first model call still to make."""
    loop.messages.extend(prefill.messages)
    loop.texts.extend(prefill.texts)
    loop.iteration = prefill.iterations
    return prefill.iterations + 1


def _over_token_cap(ctx: RunContext, loop: _LoopState) -> str | None:
    """After a model call: why the run stops when its tokens passed the agent's cap per run
    (its own calls only: a retry's reused steps do not count), else None."""
    cap = ctx.max_tokens_per_run
    if cap is None or loop.tokens <= cap:
        return None
    return (
        f"the run used {loop.tokens} tokens, past its agent's cap of {cap} tokens per run"
        " (maxTokensPerRun); it stopped after the model call that passed it"
    )


def _model_error(model: ModelSpec, exc: Exception) -> str:
    """What the owner reads: the model's name and the kind of failure (the provider's message
    holds no URL, host or reply body; those went to the worker log)."""
    if isinstance(exc, CredentialRefused):
        return str(exc)
    if isinstance(exc, ChainFailed):  # a fallback model failed last
        return f"{exc.model.label} failed: {exc}"
    return f"{model.label} failed: {exc}"


def _tool_error(message: str) -> tuple[str, str]:
    return f"error: {message}", message


def _step_end(
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


def _connection_park(
    tool: McpTool, arguments: dict[str, Any], step_index: int, checkpoint: dict[str, Any]
) -> Parked:
    return Parked(
        tool_id=tool.id,
        tool_name=tool.name,
        input=arguments,
        step_index=step_index,
        checkpoint=checkpoint,
        waits_for=WAITS_CONNECTION,
        source_id=tool.source_id,
        source=tool.source,
    )


def _parked(loop: _LoopState, parked: Parked) -> RunOutcome:
    return RunOutcome(
        PARKED,
        None,
        None,
        None,
        loop.tokens,
        loop.prompt_tokens,
        loop.completion_tokens,
        parked=parked,
    )


def usage_split(reply: ModelReply) -> tuple[int, int]:
    """(prompt, completion) of one reply, summing to its `tokens_used`. Without a reported split
    (an estimate, a server without usage) every token counts as a prompt token."""
    used = max(reply.tokens_used, 0)
    prompt = reply.raw_usage.get("prompt_tokens")
    if isinstance(prompt, int) and not isinstance(prompt, bool) and prompt >= 0:
        prompt = min(prompt, used)
        return prompt, used - prompt
    return used, 0


def _assistant_message(reply: ModelReply) -> Message:
    return {
        "role": "assistant",
        "content": reply.content,
        "tool_calls": [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.name, "arguments": call.arguments},
            }
            for call in reply.tool_calls
        ],
    }
