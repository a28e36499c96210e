"""``POST /v1/chat/completions``: the OpenAI-compatible front door (protocol helpers in
``cache_core.service.chat``): a hit answers from the cache, a miss goes upstream and is stored."""
from __future__ import annotations

import logging
import time
from collections.abc import Callable

import httpx
from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, StreamingResponse

from cache_core.cache import SemanticCache
from cache_core.records import InvalidRequest
from cache_core.events import CacheEvent
from cache_core.experiments import assign
from cache_core.service import chat, chat_key
from cache_core.service.auth import AccessDep
from cache_core.service.controls import read_controls
from cache_core.service.errors import openai_error
from cache_core.service.metrics import ServiceMetrics
from cache_core.service.schemas import ChatCompletionRequest
from cache_core.service.shadow import shadow_request
from cache_core.service.wiring import Components
from cache_core.tracing import annotate

log = logging.getLogger(__name__)
router = APIRouter()

# Proxies must not buffer or transform the event stream.
SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}


@router.post("/v1/chat/completions")
async def chat_completions(body: ChatCompletionRequest, request: Request, access: AccessDep):
    """A cached answer needs the read right on the namespace (x-scache-namespace, else the key's);
    a forwarded answer is stored only for a caller with the write right there.

    Async where it waits: the encoder (its own batching thread), the upstream (``httpx.AsyncClient``)
    and the relay, so open streams hold no thread; the store (an encode and a log write) runs in the
    thread pool. A client that goes away mid-stream closes the upstream request."""
    components, caller = access.components, access.caller
    cache, metrics, service = components.cache, components.metrics, components.settings.service
    try:
        reason = chat_key.bypass_reason(body)
        query = None
        if reason is None:
            try:
                query = chat_key.cache_query(body)
            except chat_key.NoQuery as exc:
                if not chat_key.has_non_text_user_part(body):
                    raise chat.ChatError(422, str(exc), param="messages") from None
                reason = "no_text"  # e.g. an image alone: nothing to look up
        controls = read_controls(body, request.headers)
        identity = chat.request_identity(body, request.headers, scoped=reason is None)
        identity["namespace"] = caller.namespace(controls.namespace or request.headers.get("x-scache-namespace"))
        caller.require("read", identity["namespace"])
        identity["ttl_s"] = controls.ttl_s
        if reason is None and controls.no_store:
            identity["no_store"] = "no_store"
        elif query is not None and not caller.may("write", identity["namespace"]):
            identity["no_store"] = "not_allowed"  # the caller may read this namespace, not write it
        control_headers = {"x-scache-namespace": identity["namespace"],
                           **({"x-scache-controls": controls.applied()} if controls.applied() else {})}
        skipped = reason is None and controls.skip_reason is not None
        on_answer = None  # a looked-up miss' answer goes to the shadow checker (near-miss comparison)
        if reason is not None or skipped:
            why = reason or controls.skip_reason
            event = bypass_event(components, body, identity, why)
            cache_headers = {"x-scache-request-id": event.request_id, "x-scache-decision": "bypass",
                             "x-scache-bypass": why, "x-scache-arm": event.arm, "x-scache-variant": event.variant,
                             **control_headers}
            metrics.chat.labels(f"bypass_{why}").inc()
        else:
            result = await cache.lookup_async(query, unit_id=identity["unit_id"],
                                              experiment_id=identity["experiment_id"],
                                              namespace=identity["namespace"], scope=identity["scope"])
            cache_headers = {"x-scache-request-id": result.request_id, "x-scache-decision": result.decision,
                             "x-scache-arm": result.arm, "x-scache-variant": result.variant, **control_headers}
            if result.hit:
                metrics.chat.labels("hit").inc()
                if components.shadow is not None:  # never waits: a sampled hit is checked in the background
                    components.shadow.after_hit(result, query, shadow_request(
                        body, request.headers, caller.consumed_authorization))
                headers = {**cache_headers, "x-scache-hit": "1",
                           **({"x-scache-feedback-requested": "1"} if result.feedback_requested else {})}
                if body.stream:
                    return StreamingResponse(chat.cached_chunks(body, result.answer, result.request_id,
                                                                service.upstream_model),
                                             media_type="text/event-stream", headers={**headers, **SSE_HEADERS})
                return JSONResponse(chat.completion_from_cache(body, result.answer, result.request_id,
                                                               service.upstream_model), headers=headers)
            on_answer = _near_miss(components, result)
        started = time.perf_counter()
        with components.tracing.span("scache.upstream", {"scache.request_id": cache_headers["x-scache-request-id"],
                                                         "scache.stream": body.stream}, kind="client") as span:
            response = await chat.forward(components.upstream, service, body, request.headers, stream=body.stream,
                                          key_in_authorization=caller.consumed_authorization)
            annotate(span, upstream_status=response.status_code)  # a stream: until its headers
        if body.stream:
            return await _relay_stream(cache, metrics, query, identity, body, response, cache_headers, started,
                                       on_answer)
        metrics.upstream_latency.observe(time.perf_counter() - started)
    except chat.ChatError as exc:
        metrics.chat.labels(f"error_{exc.status}").inc()
        return chat_error(exc)
    return await _relay(cache, metrics, query, identity, body, response, cache_headers, on_answer)


def _near_miss(components: Components, result) -> Callable[[str | None], object] | None:
    """Hands a miss's upstream answer to the shadow checker (a near-miss is compared with its nearest
    candidate's answer, in the background)."""
    shadow = components.shadow
    return None if shadow is None else (lambda answer: shadow.after_miss(result, answer))


def chat_error(exc: chat.ChatError) -> JSONResponse:
    """A request the proxy cannot serve, in OpenAI's shape: 422 (a request we cannot read) as 400;
    503 (no upstream configured) is not worth a retry; 502/504 (upstream unreachable, timed out) are."""
    if exc.status == 422:
        return openai_error(400, exc.reason, param=exc.param)
    if exc.status == 503:
        return openai_error(503, exc.reason, code="no_upstream", retry=False)
    return openai_error(exc.status, exc.reason, code="upstream_unavailable")


def bypass_event(components: Components, body: ChatCompletionRequest, identity: dict, reason: str) -> CacheEvent:
    """Count and publish the decision not to use the cache (one event per request, as for a lookup),
    attributed to the unit's arm like any other request of the experiment."""
    experiment = components.registry.get(identity["experiment_id"])
    assignment = assign(experiment, identity["unit_id"])
    event = CacheEvent(instance_id=components.instance_id, namespace=identity["namespace"],
                       experiment_id=experiment.experiment_id, arm=assignment.arm, unit_id=identity["unit_id"],
                       assignment_prob=assignment.probability, partition_mode=experiment.partition_mode,
                       config_version=experiment.version, variant=assignment.variant, decision="bypass",
                       bypass_reason=reason, index_kind="none")
    components.emit(event)
    return event


async def _relay(cache: SemanticCache, metrics: ServiceMetrics, query: str | None, identity: dict,
                 body: ChatCompletionRequest, response: httpx.Response, cache_headers: dict,
                 on_answer: Callable[[str | None], object] | None = None):
    """Return the upstream answer; cache it when it is a complete, successful one."""
    headers = {**cache_headers, "x-scache-hit": "0"}
    try:
        completion = response.json()
    except ValueError:
        metrics.chat.labels("upstream_invalid").inc()
        return openai_error(502, f"upstream answered {response.status_code} with a body that is not JSON",
                            code="upstream_invalid", headers=headers)
    if response.status_code != 200:
        metrics.chat.labels("upstream_error").inc()
        return JSONResponse(status_code=response.status_code, content=completion, headers=headers)
    if not isinstance(completion, dict):
        metrics.chat.labels("upstream_invalid").inc()
        return openai_error(502, "upstream answered 200 with JSON that is not an object",
                            code="upstream_invalid", headers=headers)
    answer = chat.answer_of(completion)
    stored = await _store_reply(cache, query, identity, answer, str(completion.get("model") or body.model or ""))
    if on_answer is not None:
        on_answer(answer)
    metrics.chat.labels("forwarded").inc()
    if body.stream:  # an upstream that ignored stream=true: the client still gets a stream
        return StreamingResponse(chat.chunks_of_completion(completion, body), media_type="text/event-stream",
                                 headers={**headers, **SSE_HEADERS, "x-scache-store": stored})
    return JSONResponse(completion, headers={**headers, "x-scache-store": stored})


async def _store_reply(cache: SemanticCache, query: str | None, identity: dict, answer: str | None, model: str) -> str:
    """Offer a complete upstream answer to the cache; returns the outcome (a store reason,
    "not_cacheable", "invalid", or "bypass" when the request bypassed the cache: ``query`` None)."""
    if query is None:
        return "bypass"
    if identity.get("no_store"):
        return identity["no_store"]  # "no_store" (asked so) or "not_allowed" (no write right)
    if answer is None:
        return "not_cacheable"
    try:
        return await run_in_threadpool(chat.store_answer, cache, query, answer, identity, model)
    except InvalidRequest as exc:  # e.g. longer than max_answer_chars: serve, do not cache
        log.info("upstream answer not cached", extra={"reason": str(exc)})
        return "invalid"


async def _relay_stream(cache: SemanticCache, metrics: ServiceMetrics, query: str | None, identity: dict,
                        body: ChatCompletionRequest, response: httpx.Response, cache_headers: dict, started: float,
                        on_answer: Callable[[str | None], object] | None = None):
    """Relay a streamed upstream answer; cache it once the stream finished with "stop".

    An error status (or a body that is not an event stream) is read whole and answered
    like the non-streaming path. The store outcome cannot be a header (headers leave
    before the answer is known): it is logged and counted."""
    content_type = response.headers.get("content-type", "")
    if response.status_code != 200 or not content_type.startswith("text/event-stream"):
        try:
            await response.aread()
        except httpx.HTTPError as exc:
            metrics.chat.labels("upstream_invalid").inc()
            return openai_error(502, f"upstream answer broke off: {type(exc).__name__}", code="upstream_invalid",
                                headers={**cache_headers, "x-scache-hit": "0"})
        finally:
            await response.aclose()
        metrics.upstream_latency.observe(time.perf_counter() - started)
        return await _relay(cache, metrics, query, identity, body, response, cache_headers, on_answer)

    async def finished(reply: chat.StreamedReply) -> None:
        metrics.upstream_latency.observe(time.perf_counter() - started)
        if reply.error is not None:
            metrics.chat.labels("stream_incomplete").inc()
            log.info("upstream stream not cached", extra={"request_id": cache_headers["x-scache-request-id"],
                                                          "reason": reply.error})
            return
        stored = await _store_reply(cache, query, identity, reply.answer, reply.model or body.model or "")
        if on_answer is not None:
            on_answer(reply.answer)
        metrics.chat.labels("forwarded").inc()
        log.info("upstream stream relayed", extra={"request_id": cache_headers["x-scache-request-id"],
                                                   "chunks": reply.chunks, "stored": stored,
                                                   "finish_reason": reply.finish_reason})

    return StreamingResponse(chat.relay_stream(response, finished), media_type="text/event-stream",
                             headers={**cache_headers, "x-scache-hit": "0", **SSE_HEADERS})
