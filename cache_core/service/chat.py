"""OpenAI-compatible ``POST /v1/chat/completions`` in front of an upstream model.

The cache key is the last user message, within a context scope: a fingerprint of the
model, the other messages and the answer-shaping fields (``cache_core.service.chat_key``), so a
different system prompt or conversation history never shares answers ("and in euros?" after one
exchange must not hit the same follow-up from another); requests whose answer cannot come from a
cache (tools, n > 1, logprobs ...) bypass it. Request headers (all optional):
``x-scache-unit-id`` (randomisation unit; default: the ``user`` field, else
"anonymous"), ``x-scache-conversation-id`` (scope: only the same conversation's
entries answer), ``x-scache-scope: user`` (scope by the ``user`` field instead),
``x-scache-namespace``, ``x-scache-experiment``.

Hit: the cached answer in the chat.completion shape, ``usage`` all zeros,
``x-scache-hit: 1``. Miss or bypass: the request is forwarded to
``settings.service.upstream_url`` (``.../chat/completions``; the caller's
Authorization header goes along), the first choice's content is stored for
the unit's arm, and the upstream response is returned with ``x-scache-hit: 0``.

``stream: true``: Server-Sent Events (``data: <chat.completion.chunk>`` ... ``data: [DONE]``).
A hit streams the cached answer a few words per chunk (first chunk ``delta.role``, last one
``finish_reason: "stop"``). A miss forwards with ``stream: true`` and relays the upstream's
events as they arrive while collecting the first choice's content; it is stored only if the
stream finished with ``finish_reason: "stop"``, before ``[DONE]`` is relayed (so a client
that saw ``[DONE]`` finds it cached). A stream that breaks off ends with an ``error`` event
and no ``[DONE]``. An upstream error status is answered as without streaming.
"""
from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field

import httpx

from cache_core.cache import SemanticCache
from cache_core.ids import new_id
from cache_core.service.chat_key import scope_fingerprint
from cache_core.service.schemas import ChatCompletionRequest
from cache_core.settings import ServiceSettings

log = logging.getLogger(__name__)

FORWARDED_HEADERS = ("authorization", "openai-organization", "openai-project")
CONTROL_FIELDS = ("scache", "cache")
"""Request fields with per-request cache controls, never forwarded (``cache_core.service.controls``)."""


class ChatError(Exception):
    """A chat request we cannot serve: ``status`` and a reason for the caller."""

    def __init__(self, status: int, reason: str, param: str | None = None):
        super().__init__(reason)
        self.status = status
        self.reason = reason
        self.param = param
        """The request field at fault (OpenAI's ``param``), if one is."""


# The limits of the same fields in /v1/lookup and /v1/store (cache_core.service.schemas).
HEADER_LIMITS = {"x-scache-unit-id": 256, "x-scache-conversation-id": 256, "x-scache-namespace": 128,
                 "x-scache-experiment": 64}


def request_identity(body: ChatCompletionRequest, headers, scoped: bool = True) -> dict:
    """unit_id, scope, namespace and experiment_id for the cache, from headers and ``user``
    (``scoped``: the scope includes the request's fingerprint; a bypass needs none)."""
    for name, limit in HEADER_LIMITS.items():
        if len(headers.get(name, "")) > limit:
            raise ChatError(422, f"{name} is longer than {limit} characters", param=name)
    unit_id = headers.get("x-scache-unit-id") or body.user or "anonymous"
    scope = headers.get("x-scache-conversation-id")
    if scope is None and headers.get("x-scache-scope", "").lower() == "user":
        if not body.user:
            raise ChatError(422, "x-scache-scope: user needs the request's user field", param="user")
        scope = f"user:{body.user}"
    scope = f"{scope or ''}|ctx:{scope_fingerprint(body)}" if scoped else scope
    return {"unit_id": unit_id, "scope": scope,
            "namespace": headers.get("x-scache-namespace") or "default",
            "experiment_id": headers.get("x-scache-experiment") or None}


def completion_from_cache(body: ChatCompletionRequest, answer: str, request_id: str,
                          default_model: str) -> dict:
    return {
        "id": f"chatcmpl-{request_id}", "object": "chat.completion", "created": int(time.time()),
        "model": body.model or default_model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": answer},
                     "finish_reason": "stop", "logprobs": None}],
        "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
    }


def upstream_endpoint(url: str) -> str:
    return f"{upstream_base(url)}/chat/completions"


def upstream_base(url: str) -> str:
    """The upstream's API base (``.../v1``), whether the setting names it or its chat endpoint."""
    url = url.rstrip("/")
    return url.removesuffix("/chat/completions")


def upstream_headers(service: ServiceSettings, headers, key_in_authorization: bool = False) -> dict:
    """What goes upstream of the caller's headers: the configured upstream key as the bearer if there
    is one, else the caller's Authorization (unless it carried the caller's scache key)."""
    passed = {name: headers[name] for name in FORWARDED_HEADERS if name in headers}
    if service.upstream_api_key is not None:
        passed["authorization"] = f"Bearer {service.upstream_api_key.get_secret_value()}"
    elif key_in_authorization:
        passed.pop("authorization", None)
    return passed


async def forward(client: httpx.AsyncClient, service: ServiceSettings, body: ChatCompletionRequest,
                  headers, stream: bool = False, key_in_authorization: bool = False) -> httpx.Response:
    """POST the request upstream; ChatError 503/502/504 when it cannot be reached.

    ``stream``: return once the status and headers are in, body unread (the caller
    reads it and closes the response)."""
    if not service.upstream_url:
        raise ChatError(503, "cache miss and no upstream model is configured "
                             "(set SCACHE_SERVICE__UPSTREAM_URL)")
    payload = body.model_dump(mode="json", exclude_none=True)
    payload.setdefault("model", service.upstream_model)
    for name in CONTROL_FIELDS:  # the cache's own controls (cache_core.service.controls)
        payload.pop(name, None)
    passed = upstream_headers(service, headers, key_in_authorization)
    try:
        request = client.build_request("POST", upstream_endpoint(service.upstream_url), json=payload,
                                       headers=passed, timeout=service.upstream_timeout_s)
        return await client.send(request, stream=stream)
    except httpx.TimeoutException as exc:
        raise ChatError(504, f"upstream model timed out after {service.upstream_timeout_s} s") from exc
    except httpx.HTTPError as exc:
        raise ChatError(502, f"upstream model unreachable: {type(exc).__name__}") from exc


def answer_of(completion: dict) -> str | None:
    """The first choice's text, if it finished normally (a truncated answer is not cached)."""
    try:
        choice = completion["choices"][0]
        content = choice["message"]["content"]
    except (KeyError, IndexError, TypeError):
        return None
    if choice.get("finish_reason") not in (None, "stop") or not isinstance(content, str):
        return None
    return content if content.strip() else None


def store_answer(cache: SemanticCache, query: str, answer: str, identity: dict,
                 model: str) -> str:
    """Offer the upstream answer to the cache; returns the store outcome's reason."""
    result = cache.store(query, answer, unit_id=identity["unit_id"],
                         experiment_id=identity["experiment_id"], namespace=identity["namespace"],
                         scope=identity["scope"], ttl_s=identity.get("ttl_s"), provenance_source="upstream",
                         provenance_version=model)
    return result.reason


# -- streaming (Server-Sent Events) ------------------------------------------------------

DONE = "[DONE]"
# About this many content chunks for a cached answer: a few words each, whatever its length.
CACHED_CHUNKS = 32
_WORD = re.compile(r"\S+\s*|\s+")


def sse(data: dict | str) -> bytes:
    """One SSE event carrying ``data`` (a JSON object, or a raw payload such as [DONE])."""
    text = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return f"data: {text}\n\n".encode()


def wants_usage(body: ChatCompletionRequest) -> bool:
    options = (body.model_extra or {}).get("stream_options")
    return isinstance(options, dict) and bool(options.get("include_usage"))


def answer_pieces(answer: str, chunks: int = CACHED_CHUNKS) -> list[str]:
    """``answer`` cut at word boundaries into at most about ``chunks`` pieces (joined: the
    answer exactly, whitespace included)."""
    words = _WORD.findall(answer)
    per = max(1, -(-len(words) // chunks))
    return ["".join(words[i:i + per]) for i in range(0, len(words), per)]


def completion_chunks(completion_id: str, model: str, content: str, usage: dict | None = None,
                      created: int | None = None, finish_reason: str = "stop") -> Iterator[bytes]:
    """A whole answer as chat.completion.chunk events: role, content pieces, the finish_reason,
    the ``usage`` chunk if given (stream_options.include_usage), then [DONE]."""
    base = {"id": completion_id, "object": "chat.completion.chunk",
            "created": created or int(time.time()), "model": model}

    def chunk(delta: dict, finish_reason: str | None = None) -> bytes:
        return sse({**base, "choices": [{"index": 0, "delta": delta, "logprobs": None,
                                         "finish_reason": finish_reason}]})

    yield chunk({"role": "assistant", "content": ""})
    for piece in answer_pieces(content):
        yield chunk({"content": piece})
    yield chunk({}, finish_reason)
    if usage is not None:
        yield sse({**base, "choices": [], "usage": usage})
    yield sse(DONE)


def cached_chunks(body: ChatCompletionRequest, answer: str, request_id: str,
                  default_model: str) -> Iterator[bytes]:
    """A cache hit as a stream: same id and model as ``completion_from_cache``."""
    usage = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0} if wants_usage(body) else None
    return completion_chunks(f"chatcmpl-{request_id}", body.model or default_model, answer, usage)


def chunks_of_completion(completion: dict, body: ChatCompletionRequest) -> Iterator[bytes]:
    """An upstream chat.completion (from an upstream that ignored stream=true) as a stream."""
    choices = completion.get("choices")
    choice = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}
    message = choice.get("message") if isinstance(choice.get("message"), dict) else {}
    content = message.get("content") if isinstance(message.get("content"), str) else ""
    usage = completion.get("usage") if wants_usage(body) and isinstance(completion.get("usage"), dict) else None
    return completion_chunks(str(completion.get("id") or f"chatcmpl-{new_id()}"),
                             str(completion.get("model") or body.model or ""), content, usage,
                             finish_reason=str(choice.get("finish_reason") or "stop"))


@dataclass
class StreamedReply:
    """What a relayed upstream stream said, for the cache and the metrics."""

    parts: list[str] = field(default_factory=list)
    """Content deltas of the first choice, in order."""
    finish_reason: str | None = None
    model: str | None = None
    done: bool = False
    """The upstream sent [DONE]."""
    error: str | None = None
    """Why the stream did not complete (upstream error event, broken connection, ...)."""
    chunks: int = 0

    def feed(self, data: str) -> None:
        try:
            chunk = json.loads(data)
        except ValueError:
            self.error = self.error or "upstream sent an event that is not JSON"
            return
        if not isinstance(chunk, dict):
            self.error = self.error or "upstream sent an event that is not a JSON object"
            return
        self.chunks += 1
        if chunk.get("error") is not None:
            self.error = self.error or "upstream reported an error in the stream"
        self.model = self.model or (chunk.get("model") if isinstance(chunk.get("model"), str) else None)
        for choice in chunk.get("choices") or []:
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue  # n > 1: the first choice is the one cached, as without streaming
            content = (choice.get("delta") or {}).get("content")
            if isinstance(content, str):
                self.parts.append(content)
            if choice.get("finish_reason") is not None:
                self.finish_reason = choice["finish_reason"]

    @property
    def complete(self) -> bool:
        return self.error is None and (self.done or self.finish_reason is not None)

    @property
    def answer(self) -> str | None:
        """The reply's text if it is cacheable: complete and finished with "stop"."""
        if not self.complete or self.finish_reason != "stop":
            return None
        text = "".join(self.parts)
        return text if text.strip() else None


async def relay_stream(response: httpx.Response,
                       finished: Callable[[StreamedReply], Awaitable[None]]) -> AsyncIterator[bytes]:
    """Relay an upstream SSE response event by event (nothing buffered) and end it with
    [DONE], or with an ``error`` event if it broke off. ``finished(reply)`` runs once,
    before [DONE] goes out (so a cacheable reply is stored before the client hears the
    end), and also when the stream fails or the client goes away. Closes ``response``: a
    client that goes away (the server cancels this generator) closes the upstream request."""
    reply = StreamedReply()
    reported = False
    try:
        try:
            async for data in _sse_data_async(response.aiter_lines()):
                if data.strip() == DONE:
                    reply.done = True
                    break
                reply.feed(data)
                yield sse(data)
        except httpx.HTTPError as exc:
            reply.error = f"upstream stream broke off: {type(exc).__name__}"
        if not reply.complete:
            reply.error = reply.error or "upstream stream ended before the reply finished"
        reported = True
        await finished(reply)
        if reply.complete:
            yield sse(DONE)
        else:
            yield sse({"error": {"message": reply.error, "type": "upstream_error"}})
    except (GeneratorExit, asyncio.CancelledError):  # the client went away mid-stream: nothing is cached
        if not reported:
            reply.error = reply.error or "client disconnected"
            reported = True
            _finished_nowait(finished, reply)
        raise
    finally:
        await response.aclose()


def _finished_nowait(finished: Callable[[StreamedReply], Awaitable[None]], reply: StreamedReply) -> None:
    """Report an abandoned stream without awaiting (a closing generator must not): as a task."""
    try:
        asyncio.get_running_loop().create_task(finished(reply))
    except RuntimeError:  # no loop: nothing to report to
        pass


async def _sse_data_async(lines: AsyncIterator[str]) -> AsyncIterator[str]:
    """The ``data`` of each event of an SSE line stream (multi-line data joined by newlines;
    comments, other fields and empty events skipped)."""
    data: list[str] = []
    async for line in lines:
        if not line:
            if data:
                yield "\n".join(data)
            data = []
        elif line.startswith("data:"):
            value = line[5:]
            data.append(value[1:] if value.startswith(" ") else value)
    if data:
        yield "\n".join(data)
