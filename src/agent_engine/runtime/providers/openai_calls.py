"""The three ways the `openai` provider (`openai_provider.py`) sends one chat call, and how a
reply becomes a `ModelReply`.

- `WireCall`: one HTTP/1.1 exchange on the provider's own keep-alive connections
  (`wire.WirePool`), where the SDK's client would connect directly (no proxy);
- `ThinCall`: one POST on the SDK client's own `httpx2` client (proxies, redirects);
- `SdkCall`: the SDK's generic `post(..., cast_to=ChatCompletion)`, the tests' reference.

Each raises the SDK's errors (its classes and their mapping), so the provider's retry policy
reads the same exceptions whichever call it made. Replies are read at most
`MAX_MODEL_REPLY_BYTES`; without reported usage their tokens are estimated.
"""

from __future__ import annotations

import logging
import ssl
from typing import Any, cast

import anyio
import httpx2  # the SDK's HTTP client (its dependency)
import openai
import orjson
from openai.types.chat import ChatCompletion

from agent_engine.bounded_reads import BodyTooLarge, read_capped
from agent_engine.runtime.providers import wire
from agent_engine.runtime.providers.base import (
    ModelReply,
    ModelRequest,
    ProviderError,
    ToolCall,
    estimate_tokens,
)

# The provider's logger: a call's warnings read as before the split.
log = logging.getLogger("agent_engine.runtime.providers.openai_provider")


# Connections to one endpoint at once on the wire (as the SDK's client allows).
WIRE_MAX_CONNECTIONS = 1000


# A chat completion larger than this (counted as read, decoded) fails the call: a million tokens
# of text would be smaller; an endpoint sending more is broken or hostile, and the worker's
# memory is bounded. (`SdkCall`, the tests' reference path, reads as the SDK reads.)
MAX_MODEL_REPLY_BYTES = 4_000_000


CHAT_COMPLETIONS_PATH = "/chat/completions"
# What `chat.completions.create` sends: the bearer API key.
_REQUEST_OPTIONS: openai.RequestOptions = {"security": {"bearer_auth": True}}
# What the SDK turns into `APIConnectionError` (its own list: transport errors, TLS failures
# anyio does not map, a body cut short).
_CONNECTION_ERRORS = (httpx2.RequestError, ssl.SSLError, anyio.EndOfStream)


def _no_choices(request: ModelRequest) -> ProviderError:
    log.warning("model %r answered without choices", request.model)
    return ProviderError("bad response from the provider (no choices)")


def _reply(response: Any, request: ModelRequest) -> ModelReply:
    choices = getattr(response, "choices", None)
    if not choices:
        raise _no_choices(request)
    message = choices[0].message
    calls: list[ToolCall] = []
    for call in message.tool_calls or ():
        function = getattr(call, "function", None)
        if function is None:  # a non-function tool call type: nothing we offered
            continue
        calls.append(ToolCall(id=call.id, name=function.name, arguments=function.arguments or ""))
    usage = getattr(response, "usage", None)
    return _model_reply(
        request,
        content=message.content,
        calls=calls,
        usage=None if usage is None else cast(dict[str, Any], usage.model_dump()),
    )


def _model_reply(
    request: ModelRequest,
    *,
    content: str | None,
    calls: list[ToolCall],
    usage: dict[str, Any] | None,
) -> ModelReply:
    """The reply with its tokens: as the provider reported them (`usage`), else estimated."""
    if usage is not None and usage.get("total_tokens") is not None:
        tokens = int(usage["total_tokens"])
        prompt = int(usage.get("prompt_tokens") or 0)
        raw = dict(usage)
    else:
        # No reported usage (some compatible servers): estimate, so budgets still hold.
        prompt = estimate_tokens(request.messages, request.tools)
        tokens = prompt + estimate_tokens(content or "", [c.arguments for c in calls])
        raw = {}
    return ModelReply(
        content=content,
        tool_calls=tuple(calls),
        tokens_used=tokens,
        raw_usage=raw,
        prompt_tokens=prompt,
    )


class SdkCall:
    """The chat call through the SDK's generic `post` (parsed into a `ChatCompletion`)."""

    def __init__(self, client: openai.AsyncOpenAI) -> None:
        self._client = client

    async def __call__(self, body: dict[str, Any], request: ModelRequest) -> ModelReply:
        response = await self._client.post(
            CHAT_COMPLETIONS_PATH, body=body, cast_to=ChatCompletion, options=_REQUEST_OPTIONS
        )
        return _reply(response, request)


class ThinCall:
    """The chat call as one POST on the SDK client's `httpx2` client, raising the SDK's errors.

    Built once per client: the URL (the SDK's base URL joined as it joins it), the headers the
    SDK sends by default (user agent, JSON, the bearer key) and the client's timeout.
    """

    def __init__(self, client: openai.AsyncOpenAI) -> None:
        self.client = client
        base = client.base_url
        self.url = base.copy_with(
            raw_path=base.raw_path + CHAT_COMPLETIONS_PATH.lstrip("/").encode()
        )
        headers = {**client.default_headers, **client.auth_headers}
        # The SDK leaves out headers set to its `Omit` marker (unset organisation, project).
        self.headers = [(key, value) for key, value in headers.items() if isinstance(value, str)]
        self.timeout = _client_timeout(client)
        self._extensions = {"timeout": self.timeout.as_dict()}

    async def __call__(self, body: dict[str, Any], request: ModelRequest) -> ModelReply:
        http = self.client._client
        sent = httpx2.Request(
            "POST",
            self.url,
            headers=self.headers,
            content=orjson.dumps(body),
            extensions=self._extensions,
        )
        try:
            response = await _read(await http.send(sent, stream=True))
        except httpx2.TimeoutException as exc:
            raise openai.APITimeoutError(request=sent) from exc
        except openai.OpenAIError:
            raise
        except _CONNECTION_ERRORS as exc:
            raise openai.APIConnectionError(request=sent) from exc
        if response.status_code >= 400:
            raise self.client._make_status_error_from_response(response)
        return _reply_from_json(_json_of(response), request)


def connects_directly(client: openai.AsyncOpenAI) -> bool:
    """True when the SDK's client would connect to the endpoint itself: HTTP or HTTPS, and no
    proxy mounted (`HTTPS_PROXY` and the like, read by the client from the environment)."""
    http = client._client
    return client.base_url.scheme in ("http", "https") and not http._mounts


def wire_pool(call: ThinCall, tls: ssl.SSLContext) -> wire.WirePool:
    url = call.url
    https = url.scheme == "https"
    timeout = call.timeout
    return wire.WirePool(
        url.host,
        url.port or (443 if https else 80),
        tls=tls if https else None,
        timeouts=wire.Timeouts(connect=timeout.connect, read=timeout.read, pool=timeout.pool),
        max_connections=WIRE_MAX_CONNECTIONS,
        max_body_bytes=MAX_MODEL_REPLY_BYTES,
    )


def _client_timeout(client: openai.AsyncOpenAI) -> httpx2.Timeout:
    timeout = client.timeout
    return timeout if isinstance(timeout, httpx2.Timeout) else httpx2.Timeout(cast(Any, timeout))


class WireCall:
    """The chat call as one HTTP/1.1 exchange on the provider's own keep-alive connections
    (`wire.WirePool`), raising the SDK's errors. An error reply or a compressed body is read
    into the SDK client's `Response` (its decoders, its error mapping); a redirect is sent again
    through the thin call, whose client follows it.

    The request is what the thin call sends — the same headers, built by the SDK's client once
    (its defaults, the SDK's and the auth headers), and the same body — so a provider sees no
    difference. Used only where the SDK's client would connect directly: no proxy.
    """

    def __init__(self, thin: ThinCall, pool: wire.WirePool) -> None:
        self._thin = thin
        self._pool = pool
        prototype = thin.client._client.build_request(
            "POST", thin.url, headers=thin.headers, content=b""
        )
        self._prototype = prototype
        target = prototype.url.raw_path
        head = [b"POST " + target + b" HTTP/1.1\r\n"]
        head += [
            name + b": " + value + b"\r\n"
            for name, value in prototype.headers.raw
            if name.lower() != b"content-length"
        ]
        self._head = b"".join(head)

    async def __call__(self, body: dict[str, Any], request: ModelRequest) -> ModelReply:
        content = orjson.dumps(body)
        sent = self._head + b"Content-Length: %d\r\n\r\n" % len(content) + content
        try:
            reply = await self._pool.exchange(sent)
        except wire.WireTooLarge as exc:
            raise BodyTooLarge(exc.limit_bytes) from exc
        except wire.WireTimeout as exc:
            raise openai.APITimeoutError(request=self._request(content)) from exc
        except wire.WireError as exc:
            raise openai.APIConnectionError(request=self._request(content)) from exc
        if 300 <= reply.status < 400:
            # Redirects are the SDK client's to follow (it was not processed where we sent it).
            return await self._thin(body, request)
        if reply.status < 400 and not reply.encoded:
            try:
                return _reply_from_json(orjson.loads(reply.body), request)
            except orjson.JSONDecodeError:
                pass  # read below, as the SDK's client reads it, for its error or its text
        # An error, a body with a content coding, or one that is not JSON: read as the SDK's
        # client reads it.
        sent_request = self._request(content)
        try:
            response = await _read(
                httpx2.Response(
                    reply.status, headers=reply.headers, content=reply.body, request=sent_request
                )
            )
            if reply.status >= 400:
                raise self._thin.client._make_status_error_from_response(response)
            data = _json_of(response)
        except _CONNECTION_ERRORS as exc:  # a body that does not decode
            raise openai.APIConnectionError(request=sent_request) from exc
        return _reply_from_json(data, request)

    def _request(self, content: bytes) -> httpx2.Request:
        """The request as the SDK's errors carry it."""
        prototype = self._prototype
        return httpx2.Request("POST", prototype.url, headers=prototype.headers, content=content)


# Describe the body as it was sent; once read (decoded) they no longer do.
_BODY_HEADERS = frozenset({"content-encoding", "content-length", "transfer-encoding"})


async def _read(response: httpx2.Response) -> httpx2.Response:
    """`response` with its body read: decoded, at most MAX_MODEL_REPLY_BYTES (BodyTooLarge past
    it, counted as it is decoded, so a small compressed body cannot become a huge one)."""
    body = await read_capped(response, MAX_MODEL_REPLY_BYTES)
    headers = [(k, v) for k, v in response.headers.multi_items() if k.lower() not in _BODY_HEADERS]
    return httpx2.Response(
        response.status_code, headers=headers, content=body, request=response.request
    )


def _json_of(response: httpx2.Response) -> Any:
    """The reply's JSON as the SDK reads it: a body that does not parse raises the SDK's parse
    error when the reply says it is JSON, and is the (choice-less) text otherwise."""
    try:
        return orjson.loads(response.content)
    except orjson.JSONDecodeError:
        content_type = response.headers.get("content-type", "*").split(";")[0]
        if content_type.endswith("json"):
            return response.json()  # raises as the SDK's `response.json()` does
        return response.text


def _reply_from_json(data: Any, request: ModelRequest) -> ModelReply:
    """`_reply` for the reply as JSON (the fields `_reply` reads of a `ChatCompletion`)."""
    choices = data.get("choices") if isinstance(data, dict) else None
    if not choices:
        raise _no_choices(request)
    message = choices[0]["message"]
    calls: list[ToolCall] = []
    for call in message.get("tool_calls") or ():
        function = call.get("function")
        if function is None:  # a non-function tool call type: nothing we offered
            continue
        calls.append(
            ToolCall(
                id=call["id"], name=function["name"], arguments=function.get("arguments") or ""
            )
        )
    return _model_reply(
        request, content=message.get("content"), calls=calls, usage=data.get("usage")
    )
