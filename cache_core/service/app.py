"""FastAPI app factory: lookup, store, feedback, chat completions, admin, health, metrics."""
from __future__ import annotations

import hmac
import json
import logging
import time
from collections.abc import Callable
from contextlib import asynccontextmanager
from typing import Annotated

import httpx
from fastapi import FastAPI, Path, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from pydantic import ValidationError
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from cache_core.ann_check import AnnChecker
from cache_core.cache import SemanticCache
from cache_core.types import EntryMatch, InvalidRequest, StoreItem
from cache_core.control import ControlLost, ControlUnconfirmed
from cache_core.embedder import BatchingEncoder, Embedder, load_embedder
from cache_core.event_worker import EventWorker
from cache_core.expiry import DEFAULT_INTERVAL_S, ExpirySweeper
from cache_core.events import CacheEvent, ControlMessage, FeedbackEvent
from cache_core.experiments import parse_experiment_json
from cache_core.persistence import Persistence
from cache_core.registry import ExperimentRegistry, UnknownExperiment
from cache_core.replication import EntryFollower, share
from cache_core.service import chat
from cache_core.service.metrics import ServiceMetrics
from cache_core.service.schemas import (ChatCompletionRequest, FeedbackRequest, LookupRequest,
                                        LookupResponse, PurgeRequest, StoreBatchRequest, StoreBatchResponse,
                                        StoreRequest, StoreResponse)
from cache_core.settings import Settings

log = logging.getLogger(__name__)


def create_app(settings: Settings, publisher, embedder: Embedder | None = None, *,
               registry: ExperimentRegistry | None = None, clock: Callable[[], float] = time.time,
               instance_id: str = "", shutdown_hooks: list[Callable[[], None]] | None = None,
               persistence: Persistence | None = None,
               control_publisher: Callable[[ControlMessage], None] | None = None,
               event_executor=None, replicate: bool = False,
               expiry_sweep_s: float | None = DEFAULT_INTERVAL_S) -> FastAPI:
    """Build the service around ``publisher`` (``publish_event``, ``publish_feedback``,
    ``stats``). The model is loaded here unless ``embedder`` is given; concurrent
    requests share it through one micro-batching encoder thread. ``shutdown_hooks``
    run in order when the server shuts down (uvicorn re-raises SIGTERM after it
    exits, so code after ``uvicorn.run`` is not a safe place to flush).

    ``persistence`` (optional) restores the cache before the app is returned, logs
    every change, snapshots in the background and once more at shutdown.
    ``control_publisher`` sends admin config changes to the control topic
    (default: ``cache_core.control.publish_control`` with ``settings.kafka``).

    Events, lookup metrics and sampled ANN checks are finished after the answer by
    ``event_executor`` (default: an ``EventWorker`` thread owned by the app, drained
    at shutdown before the hooks run, so a publisher closed by a hook gets them all).
    With its own worker the app batches the ANN checks (``AnnChecker``, sized by
    ``settings.cache.ann_check_*``; batch size 1: single checks).

    ``replicate``: stored entries and clears go to the entries topic through ``publisher``
    (``publish_entry``), and ``app.state.entry_follower`` (``cache_core.replication``, not
    started: the caller starts and stops it) applies the other replicas' changes.

    ``expiry_sweep_s``: expired entries are removed this often in the background
    (``cache_core.expiry``; None: only lazily, as lookups and stores meet them)."""
    own_encoder = not isinstance(embedder, BatchingEncoder)
    encoder = BatchingEncoder(embedder or load_embedder(settings.cache)) if own_encoder else embedder
    registry = registry or ExperimentRegistry.from_file(settings.experiments_file)
    metrics_holder: list[ServiceMetrics] = []
    own_worker = event_executor is None
    event_executor = EventWorker() if own_worker else event_executor
    # An event waits for its batch, so batch only behind the app's own background worker.
    ann_checker = AnnChecker.from_settings(settings.cache) \
        if own_worker and settings.cache.ann_check_batch_size > 1 else None

    def sink(event: CacheEvent) -> None:
        metrics_holder[0].observe_lookup(event)
        try:
            publisher.publish_event(event)
        except Exception:  # the answer must not fail because telemetry did; it is counted
            metrics_holder[0].publish_errors.inc()
            log.exception("publish_event failed", extra={"request_id": event.request_id})

    cache = SemanticCache(
        encoder, registry, clock=clock, event_sink=sink, instance_id=instance_id,
        default_ttl_s=settings.cache.default_ttl_s, max_query_chars=settings.cache.max_query_chars,
        max_answer_chars=settings.cache.max_answer_chars,
        emit_query_text=settings.cache.emit_query_text, event_executor=event_executor,
        ann_checker=ann_checker, feedback_memory=settings.cache.feedback_memory,
    )
    if persistence is not None:
        persistence.open(cache)
        persistence.start()
    sweeper = ExpirySweeper(cache, expiry_sweep_s).start() if expiry_sweep_s else None
    follower = _replication(settings, cache, publisher, instance_id, persistence) if replicate else None
    metrics = ServiceMetrics(cache, publisher.stats, persistence.metrics if persistence else None,
                             follower.stats if follower else None,
                             feedback_stats=lambda: app.state.feedback_follower.stats()
                             if app.state.feedback_follower else None)
    metrics_holder.append(metrics)
    upstream = httpx.Client()
    if control_publisher is None:
        from cache_core.control import publish_confirmed

        def control_publisher(message: ControlMessage) -> None:
            publish_confirmed(settings.kafka, message, base=registry.base())

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        yield
        if sweeper is not None:
            sweeper.stop()
        if ann_checker is not None:
            ann_checker.close()  # pending checks run now, so the events waiting on them go
        if own_worker:
            event_executor.close()  # every decided lookup's event reaches the publisher
        for hook in shutdown_hooks or []:
            try:
                hook()
            except Exception:  # one failing hook must not skip the flush after it
                log.exception("shutdown hook failed")
        if persistence is not None:
            persistence.close()  # final snapshot: the next start replays nothing
        upstream.close()
        if own_encoder:
            encoder.close()

    app = FastAPI(title="scache", version="0.1.0", lifespan=lifespan)
    app.state.cache, app.state.registry, app.state.encoder = cache, registry, encoder
    app.state.metrics, app.state.publisher = metrics, publisher
    app.state.persistence, app.state.settings = persistence, settings
    app.state.entry_follower = follower
    app.state.expiry = sweeper
    app.state.feedback_follower = None  # set by the caller that starts one (cache_core.feedback)
    # Topic followers /readyz waits for, by name (the caller adds the control listener it starts).
    app.state.followers = {"entries": follower} if follower else {}
    _add_error_handlers(app)
    _add_routes(app, cache, registry, metrics, publisher)
    _add_chat_route(app, cache, metrics, settings, upstream)
    _add_admin_routes(app, cache, registry, metrics, settings, control_publisher)
    return app


def _replication(settings: Settings, cache: SemanticCache, publisher, instance_id: str,
                 persistence: Persistence | None) -> EntryFollower:
    """Attach the entry feed to ``cache`` (and its intent clusters) and build (not start) its follower. Its offsets
    live beside the write-ahead log: without one, every start replays the topic."""
    model = settings.cache.model
    share(cache, publisher, instance_id, model)
    return EntryFollower(settings.kafka, cache, instance_id, model,
                         state_dir=persistence.directory if persistence is not None else None,
                         cluster_refresh_s=settings.cache.cluster_refresh_s)


def _errors_detail(errors: list[dict]) -> list[dict]:
    """Validation errors as a JSON-safe ``detail``: an echoed ``input`` (or ``ctx``) that cannot be
    rendered (NaN or Infinity, a lone surrogate, the raw bytes of a body that is not JSON, an
    exception object) is given as its repr (str), so the 422 never turns into a 500 while written."""
    def safe(value, show=repr):
        try:
            json.dumps(value, ensure_ascii=False, allow_nan=False).encode()
            return value
        except (TypeError, ValueError):  # UnicodeEncodeError is a ValueError
            return show(value)[:200]

    detail = []
    for error in errors:
        error = {key: value for key, value in error.items() if key != "url"}
        if "input" in error:
            error["input"] = safe(error["input"])
        if isinstance(error.get("ctx"), dict):
            error["ctx"] = {key: safe(value, str) for key, value in error["ctx"].items()}
        detail.append(error)
    return detail


def _add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def unprocessable(_request: Request, exc: RequestValidationError):
        return JSONResponse(status_code=422, content={"detail": _errors_detail(exc.errors())})

    @app.exception_handler(InvalidRequest)
    async def invalid(_request: Request, exc: InvalidRequest):
        return JSONResponse(status_code=422, content={"detail": str(exc)})

    @app.exception_handler(UnknownExperiment)
    async def unknown(_request: Request, exc: UnknownExperiment):
        return JSONResponse(status_code=404, content={"detail": str(exc)})


def _add_routes(app: FastAPI, cache: SemanticCache, registry: ExperimentRegistry,
                metrics: ServiceMetrics, publisher) -> None:
    # Lookup is async: it awaits the shared micro-batching encoder's future (concurrent
    # requests still get batched) without a thread-pool hop. The other handlers are
    # plain `def`, run in FastAPI's thread pool.

    @app.post("/v1/lookup", response_model=LookupResponse)
    async def lookup(body: LookupRequest) -> LookupResponse:
        result = await cache.lookup_async(body.query, unit_id=body.unit_id,
                                          experiment_id=body.experiment_id,
                                          namespace=body.namespace, scope=body.scope)
        return LookupResponse(
            request_id=result.request_id, decision=result.decision, hit=result.hit,
            answer=result.answer, similarity=result.similarity, threshold=result.threshold,
            experiment_id=result.experiment_id, arm=result.arm,
            config_version=result.config_version, intent_cluster=result.intent_cluster,
            entry_id=result.entry_id, entry_age_s=result.entry_age_s,
            provenance=result.provenance, latency_ms=result.latency_ms,
            variant=result.variant, guard=result.guard, score=result.score,
            score_margin=result.score_margin,
        )

    @app.post("/v1/store", response_model=StoreResponse)
    def store(body: StoreRequest) -> StoreResponse:
        result = cache.store(body.query, body.answer, unit_id=body.unit_id,
                             experiment_id=body.experiment_id, namespace=body.namespace,
                             scope=body.scope, ttl_s=body.ttl_s,
                             provenance_source=body.provenance.source,
                             provenance_version=body.provenance.version)
        metrics.stores.labels(result.experiment_id, result.arm, result.reason).inc()
        return _store_response(result)

    @app.post("/v1/store/batch", response_model=StoreBatchResponse)
    def store_batch(body: StoreBatchRequest) -> StoreBatchResponse:
        results = cache.store_many([StoreItem(
            item.query, item.answer, item.unit_id, item.experiment_id, item.namespace, item.scope, item.ttl_s,
            item.provenance.source, item.provenance.version) for item in body.items], every_arm=body.every_arm)
        for result in (r for per_item in results for r in per_item):
            metrics.stores.labels(result.experiment_id, result.arm, result.reason).inc()
        return StoreBatchResponse(
            results=[[_store_response(r) for r in per_item] for per_item in results],
            stored=sum(r.stored for per_item in results for r in per_item))

    @app.post("/v1/feedback", status_code=202)
    def feedback(body: FeedbackRequest) -> dict:
        event = FeedbackEvent(request_id=body.request_id, verdict=body.verdict, source=body.source)
        try:
            publisher.publish_feedback(event)
        except Exception:  # e.g. publisher closed during shutdown
            log.exception("publish_feedback failed", extra={"request_id": body.request_id})
            return JSONResponse(status_code=503, content={"detail": "feedback could not be queued"})
        metrics.feedback.labels(body.verdict).inc()
        # A hit served here is settled now; the others' hits through their feedback followers.
        outcome = cache.apply_feedback(body.request_id, body.verdict)
        return {"accepted": True, "request_id": body.request_id, "outcome": outcome}

    @app.get("/readyz")
    def readyz() -> JSONResponse:
        """Ready for traffic once every topic follower in ``app.state.followers`` (the control
        listener, the entries follower, the feedback follower) has replayed its topic: before that,
        this instance would decide with a stale config, an empty cache, or entries that verdicts
        posted while it was down took out of service. 503 with what is missing."""
        waiting = sorted(name for name, follower in app.state.followers.items()
                         if not follower.stats()["caught_up"])
        if waiting:
            return JSONResponse(status_code=503, content={
                "ready": False, "detail": f"still replaying: {', '.join(waiting)}"})
        return JSONResponse(content={"ready": True})

    @app.get("/healthz")
    def healthz() -> dict:
        persistence = app.state.persistence
        return {"status": "ok", "dim": cache.embedder.dim,
                "experiments": {e.experiment_id: e.version for e in registry.all()},
                "publisher": publisher.stats(),
                "entries": sum(len(p) for p in cache.partitions()),
                "persistence": persistence.metrics() if persistence else None,
                "replication": app.state.entry_follower.stats() if app.state.entry_follower else None,
                "expiry": app.state.expiry.stats() if app.state.expiry else None,
                "feedback": {"remembered_hits": len(cache.served),
                             "follower": app.state.feedback_follower.stats()
                             if app.state.feedback_follower else None}}

    @app.get("/metrics")
    def prometheus() -> PlainTextResponse:
        return PlainTextResponse(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/experiments")
    def experiments() -> dict:
        return {"experiments": [e.model_dump(mode="json") for e in registry.all()]}


def _store_response(result) -> StoreResponse:
    return StoreResponse(**{k: getattr(result, k) for k in StoreResponse.model_fields})


# Proxies must not buffer or transform the event stream.
_SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}


def _add_chat_route(app: FastAPI, cache: SemanticCache, metrics: ServiceMetrics,
                    settings: Settings, upstream: httpx.Client) -> None:
    service = settings.service

    @app.post("/v1/chat/completions")
    def chat_completions(body: ChatCompletionRequest, request: Request):
        try:
            query = chat.cache_key(body)
            identity = chat.request_identity(body, request.headers)
            result = cache.lookup(query, unit_id=identity["unit_id"],
                                  experiment_id=identity["experiment_id"],
                                  namespace=identity["namespace"], scope=identity["scope"])
            cache_headers = {"x-scache-request-id": result.request_id,
                             "x-scache-decision": result.decision, "x-scache-arm": result.arm,
                             "x-scache-variant": result.variant}
            if result.hit:
                metrics.chat.labels("hit").inc()
                headers = {**cache_headers, "x-scache-hit": "1"}
                if body.stream:
                    return StreamingResponse(chat.cached_chunks(
                        body, result.answer, result.request_id, service.upstream_model),
                        media_type="text/event-stream", headers={**headers, **_SSE_HEADERS})
                return JSONResponse(chat.completion_from_cache(
                    body, result.answer, result.request_id, service.upstream_model), headers=headers)
            started = time.perf_counter()
            response = chat.forward(upstream, service, body, request.headers, stream=body.stream)
            if body.stream:
                return _relay_stream(cache, metrics, query, identity, body, response, cache_headers,
                                     started)
            metrics.upstream_latency.observe(time.perf_counter() - started)
        except chat.ChatError as exc:
            metrics.chat.labels(f"error_{exc.status}").inc()
            return JSONResponse(status_code=exc.status, content={"detail": exc.reason})
        return _relay(cache, metrics, query, identity, body, response, cache_headers)


def _relay(cache: SemanticCache, metrics: ServiceMetrics, query: str, identity: dict,
           body: ChatCompletionRequest, response: httpx.Response, cache_headers: dict):
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
    stored = _store_reply(cache, query, identity, chat.answer_of(completion),
                          str(completion.get("model") or body.model or ""))
    metrics.chat.labels("forwarded").inc()
    if body.stream:  # an upstream that ignored stream=true: the client still gets a stream
        return StreamingResponse(chat.chunks_of_completion(completion, body),
                                 media_type="text/event-stream",
                                 headers={**headers, **_SSE_HEADERS, "x-scache-store": stored})
    return JSONResponse(completion, headers={**headers, "x-scache-store": stored})


def _store_reply(cache: SemanticCache, query: str, identity: dict, answer: str | None,
                 model: str) -> str:
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
                  body: ChatCompletionRequest, response: httpx.Response, cache_headers: dict,
                  started: float):
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
        return _relay(cache, metrics, query, identity, body, response, cache_headers)

    def finished(reply: chat.StreamedReply) -> None:
        metrics.upstream_latency.observe(time.perf_counter() - started)
        if reply.error is not None:
            metrics.chat.labels("stream_incomplete").inc()
            log.info("upstream stream not cached", extra={"request_id": cache_headers["x-scache-request-id"],
                                                          "reason": reply.error})
            return
        stored = _store_reply(cache, query, identity, reply.answer, reply.model or body.model or "")
        metrics.chat.labels("forwarded").inc()
        log.info("upstream stream relayed", extra={"request_id": cache_headers["x-scache-request-id"],
                                                   "chunks": reply.chunks, "stored": stored,
                                                   "finish_reason": reply.finish_reason})

    return StreamingResponse(chat.relay_stream(response, finished), media_type="text/event-stream",
                             headers={**cache_headers, "x-scache-hit": "0", **_SSE_HEADERS})


# A namespace as stored (schemas.LookupRequest.namespace): up to 128 characters, "/" included
# (the ``path`` convertor takes "a/b", sent as a%2Fb; else such a namespace could not be cleared).
AdminNamespace = Annotated[str, Path(min_length=1, max_length=128)]


def _admin_check(settings: Settings, request: Request) -> JSONResponse | None:
    """None if the request carries the admin token, else the 401/403 answer."""
    token = settings.service.admin_token
    if token is None:
        return JSONResponse(status_code=403, content={
            "detail": "admin API disabled: no admin token configured (SCACHE_SERVICE__ADMIN_TOKEN)"})
    scheme, _, given = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not given:
        return JSONResponse(status_code=401, headers={"www-authenticate": "Bearer"},
                            content={"detail": "admin token required: Authorization: Bearer <token>"})
    if not hmac.compare_digest(given.strip().encode(), token.get_secret_value().encode()):
        return JSONResponse(status_code=403, content={"detail": "invalid admin token"})
    return None


def _add_admin_routes(app: FastAPI, cache: SemanticCache, registry: ExperimentRegistry,
                      metrics: ServiceMetrics, settings: Settings,
                      control_publisher: Callable[[ControlMessage], None]) -> None:

    @app.put("/v1/admin/experiments/{experiment_id}")
    async def put_experiment(experiment_id: str, request: Request):
        denied = _admin_check(settings, request)
        if denied is not None:
            return denied
        try:
            config = parse_experiment_json(await request.body())
        except ValidationError as exc:
            return JSONResponse(status_code=422, content={"detail": _errors_detail(exc.errors(include_url=False))})
        if config.experiment_id != experiment_id:
            return JSONResponse(status_code=422, content={
                "detail": f"body experiment_id {config.experiment_id!r} does not match the path"})
        try:
            current = registry.get(experiment_id).version
        except UnknownExperiment:
            current = 0
        if config.version <= current:
            return JSONResponse(status_code=409, content={
                "detail": f"version {config.version} is not higher than {current} in force"})
        actor = request.headers.get("x-scache-actor", "admin-api")
        message = ControlMessage(experiment=config, actor=actor,
                                 reason=request.headers.get("x-scache-reason", ""))
        try:
            # Publish first: a change other instances never hear of must not apply here alone.
            control_publisher(message)
        except ControlLost as exc:  # a concurrent push took this version: it applies nowhere
            log.warning("admin config push lost a race", extra={"experiment_id": experiment_id,
                                                                "version": config.version})
            return JSONResponse(status_code=409, content={"detail": f"{exc}; reload and try again"})
        except ControlUnconfirmed as exc:
            log.exception("control publish unconfirmed", extra={"experiment_id": experiment_id})
            return JSONResponse(status_code=503, content={
                "detail": f"{exc}; not applied here, GET /v1/experiments shows what is in force once "
                          "the topic is readable"})
        except Exception as exc:
            log.exception("control publish failed", extra={"experiment_id": experiment_id})
            return JSONResponse(status_code=503, content={
                "detail": f"control topic unavailable, config not applied: {type(exc).__name__}"})
        registry.apply(message)  # False when this instance's control listener installed it first
        in_force = registry.get(experiment_id).version
        metrics.admin.labels("put_experiment").inc()
        return {"applied": in_force >= config.version, "published": True, "experiment_id": experiment_id,
                "version": in_force}

    @app.delete("/v1/admin/namespaces/{namespace:path}")
    def delete_namespace(namespace: AdminNamespace, request: Request):
        denied = _admin_check(settings, request)
        if denied is not None:
            return denied
        removed = cache.clear_namespace(namespace)
        metrics.admin.labels("clear_namespace").inc()
        log.info("namespace cleared", extra={"namespace": namespace, "removed": removed})
        return {"namespace": namespace, "removed": removed}

    @app.post("/v1/admin/namespaces/{namespace:path}/purge")
    def purge_namespace(namespace: AdminNamespace, body: PurgeRequest, request: Request):
        """Remove the answers of a provenance source (a document that changed), optionally of one
        version, or of one question, from every store of the namespace, on every replica."""
        denied = _admin_check(settings, request)
        if denied is not None:
            return denied
        match = EntryMatch(body.provenance_source, body.provenance_version, body.query)
        removed = cache.purge(namespace, match)
        metrics.admin.labels("purge").inc()
        log.info("namespace purged", extra={"namespace": namespace, "removed": removed, **body.model_dump()})
        return {"namespace": namespace, "removed": removed}
