"""The agent loop of one run, independent of queues and the run journal.

System prompt = the platform layer, then the owner's prompt. Offered tools = the three core
Knowledge Store tools plus the run's allowed optional tools. Model call → tool calls → results →
model call, until the model answers without tool calls (succeeded) or the iteration cap is hit
(failed/iteration_cap, the text so far kept). A provider error or timeout ends the run
failed/error. A tool's own refusal (bad or unknown arguments, an unknown tool name, a document not
found: `ToolError`) goes back to the model as the tool's result, so it can correct the call; an
infrastructure failure (the Knowledge Store unreachable, a timeout, any other exception) ends the
run failed/error naming the tool -- a run must not succeed on an answer built on nothing.

Where the parts live: this module keeps `Runtime` and the step loop (model call after model
call); the tool calls of a reply are `runtime/tool_steps.py`, the outcome, the checkpoint and
what a parked run keeps are `runtime/park.py`, the resumed call `runtime/resume.py`. The names
the rest of the code imports from here are re-exported.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from datetime import datetime
from types import TracebackType

from sqlalchemy.ext.asyncio import AsyncEngine

from agent_engine.domain.zones import zone_or_utc
from agent_engine.knowledge.postgres import PostgresKnowledgeStore
from agent_engine.knowledge.store import KnowledgeStore
from agent_engine.observability import genai_spans as spans
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
from agent_engine.runtime.park import APPROVED as APPROVED
from agent_engine.runtime.park import CONNECTED as CONNECTED
from agent_engine.runtime.park import EXPIRED as EXPIRED
from agent_engine.runtime.park import FAILED as FAILED
from agent_engine.runtime.park import PARKED as PARKED
from agent_engine.runtime.park import REASON_ERROR as REASON_ERROR
from agent_engine.runtime.park import REASON_ITERATION_CAP as REASON_ITERATION_CAP
from agent_engine.runtime.park import REASON_TOKEN_CAP as REASON_TOKEN_CAP
from agent_engine.runtime.park import SUCCEEDED as SUCCEEDED
from agent_engine.runtime.park import WAITS_APPROVAL as WAITS_APPROVAL
from agent_engine.runtime.park import WAITS_CONNECTION as WAITS_CONNECTION
from agent_engine.runtime.park import LoopState as LoopState
from agent_engine.runtime.park import Parked as Parked
from agent_engine.runtime.park import Resume as Resume
from agent_engine.runtime.park import RunOutcome as RunOutcome
from agent_engine.runtime.park import decline_message as decline_message
from agent_engine.runtime.prefill import Prefill
from agent_engine.runtime.providers.base import (
    Message,
    ModelProvider,
    ModelReply,
    ModelRequest,
    ProviderError,
)
from agent_engine.runtime.providers.builtin import BuiltinProvider
from agent_engine.runtime.providers.openai_provider import OpenAIProvider
from agent_engine.runtime.resume import ResumePath
from agent_engine.runtime.tool_steps import MAX_ERROR_CHARS as MAX_ERROR_CHARS
from agent_engine.runtime.tools.registry import core_tools, optional_tools
from agent_engine.runtime.tools.spec import (
    ToolCallContext,
    ToolSpec,
)
from agent_engine.runtime.tools.spec import ToolFailed as ToolFailed
from agent_engine.runtime.transcript import (
    StepEnd,
    StepKind,
    Transcript,
    no_transcript,
    step_output,
)

log = logging.getLogger(__name__)

DEFAULT_MODEL_TIMEOUT_SECONDS = 120.0
DEFAULT_TOOL_TIMEOUT_SECONDS = 30.0
DEFAULT_MAX_OUTPUT_CHARS = 100_000
DEFAULT_MAX_TOOL_RESULT_CHARS = 20_000


def compose_system_prompt(platform_prompt: str, owner_prompt: str) -> str:
    """The platform layer first, the owner's layer beneath it."""
    return "\n\n".join(p.strip() for p in (platform_prompt, owner_prompt) if p and p.strip())


class Runtime(ResumePath):
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
        loop = LoopState()

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
                parked = await self._resumed_calls(tools, tool_ctx, resume, record, loop)
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
                    with spans.chat_span(ctx.model.provider, request) as span:
                        answer = await self.fallbacks.complete(
                            ctx, request, provider_for=self._provider, credentials=self.credentials
                        )
                        spans.model_reply(span, answer.reply)
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


def _prefilled(loop: LoopState, prefill: Prefill) -> int:
    """Start from a retried run's conversation; returns the first model call still to make."""
    loop.messages.extend(prefill.messages)
    loop.texts.extend(prefill.texts)
    loop.iteration = prefill.iterations
    return prefill.iterations + 1


def _over_token_cap(ctx: RunContext, loop: LoopState) -> str | None:
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
