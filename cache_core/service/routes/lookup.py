"""``POST /v1/lookup``: is there a cached answer for this query, for this unit's arm?"""
from __future__ import annotations

import orjson
from fastapi import APIRouter, Response

from cache_core.records import LookupResult
from cache_core.service.auth import AccessDep
from cache_core.service.schemas import LookupRequest, LookupResponse

router = APIRouter()

_FIELDS = tuple(LookupResponse.model_fields)


def response_body(result: LookupResult) -> bytes:
    """``result`` as the JSON of ``LookupResponse``, written by orjson straight from the result's fields.
    The route returns it as a ready Response, so FastAPI neither validates the fields into the model
    again nor serialises them (``response_model`` stays for the OpenAPI schema): on the hottest route
    that was a fifth of FastAPI's own time per request (bench/front_throughput.py)."""
    fields = {name: getattr(result, name) for name in _FIELDS}
    if result.provenance is not None:  # the model's shape, defaults included
        fields["provenance"] = {"source": result.provenance.get("source", ""),
                                "version": result.provenance.get("version", "")}
    return orjson.dumps(fields, option=orjson.OPT_SERIALIZE_NUMPY)  # similarities may be numpy scalars


@router.post("/v1/lookup", response_model=LookupResponse)
async def lookup(body: LookupRequest, access: AccessDep) -> Response:
    """Needs the read right on the namespace (a request naming none uses the key's). Async: it awaits
    the shared micro-batching encoder's future (concurrent requests still get batched) without a
    thread-pool hop."""
    caller, components = access.caller, access.components
    namespace = caller.namespace(body.namespace if "namespace" in body.model_fields_set else None)
    caller.require("read", namespace)
    result = await components.cache.lookup_async(body.query, unit_id=body.unit_id, experiment_id=body.experiment_id,
                                                 namespace=namespace, scope=body.scope)
    shadow = components.shadow
    if shadow is not None:  # never waits: a sampled hit or near-miss is queued for a background check
        if result.hit:
            shadow.after_hit(result, body.query)
        else:
            shadow.after_lookup_miss(result, body.query)
    # x-scache-request-id: the decision's id, the access log's decision_id
    return Response(response_body(result), media_type="application/json",
                    headers={"x-scache-request-id": result.request_id})
