"""OpenAI-compatible ``POST /v1/chat/completions`` in front of an upstream model.

The cache key is the last user message, within a context scope: a fingerprint of the
model, the system messages and any earlier turns, so a different system prompt or
conversation history never shares answers ("and in euros?" after one exchange must not
hit the same follow-up from another). Request headers (all optional):
``x-scache-unit-id`` (randomisation unit; default: the ``user`` field, else
"anonymous"), ``x-scache-conversation-id`` (scope: only the same conversation's
entries answer), ``x-scache-scope: user`` (scope by the ``user`` field instead),
``x-scache-namespace``, ``x-scache-experiment``.

Hit: the cached answer in the chat.completion shape, ``usage`` all zeros,
``x-scache-hit: 1``. Miss or bypass: the request is forwarded to
``settings.service.upstream_url`` (``.../chat/completions``; the caller's
Authorization header goes along), the first choice's content is stored for
the unit's arm, and the upstream response is returned with ``x-scache-hit: 0``.
"""
from __future__ import annotations

import hashlib
import json
import logging
import time
import uuid

import httpx

from cache_core.cache import SemanticCache
from cache_core.service.schemas import ChatCompletionRequest
from cache_core.settings import ServiceSettings

log = logging.getLogger(__name__)

FORWARDED_HEADERS = ("authorization", "openai-organization", "openai-project")


class ChatError(Exception):
    """A chat request we cannot serve: ``status`` and a reason for the caller."""

    def __init__(self, status: int, reason: str):
        super().__init__(reason)
        self.status = status
        self.reason = reason


def cache_key(body: ChatCompletionRequest) -> str:
    """The text of the last user message (text parts joined for multi-part content)."""
    for message in reversed(body.messages):
        if message.role != "user":
            continue
        content = message.content
        if isinstance(content, list):
            content = " ".join(str(part.get("text", "")) for part in content
                               if part.get("type") == "text")
        if isinstance(content, str) and content.strip():
            return content
        raise ChatError(422, "the last user message has no text content")
    raise ChatError(422, "messages contain no user message to answer")


def context_fingerprint(body: ChatCompletionRequest) -> str:
    """Hash of everything but the last user message that shapes the answer."""
    last_user = max(i for i, m in enumerate(body.messages) if m.role == "user")
    context = [[m.role, m.content] for i, m in enumerate(body.messages)
               if i != last_user and (m.role == "system" or i < last_user)]
    payload = json.dumps([body.model, context], sort_keys=True, default=str)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def request_identity(body: ChatCompletionRequest, headers) -> dict:
    """unit_id, scope, namespace and experiment_id for the cache, from headers and ``user``."""
    unit_id = headers.get("x-scache-unit-id") or body.user or "anonymous"
    scope = headers.get("x-scache-conversation-id")
    if scope is None and headers.get("x-scache-scope", "").lower() == "user":
        if not body.user:
            raise ChatError(422, "x-scache-scope: user needs the request's user field")
        scope = f"user:{body.user}"
    scope = f"{scope or ''}|ctx:{context_fingerprint(body)}"
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
    url = url.rstrip("/")
    return url if url.endswith("/chat/completions") else f"{url}/chat/completions"


def forward(client: httpx.Client, service: ServiceSettings, body: ChatCompletionRequest,
            headers) -> httpx.Response:
    """POST the request upstream; ChatError 503/502/504 when it cannot be reached."""
    if not service.upstream_url:
        raise ChatError(503, "cache miss and no upstream model is configured "
                             "(set SCACHE_SERVICE__UPSTREAM_URL)")
    payload = body.model_dump(mode="json", exclude_none=True)
    payload.setdefault("model", service.upstream_model)
    passed = {name: headers[name] for name in FORWARDED_HEADERS if name in headers}
    try:
        return client.post(upstream_endpoint(service.upstream_url), json=payload, headers=passed,
                           timeout=service.upstream_timeout_s)
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
                         scope=identity["scope"], provenance_source="upstream",
                         provenance_version=model)
    return result.reason


def new_request_id() -> str:
    return uuid.uuid4().hex
