"""``POST /v1/lookup``: is there a cached answer for this query, for this unit's arm?"""
from __future__ import annotations

from fastapi import APIRouter, Response

from cache_core.service.auth import AccessDep
from cache_core.service.schemas import LookupRequest, LookupResponse

router = APIRouter()


@router.post("/v1/lookup", response_model=LookupResponse)
async def lookup(body: LookupRequest, access: AccessDep, response: Response) -> LookupResponse:
    """Needs the read right on the namespace (a request naming none uses the key's). Async: it awaits
    the shared micro-batching encoder's future (concurrent requests still get batched) without a
    thread-pool hop."""
    caller, components = access.caller, access.components
    namespace = caller.namespace(body.namespace if "namespace" in body.model_fields_set else None)
    caller.require("read", namespace)
    result = await components.cache.lookup_async(body.query, unit_id=body.unit_id, experiment_id=body.experiment_id,
                                                 namespace=namespace, scope=body.scope)
    response.headers["x-scache-request-id"] = result.request_id  # the access log's decision_id
    shadow = components.shadow
    if shadow is not None:  # never waits: a sampled hit or near-miss is queued for a background check
        if result.hit:
            shadow.after_hit(result, body.query)
        else:
            shadow.after_lookup_miss(result, body.query)
    return LookupResponse(**{name: getattr(result, name) for name in LookupResponse.model_fields})
