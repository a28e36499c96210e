"""``GET /v1/models``: the upstream's model list (with the caller's key), else the configured model."""
from __future__ import annotations

import logging

import httpx
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from cache_core.service import chat
from cache_core.service.auth import CallerDep
from cache_core.service.deps import ComponentsDep

log = logging.getLogger(__name__)
router = APIRouter()


@router.get("/v1/models")
async def list_models(request: Request, components: ComponentsDep, caller: CallerDep):
    """Any valid key (or open access)."""
    service = components.settings.service
    if service.upstream_url:
        passed = chat.upstream_headers(service, request.headers, caller.consumed_authorization)
        try:
            response = await components.upstream.get(chat.upstream_base(service.upstream_url) + "/models",
                                               headers=passed, timeout=service.upstream_timeout_s)
            listing = response.json()
            if response.status_code == 200 and isinstance(listing, dict) and isinstance(listing.get("data"), list):
                return listing
            if response.status_code in (401, 403):  # the caller's key is the upstream's to judge
                return JSONResponse(status_code=response.status_code, content=listing)
        except (httpx.HTTPError, ValueError) as exc:
            log.info("upstream model list unavailable", extra={"error": type(exc).__name__})
    return {"object": "list", "data": [{"id": service.upstream_model, "object": "model", "created": 0,
                                        "owned_by": "scache"}]}
