"""FastAPI app factory: lookup, store, feedback, health, metrics, experiments."""
from __future__ import annotations

import logging
import time
from collections.abc import Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from cache_core.cache import InvalidRequest, SemanticCache
from cache_core.embedder import BatchingEncoder, Embedder, load_embedder
from cache_core.events import CacheEvent, FeedbackEvent
from cache_core.registry import ExperimentRegistry, UnknownExperiment
from cache_core.service.metrics import ServiceMetrics
from cache_core.service.schemas import (FeedbackRequest, LookupRequest, LookupResponse,
                                        StoreRequest, StoreResponse)
from cache_core.settings import Settings

log = logging.getLogger(__name__)


def create_app(settings: Settings, publisher, embedder: Embedder | None = None, *,
               registry: ExperimentRegistry | None = None, clock: Callable[[], float] = time.time,
               instance_id: str = "", shutdown_hooks: list[Callable[[], None]] | None = None,
               ) -> FastAPI:
    """Build the service around ``publisher`` (``publish_event``, ``publish_feedback``,
    ``stats``). The model is loaded here unless ``embedder`` is given; concurrent
    requests share it through one micro-batching encoder thread. ``shutdown_hooks``
    run in order when the server shuts down (uvicorn re-raises SIGTERM after it
    exits, so code after ``uvicorn.run`` is not a safe place to flush)."""
    own_encoder = not isinstance(embedder, BatchingEncoder)
    encoder = BatchingEncoder(embedder or load_embedder(settings.cache)) if own_encoder else embedder
    registry = registry or ExperimentRegistry.from_file(settings.experiments_file)
    metrics_holder: list[ServiceMetrics] = []

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
        emit_query_text=settings.cache.emit_query_text,
    )
    metrics = ServiceMetrics(cache, publisher.stats)
    metrics_holder.append(metrics)

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        yield
        for hook in shutdown_hooks or []:
            try:
                hook()
            except Exception:  # one failing hook must not skip the flush after it
                log.exception("shutdown hook failed")
        if own_encoder:
            encoder.close()

    app = FastAPI(title="scache", version="0.1.0", lifespan=lifespan)
    app.state.cache, app.state.registry, app.state.encoder = cache, registry, encoder
    app.state.metrics, app.state.publisher = metrics, publisher
    _add_error_handlers(app)
    _add_routes(app, cache, registry, metrics, publisher)
    return app


def _add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(InvalidRequest)
    async def invalid(_request: Request, exc: InvalidRequest):
        return JSONResponse(status_code=422, content={"detail": str(exc)})

    @app.exception_handler(UnknownExperiment)
    async def unknown(_request: Request, exc: UnknownExperiment):
        return JSONResponse(status_code=404, content={"detail": str(exc)})


def _add_routes(app: FastAPI, cache: SemanticCache, registry: ExperimentRegistry,
                metrics: ServiceMetrics, publisher) -> None:
    # Plain `def` handlers: FastAPI runs them in its thread pool, so concurrent
    # requests block on the shared encoder together and get batched.

    @app.post("/v1/lookup", response_model=LookupResponse)
    def lookup(body: LookupRequest) -> LookupResponse:
        result = cache.lookup(body.query, unit_id=body.unit_id, experiment_id=body.experiment_id,
                              namespace=body.namespace, scope=body.scope)
        return LookupResponse(
            request_id=result.request_id, decision=result.decision, hit=result.hit,
            answer=result.answer, similarity=result.similarity, threshold=result.threshold,
            experiment_id=result.experiment_id, arm=result.arm,
            config_version=result.config_version, intent_cluster=result.intent_cluster,
            entry_id=result.entry_id, entry_age_s=result.event.entry_age_s,
            provenance=result.provenance, latency_ms=result.event.latency_ms,
        )

    @app.post("/v1/store", response_model=StoreResponse)
    def store(body: StoreRequest) -> StoreResponse:
        result = cache.store(body.query, body.answer, unit_id=body.unit_id,
                             experiment_id=body.experiment_id, namespace=body.namespace,
                             scope=body.scope, ttl_s=body.ttl_s,
                             provenance_source=body.provenance.source,
                             provenance_version=body.provenance.version)
        metrics.stores.labels(result.experiment_id, result.arm, result.reason).inc()
        return StoreResponse(**{k: getattr(result, k) for k in StoreResponse.model_fields})

    @app.post("/v1/feedback", status_code=202)
    def feedback(body: FeedbackRequest) -> dict:
        event = FeedbackEvent(request_id=body.request_id, verdict=body.verdict, source=body.source)
        try:
            publisher.publish_feedback(event)
        except Exception:  # e.g. publisher closed during shutdown
            log.exception("publish_feedback failed", extra={"request_id": body.request_id})
            return JSONResponse(status_code=503, content={"detail": "feedback could not be queued"})
        metrics.feedback.labels(body.verdict).inc()
        return {"accepted": True, "request_id": body.request_id}

    @app.get("/healthz")
    def healthz() -> dict:
        return {"status": "ok", "dim": cache.embedder.dim,
                "experiments": {e.experiment_id: e.version for e in registry.all()},
                "publisher": publisher.stats()}

    @app.get("/metrics")
    def prometheus() -> PlainTextResponse:
        return PlainTextResponse(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/experiments")
    def experiments() -> dict:
        return {"experiments": [e.model_dump(mode="json") for e in registry.all()]}
