"""``POST /v1/lookup``: is there a cached answer for this query, for this unit's arm?

The route's work is ``answer`` (the caller's right, the lookup, the shadow check, the body): FastAPI
runs it through this route, and ``cache_core.service.fast_lookup`` runs the same function for a
well-formed request without FastAPI's routing and dependency solving."""
from __future__ import annotations

import orjson
from fastapi import APIRouter, Response

from cache_core.records import LookupResult
from cache_core.service.auth import AccessDep, Caller
from cache_core.service.schemas import LookupRequest, LookupResponse
from cache_core.service.wiring import Components

router = APIRouter()

PATH = "/v1/lookup"
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


async def answer(components: Components, caller: Caller, body: LookupRequest) -> tuple[bytes, str]:
    """The lookup's JSON body and its decision id (``x-scache-request-id``). Raises ``Refused`` (403)
    without the read right, ``InvalidRequest`` / ``UnknownExperiment`` as ``SemanticCache.lookup`` does."""
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
    return response_body(result), result.request_id


@router.post(PATH, response_model=LookupResponse)
async def lookup(body: LookupRequest, access: AccessDep) -> Response:
    """Needs the read right on the namespace (a request naming none uses the key's). Async: it awaits
    the shared micro-batching encoder's future (concurrent requests still get batched) without a
    thread-pool hop."""
    content, decision_id = await answer(access.components, access.caller, body)
    # x-scache-request-id: the decision's id, the access log's decision_id
    return Response(content, media_type="application/json", headers={"x-scache-request-id": decision_id})
