"""``POST /v1/store`` and ``POST /v1/store/batch``: offer answers to the cache."""
from __future__ import annotations

from fastapi import APIRouter

from cache_core.records import StoreItem
from cache_core.service.auth import Caller, CallerDep
from cache_core.service.deps import CacheDep, MetricsDep
from cache_core.service.schemas import StoreBatchRequest, StoreBatchResponse, StoreRequest, StoreResponse

router = APIRouter()


@router.post("/v1/store", response_model=StoreResponse)
def store(body: StoreRequest, cache: CacheDep, metrics: MetricsDep, caller: CallerDep) -> StoreResponse:
    """Needs the write right on the namespace."""
    result = cache.store(body.query, body.answer, unit_id=body.unit_id, experiment_id=body.experiment_id,
                         namespace=writable(caller, body), scope=body.scope, ttl_s=body.ttl_s,
                         provenance_source=body.provenance.source, provenance_version=body.provenance.version)
    metrics.stores.labels(result.experiment_id, result.arm, result.reason).inc()
    return store_response(result)


@router.post("/v1/store/batch", response_model=StoreBatchResponse)
def store_batch(body: StoreBatchRequest, cache: CacheDep, metrics: MetricsDep, caller: CallerDep) -> StoreBatchResponse:
    """Needs the write right on every item's namespace (else nothing is stored)."""
    namespaces = [writable(caller, item) for item in body.items]
    results = cache.store_many([StoreItem(
        item.query, item.answer, item.unit_id, item.experiment_id, namespace, item.scope, item.ttl_s,
        item.provenance.source, item.provenance.version) for item, namespace in zip(body.items, namespaces)],
        every_arm=body.every_arm)
    for result in (r for per_item in results for r in per_item):
        metrics.stores.labels(result.experiment_id, result.arm, result.reason).inc()
    return StoreBatchResponse(results=[[store_response(r) for r in per_item] for per_item in results],
                              stored=sum(r.stored for per_item in results for r in per_item))


def writable(caller: Caller, item: StoreRequest) -> str:
    namespace = caller.namespace(item.namespace if "namespace" in item.model_fields_set else None)
    caller.require("write", namespace)
    return namespace


def store_response(result) -> StoreResponse:
    return StoreResponse(**{k: getattr(result, k) for k in StoreResponse.model_fields})
