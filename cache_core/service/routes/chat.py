"""``POST /v1/chat/completions``: the OpenAI-compatible front door (protocol helpers in
``cache_core.service.chat``): a hit answers from the cache, a miss goes upstream and is stored."""
from __future__ import annotations

import logging
import time
from collections.abc import Callable

import httpx
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse

from cache_core.cache import SemanticCache
from cache_core.records import InvalidRequest
from cache_core.service import chat
from cache_core.service.deps import CacheDep, ComponentsDep, MetricsDep
from cache_core.service.shadow import shadow_request
from cache_core.service.metrics import ServiceMetrics
from cache_core.service.schemas import ChatCompletionRequest

log = logging.getLogger(__name__)
router = APIRouter()

# Proxies must not buffer or transform the event stream.
SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}


@router.post("/v1/chat/completions")
def chat_completions(body: ChatCompletionRequest, request: Request, components: ComponentsDep,
                     cache: CacheDep, metrics: MetricsDep):
    service = components.settings.service
    try:
        query = chat.cache_key(body)
        identity = chat.request_identity(body, request.headers)
        result = cache.lookup(query, unit_id=identity["unit_id"], experiment_id=identity["experiment_id"],
                              namespace=identity["namespace"], scope=identity["scope"])
        cache_headers = {"x-scache-request-id": result.request_id, "x-scache-decision": result.decision,
                         "x-scache-arm": result.arm, "x-scache-variant": result.variant}
        if result.hit:
            metrics.chat.labels("hit").inc()
            if components.shadow is not None:  # never waits: a sampled hit is checked in the background
                components.shadow.after_hit(result, query, shadow_request(body, request.headers))
            headers = {**cache_headers, "x-scache-hit": "1"}
            if body.stream:
                return StreamingResponse(chat.cached_chunks(body, result.answer, result.request_id,
                                                            service.upstream_model),
                                         media_type="text/event-stream", headers={**headers, **SSE_HEADERS})
            return JSONResponse(chat.completion_from_cache(body, result.answer, result.request_id,
                                                           service.upstream_model), headers=headers)
        started = time.perf_counter()
        response = chat.forward(components.upstream, service, body, request.headers, stream=body.stream)
        if body.stream:
            return _relay_stream(cache, metrics, query, identity, body, response, cache_headers, started,
                                 _near_miss(components, result))
        metrics.upstream_latency.observe(time.perf_counter() - started)
    except chat.ChatError as exc:
        metrics.chat.labels(f"error_{exc.status}").inc()
        return JSONResponse(status_code=exc.status, content={"detail": exc.reason})
    return _relay(cache, metrics, query, identity, body, response, cache_headers, _near_miss(components, result))


def _near_miss(components, result) -> Callable[[str | None], object] | None:
    """Hands a miss's upstream answer to the shadow checker (a near-miss is compared with its nearest
    candidate's answer, in the background)."""
    shadow = components.shadow
    return None if shadow is None else (lambda answer: shadow.after_miss(result, answer))


def _relay(cache: SemanticCache, metrics: ServiceMetrics, query: str, identity: dict,
           body: ChatCompletionRequest, response: httpx.Response, cache_headers: dict,
           on_answer: Callable[[str | None], object] | None = None):
    """Return the upstream answer; cache it when it is a complete, successful one."""
    headers = {**cache_headers, "x-scache-hit": "0"}
    try:
        completion = response.json()
    except ValueError:
        metrics.chat.labels("upstream_invalid").inc()
        return JSONResponse(status_code=502, headers=headers,
                            content={"detail": f"upstream answered {response.status_code} "
                                               "with a body that is not JSON"})
    if response.status_code != 200:
        metrics.chat.labels("upstream_error").inc()
        return JSONResponse(status_code=response.status_code, content=completion, headers=headers)
    if not isinstance(completion, dict):
        metrics.chat.labels("upstream_invalid").inc()
        return JSONResponse(status_code=502, headers=headers,
                            content={"detail": "upstream answered 200 with JSON that is not an object"})
    answer = chat.answer_of(completion)
    stored = _store_reply(cache, query, identity, answer, str(completion.get("model") or body.model or ""))
    if on_answer is not None:
        on_answer(answer)
    metrics.chat.labels("forwarded").inc()
    if body.stream:  # an upstream that ignored stream=true: the client still gets a stream
        return StreamingResponse(chat.chunks_of_completion(completion, body), media_type="text/event-stream",
                                 headers={**headers, **SSE_HEADERS, "x-scache-store": stored})
    return JSONResponse(completion, headers={**headers, "x-scache-store": stored})


def _store_reply(cache: SemanticCache, query: str, identity: dict, answer: str | None, model: str) -> str:
    """Offer a complete upstream answer to the cache; returns the outcome (a store reason,
    "not_cacheable" or "invalid")."""
    if answer is None:
        return "not_cacheable"
    try:
        return chat.store_answer(cache, query, answer, identity, model)
    except InvalidRequest as exc:  # e.g. longer than max_answer_chars: serve, do not cache
        log.info("upstream answer not cached", extra={"reason": str(exc)})
        return "invalid"


def _relay_stream(cache: SemanticCache, metrics: ServiceMetrics, query: str, identity: dict,
                  body: ChatCompletionRequest, response: httpx.Response, cache_headers: dict, started: float,
                  on_answer: Callable[[str | None], object] | None = None):
    """Relay a streamed upstream answer; cache it once the stream finished with "stop".

    An error status (or a body that is not an event stream) is read whole and answered
    like the non-streaming path. The store outcome cannot be a header (headers leave
    before the answer is known): it is logged and counted."""
    content_type = response.headers.get("content-type", "")
    if response.status_code != 200 or not content_type.startswith("text/event-stream"):
        try:
            response.read()
        except httpx.HTTPError as exc:
            metrics.chat.labels("upstream_invalid").inc()
            return JSONResponse(status_code=502, headers={**cache_headers, "x-scache-hit": "0"},
                                content={"detail": f"upstream answer broke off: {type(exc).__name__}"})
        finally:
            response.close()
        metrics.upstream_latency.observe(time.perf_counter() - started)
        return _relay(cache, metrics, query, identity, body, response, cache_headers, on_answer)

    def finished(reply: chat.StreamedReply) -> None:
        metrics.upstream_latency.observe(time.perf_counter() - started)
        if reply.error is not None:
            metrics.chat.labels("stream_incomplete").inc()
            log.info("upstream stream not cached", extra={"request_id": cache_headers["x-scache-request-id"],
                                                          "reason": reply.error})
            return
        stored = _store_reply(cache, query, identity, reply.answer, reply.model or body.model or "")
        if on_answer is not None:
            on_answer(reply.answer)
        metrics.chat.labels("forwarded").inc()
        log.info("upstream stream relayed", extra={"request_id": cache_headers["x-scache-request-id"],
                                                   "chunks": reply.chunks, "stored": stored,
                                                   "finish_reason": reply.finish_reason})

    return StreamingResponse(chat.relay_stream(response, finished), media_type="text/event-stream",
                             headers={**cache_headers, "x-scache-hit": "0", **SSE_HEADERS})
