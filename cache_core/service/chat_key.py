"""What of a chat-completions request the cached answer may depend on: the cache key, or a bypass.

A cached answer is served only to a request that would have got the same kind of answer. Each
request field is either part of the key (here: the scope fingerprint next to the embedded query),
ignored (it does not change the answer), or a reason to bypass the cache (the answer cannot come
from the cache: tool calls, several choices, logprobs, audio, live web search). The table is in
docs/proxy.md; ``FIELD_POLICY`` is the code it documents, and a unit test holds them together.

- The query (embedded, matched by similarity) is the text of the last user message.
- The scope fingerprint (matched exactly) covers the model, every other message (system prompt,
  earlier turns, tool results, an assistant prefill), the non-text parts of the last user message
  (a digest of each image / audio / file part, so the same words about another picture miss), and
  every field below marked ``key`` or unknown to this table, with OpenAI's defaults left out, so
  ``temperature: 1`` and no temperature are one key.
"""
from __future__ import annotations

import hashlib
import json
from typing import Any, Literal

from cache_core.service.schemas import ChatCompletionRequest

Policy = Literal["key", "ignore", "bypass"]

FIELD_POLICY: dict[str, tuple[Policy, str]] = {
    "model": ("key", "a different model gives a different answer"),
    "messages": ("key", "last user text: the embedded query; every other message, and the non-text "
                        "parts of the last user message (a sha256 of each): the exact-match scope"),
    "temperature": ("key", "default 1 left out"),
    "top_p": ("key", "default 1 left out"),
    "seed": ("key", ""),
    "max_tokens": ("key", "an answer that hit the limit (finish_reason length) is never stored"),
    "max_completion_tokens": ("key", "as max_tokens"),
    "stop": ("key", ""),
    "presence_penalty": ("key", "default 0 left out"),
    "frequency_penalty": ("key", "default 0 left out"),
    "logit_bias": ("key", ""),
    "response_format": ("key", "json_object / json_schema answers are cached per format and schema"),
    "reasoning_effort": ("key", ""),
    "verbosity": ("key", ""),
    "prediction": ("key", ""),
    "tools": ("bypass", "tools: the answer may be a tool call, which is never cached"),
    "tool_choice": ("bypass", "tools"),
    "functions": ("bypass", "tools (the deprecated form)"),
    "function_call": ("bypass", "tools (the deprecated form)"),
    "n": ("bypass", "n > 1: the cache holds one answer per question"),
    "logprobs": ("bypass", "true: the cache holds no token logprobs"),
    "top_logprobs": ("bypass", "logprobs"),
    "audio": ("bypass", "audio output is not cached"),
    "modalities": ("bypass", "with \"audio\"; [\"text\"] is ignored"),
    "web_search_options": ("bypass", "the answer depends on the live web"),
    "stream": ("ignore", "a hit streams like a miss"),
    "stream_options": ("ignore", "include_usage: a hit's usage chunk has zeros"),
    "user": ("ignore", "used for the experiment unit and the user scope only (x-scache-scope: user)"),
    "metadata": ("ignore", ""),
    "store": ("ignore", "OpenAI's stored completions, not this cache"),
    "service_tier": ("ignore", ""),
    "parallel_tool_calls": ("ignore", "meaningful only with tools, which bypass"),
    "prompt_cache_key": ("ignore", ""),
    "safety_identifier": ("ignore", ""),
    "scache": ("ignore", "this cache's per-request controls (docs/proxy.md); not sent upstream"),
    "cache": ("ignore", "LiteLLM's cache controls, read as ours; not sent upstream"),
}
"""Per request field: (policy, why). A field not listed goes into the key."""

# OpenAI's defaults: a field at its default shapes the answer no differently than the field left out.
_DEFAULTS: dict[str, Any] = {"temperature": 1, "top_p": 1, "presence_penalty": 0, "frequency_penalty": 0,
                             "n": 1, "logprobs": False}
TEXT_PART = "text"


class NoQuery(ValueError):
    """The request has no user text to look up (the reason is the message)."""


def bypass_reason(body: ChatCompletionRequest) -> str | None:
    """Why the answer to ``body`` cannot come from (nor go to) the cache, or None."""
    fields = _set_fields(body)
    if any(name in fields for name in ("tools", "tool_choice", "functions", "function_call")):
        return "tools"
    if fields.get("n", 1) != 1:
        return "n"
    if fields.get("logprobs") or fields.get("top_logprobs"):
        return "logprobs"
    modalities = fields.get("modalities")
    if "audio" in fields or (isinstance(modalities, list) and "audio" in modalities):
        return "audio"
    if "web_search_options" in fields:
        return "web_search"
    return None


def cache_query(body: ChatCompletionRequest) -> str:
    """The text of the last user message (text parts joined); NoQuery if there is none."""
    last = _last_user(body)
    content = body.messages[last].content
    if isinstance(content, list):
        content = " ".join(part["text"] for part in content  # a null text is no text, not "None"
                           if part.get("type") == TEXT_PART and isinstance(part.get("text"), str))
    if isinstance(content, str) and content.strip():
        return content
    raise NoQuery("the last user message has no text content")


def scope_fingerprint(body: ChatCompletionRequest) -> str:
    """Hash of everything but the last user message's text that shapes the answer (see module doc).

    A request with only a model, messages of role and content, and no answer-shaping field hashes
    as before this table existed, so entries cached then still match."""
    last = _last_user(body)
    context = []
    for i, message in enumerate(body.messages):
        if i == last:
            continue
        extra = {k: v for k, v in (message.model_extra or {}).items() if v is not None}
        context.append([message.role, message.content, extra] if extra else [message.role, message.content])
    payload: list[Any] = [body.model, context]
    parts = _non_text_digests(body.messages[last].content)
    shaping = {name: value for name, value in _set_fields(body).items()
               if FIELD_POLICY.get(name, ("key", ""))[0] == "key" and name not in ("model", "messages")}
    if parts or shaping:
        payload.append({"parts": parts, "fields": shaping})
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:16]


def has_non_text_user_part(body: ChatCompletionRequest) -> bool:
    try:
        return bool(_non_text_digests(body.messages[_last_user(body)].content))
    except NoQuery:
        return False


def _set_fields(body: ChatCompletionRequest) -> dict[str, Any]:
    """The request's fields that are set and not at OpenAI's default (pass-through ones included)."""
    fields = {name: getattr(body, name) for name in body.model_fields_set if name not in ("messages",)}
    fields.update(body.model_extra or {})
    return {name: value for name, value in fields.items()
            if value is not None and not (name in _DEFAULTS and value == _DEFAULTS[name])}


def _last_user(body: ChatCompletionRequest) -> int:
    for i in range(len(body.messages) - 1, -1, -1):
        if body.messages[i].role == "user":
            return i
    raise NoQuery("messages contain no user message to answer")


def _non_text_digests(content) -> list[str]:
    """sha256 of each non-text part (image_url, input_audio, file ...) of a multi-part content."""
    if not isinstance(content, list):
        return []
    return [hashlib.sha256(json.dumps(part, sort_keys=True, default=str).encode()).hexdigest()
            for part in content if part.get("type") != TEXT_PART]
