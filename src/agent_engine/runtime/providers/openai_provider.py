"""`openai` provider: any OpenAI-compatible Chat Completions endpoint via the official SDK.

The API key is never stored: the model row names the environment variable that holds it. Servers
that need no key (vLLM, Ollama) get a placeholder, because the SDK insists on one.

The request goes through the client's generic `post` (the SDK's documented way to send a request
it has no typed method for) rather than `chat.completions.create`: same client, retries, timeout,
auth, error mapping and `ChatCompletion` parsing, without `create`'s per-call recursive transform
of the messages and tool schemas against the SDK's TypedDicts (a third of the SDK's CPU per call
against a fast server). That transform only renames aliased fields and formats dates/files, and
the plain text messages and function tools built here have neither.
"""

from __future__ import annotations

import os
from typing import Any, cast

import openai
from openai.types.chat import ChatCompletion

from agent_engine.runtime.providers.base import (
    ModelReply,
    ModelRequest,
    ProviderError,
    ToolCall,
    estimate_tokens,
)

MAX_RETRIES = 2
PLACEHOLDER_API_KEY = "not-needed"
MAX_ERROR_DETAIL_CHARS = 500
CHAT_COMPLETIONS_PATH = "/chat/completions"
# What `chat.completions.create` sends: the bearer API key.
_REQUEST_OPTIONS: openai.RequestOptions = {"security": {"bearer_auth": True}}


def api_key_from_env(api_key_env: str | None) -> str:
    if api_key_env:
        value = os.environ.get(api_key_env)
        if value:
            return value
    return PLACEHOLDER_API_KEY


class OpenAIProvider:
    def __init__(
        self,
        *,
        base_url: str | None,
        api_key_env: str | None,
        timeout_seconds: float,
        max_retries: int = MAX_RETRIES,
    ) -> None:
        self.base_url = base_url
        self.timeout_seconds = timeout_seconds
        self.max_retries = max_retries
        self._client = openai.AsyncOpenAI(
            base_url=base_url,
            api_key=api_key_from_env(api_key_env),
            timeout=timeout_seconds,
            max_retries=max_retries,
        )

    @property
    def _where(self) -> str:
        return self.base_url or "the OpenAI API"

    async def complete(self, request: ModelRequest) -> ModelReply:
        body: dict[str, Any] = {"model": request.model, "messages": request.messages}
        if request.tools:
            body["tools"] = request.tools
        try:
            response = await self._client.post(
                CHAT_COMPLETIONS_PATH,
                body=body,
                cast_to=ChatCompletion,
                options=_REQUEST_OPTIONS,
            )
        except openai.APITimeoutError as exc:
            raise ProviderError(
                f"model call timed out after {self.timeout_seconds:g} s"
                f" (model {request.model!r} at {self._where}, {self.max_retries} retries)"
            ) from exc
        except openai.APIStatusError as exc:
            detail = _detail(exc)
            raise ProviderError(
                f"model provider returned HTTP {exc.status_code} for model {request.model!r}"
                f" at {self._where}: {detail}"
            ) from exc
        except openai.APIConnectionError as exc:
            raise ProviderError(
                f"could not reach the model provider at {self._where}: {exc}"
            ) from exc
        except openai.OpenAIError as exc:
            raise ProviderError(f"model provider error ({self._where}): {exc}") from exc
        return _reply(response, request)

    async def aclose(self) -> None:
        await self._client.close()


def _detail(exc: openai.APIStatusError) -> str:
    body = exc.body
    message: object = None
    if isinstance(body, dict):
        error = body.get("error", body)
        message = error.get("message") if isinstance(error, dict) else error
    text = str(message or exc.message or "no detail")
    return text[:MAX_ERROR_DETAIL_CHARS]


def _reply(response: Any, request: ModelRequest) -> ModelReply:
    choices = getattr(response, "choices", None)
    if not choices:
        raise ProviderError(f"model {request.model!r} returned no choices")
    message = choices[0].message
    calls: list[ToolCall] = []
    for call in message.tool_calls or ():
        function = getattr(call, "function", None)
        if function is None:  # a non-function tool call type: nothing we offered
            continue
        calls.append(ToolCall(id=call.id, name=function.name, arguments=function.arguments or ""))
    usage = getattr(response, "usage", None)
    if usage is not None and usage.total_tokens is not None:
        tokens = int(usage.total_tokens)
        prompt = int(usage.prompt_tokens or 0)
        raw = cast(dict[str, Any], usage.model_dump())
    else:
        # No reported usage (some compatible servers): estimate, so budgets still hold.
        prompt = estimate_tokens(request.messages, request.tools)
        tokens = prompt + estimate_tokens(message.content or "", [c.arguments for c in calls])
        raw = {}
    return ModelReply(
        content=message.content,
        tool_calls=tuple(calls),
        tokens_used=tokens,
        raw_usage=raw,
        prompt_tokens=prompt,
    )
