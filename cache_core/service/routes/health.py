"""Probes and read-only views: ``/readyz``, ``/healthz``, ``/metrics``, ``GET /v1/experiments``."""
from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from cache_core.service.deps import ComponentsDep, MetricsDep, RegistryDep

router = APIRouter()


@router.get("/readyz")
def readyz(components: ComponentsDep) -> JSONResponse:
    """Ready for traffic once every topic follower (the control listener, the entries follower, the
    feedback follower) has replayed its topic: before that, this instance would decide with a stale
    config, an empty cache, or entries that verdicts posted while it was down took out of service.
    503 with what is missing."""
    waiting = components.ready()
    if waiting:
        return JSONResponse(status_code=503, content={
            "ready": False, "detail": f"still replaying: {', '.join(waiting)}"})
    return JSONResponse(content={"ready": True})


@router.get("/healthz")
def healthz(components: ComponentsDep) -> dict:
    cache, persistence = components.cache, components.persistence
    follower, feedback = components.entry_follower, components.feedback_follower
    return {"status": "ok", "dim": cache.embedder.dim,
            "experiments": {e.experiment_id: e.version for e in components.registry.all()},
            "publisher": components.publisher.stats(),
            "entries": sum(len(p) for p in cache.partitions()),
            "persistence": persistence.metrics() if persistence else None,
            "replication": follower.stats() if follower else None,
            "expiry": components.expiry.stats() if components.expiry else None,
            "feedback": {"remembered_hits": len(cache.served),
                         "follower": feedback.stats() if feedback else None}}


@router.get("/metrics")
def prometheus(metrics: MetricsDep) -> PlainTextResponse:
    return PlainTextResponse(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)


@router.get("/v1/experiments")
def experiments(registry: RegistryDep) -> dict:
    return {"experiments": [e.model_dump(mode="json") for e in registry.all()]}
