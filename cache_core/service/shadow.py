"""The service's side of shadow checks (``cache_core.shadow``): how a check asks the upstream model
(the chat proxy's client and settings), and the checker built from ``settings.shadow``.

Routes call ``ShadowChecker.after_hit`` (lookup and chat hits) and ``after_miss`` (a chat miss's
upstream answer); both return at once."""
from __future__ import annotations

from collections.abc import Callable

import httpx

from cache_core.events import FeedbackEvent
from cache_core.service import chat
from cache_core.service.schemas import ChatCompletionRequest
from cache_core.settings import ServiceSettings, Settings
from cache_core.shadow.checker import ShadowChecker
from cache_core.shadow.equivalence import from_settings


def shadow_request(body: ChatCompletionRequest, headers,
                   key_in_authorization: bool = False) -> tuple[ChatCompletionRequest, dict]:
    """What a chat hit hands its shadow check: the request and the headers the upstream may see,
    captured while the request is in hand. They are chosen as for the request's own upstream call
    (``chat.upstream_headers``): an Authorization that carried the caller's scache key never leaves."""
    return body, {name: headers[name] for name in chat.FORWARDED_HEADERS if name in headers
                  and not (name == "authorization" and key_in_authorization)}


def unstreamed(body: ChatCompletionRequest) -> ChatCompletionRequest:
    """The same request without streaming: a check reads the whole answer."""
    payload = body.model_dump(mode="json", exclude_none=True)
    payload.pop("stream", None)
    payload.pop("stream_options", None)
    return ChatCompletionRequest(**payload)


def upstream_fetch(client: httpx.Client, service: ServiceSettings):
    """``fetch(query, request)`` for the checker: ``request`` is ``shadow_request(...)`` for a chat
    hit, None for a /v1/lookup hit (then the query is asked as the only user message)."""

    def fetch(query: str, request) -> str | None:
        if request is None:
            request = (ChatCompletionRequest(messages=[{"role": "user", "content": query}]), {})
        body, headers = request
        if not service.upstream_url:
            return None
        payload = unstreamed(body).model_dump(mode="json", exclude_none=True)
        payload.setdefault("model", service.upstream_model)
        for name in chat.CONTROL_FIELDS:
            payload.pop(name, None)
        try:
            response = client.post(chat.upstream_endpoint(service.upstream_url), json=payload,
                                   headers=chat.upstream_headers(service, headers), timeout=service.upstream_timeout_s)
        except httpx.HTTPError:
            return None
        try:
            if response.status_code != 200:
                return None
            completion = response.json()
        except ValueError:
            return None
        finally:
            response.close()
        return chat.answer_of(completion) if isinstance(completion, dict) else None

    return fetch


def build_checker(settings: Settings, encode: Callable, client: httpx.Client,
                  publish: Callable[[FeedbackEvent], None],
                  on_checked: Callable[[str, float], None] | None = None) -> ShadowChecker:
    """Hit checks and lookup near-miss checks need an upstream: without ``service.upstream_url`` only
    chat near-misses are checked. ``on_checked``: told each check's sampling rate (``ShadowChecker``)."""
    shadow = settings.shadow
    if not settings.service.upstream_url and (shadow.hit_rate > 0 or shadow.near_miss_rate > 0):
        shadow = shadow.model_copy(update={"hit_rate": 0.0, "near_miss_rate": 0.0})
    return ShadowChecker(shadow, from_settings(shadow, encode), upstream_fetch(client, settings.service), publish,
                         on_checked=on_checked)
